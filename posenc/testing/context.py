"""The context-parallel check: evaluation with each window split over ``mesh.context`` devices
scores what one device scores.

:func:`check_context_parallel` builds the battery's tiny model on the ``blocked`` path (tiles of
:data:`BLOCK` tokens) and scores the same random token stream in windows of :data:`LENGTH`
tokens with :func:`posenc.kinds.stream.evaluate`, once on one device and once on a mesh whose
``context`` axis (4 devices, or 2 where there are only 2 or 3) splits every window, one or two
tiles per device: XLA's partitioner then gathers the keys and values each query tile needs, and
every hook (biases by distance, contextual logits, value terms, decays, input terms) must come
out as on one device. The losses must agree to ``settings.tolerance``, and the windows the
compiled scoring step receives on the context mesh must really be split: each device holds
``LENGTH / context`` tokens of every window, on ``context`` devices (equal losses alone would
also pass with the split switched off, every device scoring whole windows).

It needs several devices, which a process fixes when JAX starts: on a CPU, start Python with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``. With one device the check raises
:class:`~posenc.testing.NotApplicable` (a skip: posenc's slow step runs it over the registry on
8 virtual devices, ``tests/test_sharding.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import ml_collections
import numpy as np

from posenc.attention import core as attention
from posenc.devices import sharding
from posenc.encodings.base import Encoding
from posenc.testing._harness import NotApplicable, Settings, build, fail, label, resolve

# The window and the tile of the check: four tiles, one per context device (two per device on
# two devices), short enough for a learned table of the battery's 32 positions.
LENGTH = 32
BLOCK = 8


def refused_by_blocked(enc: Encoding, settings: Settings) -> str | None:
    """Why the check cannot apply to ``enc``: the ``blocked`` path refuses it (None: it runs)."""
    try:
        attention.check_implementation(enc.bind(settings.dims), "blocked")
    except ValueError as err:
        return f"the blocked path refuses it ({err})"
    return None


@contextlib.contextmanager
def _window_shardings() -> Iterator[list[tuple[tuple[int, ...], jax.sharding.Sharding]]]:
    """Records ``(shape, sharding)`` of the token windows each scoring step is compiled for: the
    sharding XLA gives the compiled step's input (``jax.debug.inspect_array_sharding``), i.e.
    where the windows really are, whatever chose it."""
    from posenc.kinds.stream import Scorer

    seen: list[tuple[tuple[int, ...], jax.sharding.Sharding]] = []
    original = Scorer._score_batch

    def recording(self, state, batch):
        shape = tuple(batch["inputs"].shape)
        jax.debug.inspect_array_sharding(
            batch["inputs"], callback=lambda s: seen.append((shape, s))
        )
        return original(self, state, batch)

    Scorer._score_batch = recording
    try:
        yield seen
    finally:
        Scorer._score_batch = original


def _split(shape: tuple[int, ...], where: jax.sharding.Sharding, context: int) -> bool:
    """Whether windows of ``shape`` ``[rows, LENGTH]`` lie split over ``context`` devices."""
    return len(where.device_set) >= context and where.shard_shape(shape)[1] == shape[1] // context


def check_context_parallel(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """Evaluation split over ``mesh.context`` equals one device's (module docstring)."""
    from posenc.kinds.stream import evaluate  # the evaluation stack, only when the check runs

    settings = settings or Settings()
    enc = resolve(encoder)
    reason = refused_by_blocked(enc, settings)
    if reason:  # as checks.inapplicable says (checks imports this module, not the reverse)
        raise NotApplicable(f"context_parallel does not apply to {label(enc)}: {reason}")
    devices = jax.devices()
    if len(devices) < 2:
        raise NotApplicable(
            "context_parallel needs 2 or more devices (on a CPU start Python with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=8)"
        )
    context = 4 if len(devices) >= 4 else 2
    model = build(enc, settings, attention_impl="blocked", attention_block_size=BLOCK)
    rng = np.random.default_rng(settings.seed + 5)
    stream = rng.integers(0, settings.vocab_size, 4 * LENGTH + 1).astype(np.int32)
    losses = []
    for size in (1, context):  # one device; every window over `context` devices
        fields = ml_collections.ConfigDict({"mesh": {"data": 1, "context": size}})
        mesh = sharding.make_mesh(fields, devices[:size])
        with _window_shardings() as seen:
            (result,) = evaluate(model, stream, [LENGTH], batch_tokens=2 * LENGTH, mesh=mesh)
        if "error" in result:
            raise fail(enc, "context_parallel", f"evaluation refused the window: {result['error']}")
        losses.append(result["loss"])
        whole = [(shape, str(where)) for shape, where in seen if not _split(shape, where, size)]
        if size > 1 and (not seen or whole):
            raise fail(
                enc,
                "context_parallel",
                f"windows of {LENGTH} tokens are not split over the {size} context devices: the "
                f"scoring step receives {whole or 'no window it compiled'}",
            )
    one, split = losses
    if not np.isclose(split, one, rtol=settings.tolerance, atol=settings.tolerance):
        raise fail(
            enc,
            "context_parallel",
            f"windows of {LENGTH} tokens split over {context} context devices score loss "
            f"{split:.8g}, one device {one:.8g}",
        )
