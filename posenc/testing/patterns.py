"""The pattern checks: any encoder placed in a pattern of layer kinds (:mod:`posenc.layers.pattern`)
without naming it, beside NoPE and beside itself with a sliding window.

Two patterns of a two-layer model, each built for the encoder under test:

- ``beside_nope``: ``(own, nope)``, the encoder's layer (full attention) then a NoPE layer
  (full attention), as SmolLM3 and iRoPE interleave them;
- ``beside_itself``: ``(global, local)``, the encoder with full attention, then the encoder with
  a sliding window of :data:`WINDOW` keys (Gemma 2's, RNoPE-SWA's local layers).

Where the encoder goes: an encoder that acts in attention is the kinds' encoder, and the model's
(``config.encoding``) is NoPE. An encoder with input terms (``embed``, ``embed_tokens``: learned,
sinusoidal, CAPE, conv) cannot be a kind's (:func:`posenc.models.lm.bind_encoding` refuses it:
its term is added once, at the input): it is then the model's encoder, and the kinds that
"hold" it name none, taking the model's (whose attention hooks are none). Its layers then
differ from NoPE's only by the window, but its input term, the kinds and the window still meet
in one model, which is what the check is about; it is therefore checked, never
:class:`~posenc.testing.NotApplicable`.

``patterns`` (:func:`check_patterns`), for each pattern, at ``settings.length`` tokens (more
than one tile of ``settings.block_size``; :data:`WINDOW` is not a multiple of it, so window
edges cut tiles, and the tiles wholly outside the window are skipped on ``blocked``), each row
at its own offset:

- every float32 path that accepts the model (``blocked``, ``xla``; one that refuses the encoder
  or an option is left out) gives the ``einsum`` model's logits (the same parameters);
- the window matters: the same parameters with the local kind's window ``full`` give other
  logits (a path that ignored the window would otherwise pass);
- for a ``cacheable`` encoder, greedy generation through the key/value cache
  (:func:`posenc.decoding.lm.greedy_generate`, unfilled slots NaN; the local layer's cache
  holds :data:`WINDOW` slots, :mod:`posenc.decoding.window`) gives, for every generated token,
  the logits of a full forward pass over the prompt and the tokens before it (teacher forcing
  on the generated sequence).

``pattern_trains`` (:func:`check_pattern_trains`): a few Adam steps on each pattern's model give
finite losses, and every encoder parameter of the pattern (the kinds' own and the model's) a
finite gradient at every step and a non-zero one at some step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc import encodings
from posenc.decoding import lm as decoding
from posenc.encodings.base import Encoding
from posenc.layers.pattern import LayerKind
from posenc.models.lm import Transformer
from posenc.testing._harness import (
    Settings,
    fail,
    jit,
    memo,
    model_config,
    resolve,
    tokens,
    train_losses,
)

# The sliding window of the local kind: less than the battery's 12 tokens and its tile of 5, and
# not a multiple of the tile.
WINDOW = 3
PATTERNS = ("beside_nope", "beside_itself")
# The paths compared with the einsum model (cudnn has its own check, the linear paths are
# another model that takes no window).
PATHS = ("blocked", "xla")
# Tokens generated after the prompt in the decoding comparison.
NEW_TOKENS = 5


def input_terms(enc: Encoding) -> bool:
    """Whether the encoder adds an input term, so that it is the model's encoder, not a kind's."""
    return bool({"embed", "embed_tokens"} & set(enc.hooks))


def pattern(enc: Encoding, which: str, window: str = f"sliding:{WINDOW}"):
    """``(model's encoder, layer kinds)`` of pattern ``which`` (module docstring); ``window`` is
    the local kind's window (``"full"`` for the comparison that shows the window matters)."""
    nope = encodings.get("nope")
    model_enc, own = (enc, None) if input_terms(enc) else (nope, enc)
    base = model_config(Settings())  # the options' defaults: the model's own are not set

    def kind(name, encoding, window="full"):
        options = base.attention_options(window=window, prefix=f"layers.kinds.{name}")
        return LayerKind(name, encoding, options)

    if which == "beside_nope":
        return model_enc, (kind("own", own), kind("nope", nope))
    if which == "beside_itself":
        return model_enc, (kind("global", own), kind("local", own, window))
    raise ValueError(f"pattern must be one of {list(PATTERNS)}, got {which!r}")


def build_pattern(
    enc: Encoding,
    settings: Settings,
    which: str,
    implementation: str = "einsum",
    window: str = f"sliding:{WINDOW}",
) -> Transformer:
    """The battery's tiny model, two layers, of pattern ``which``; the same ``settings.seed``
    gives the same parameters whatever the path and the window."""
    model_enc, kinds = pattern(enc, which, window)
    config = model_config(settings, num_layers=2, attention_impl=implementation)
    return Transformer(config, model_enc, rngs=nnx.Rngs(settings.seed), layers=kinds)


def _positions(settings: Settings, length: int) -> jax.Array:
    """``[B, length]``: each row from its offset."""
    return jnp.asarray(settings.offsets, jnp.int32)[:, None] + jnp.arange(length, dtype=jnp.int32)


@memo
def _logits(enc: Encoding, settings: Settings, which: str, implementation: str, window: str):
    """``[B, T, V]`` logits of the pattern's model at ``settings.length`` tokens (float64 numpy),
    or None where the path refuses it."""
    try:
        model = build_pattern(enc, settings, which, implementation, window)
    except ValueError:
        if implementation == "einsum":
            raise
        return None
    reference = build_pattern(enc, settings, which, "einsum", window)
    graphdef, _ = nnx.split(model)
    _, state = nnx.split(reference)  # the einsum model's parameters, whatever the path
    run = jit(lambda state, tokens, pos: nnx.merge(graphdef, state)(tokens, pos))
    t = settings.length
    return np.asarray(run(state, tokens(settings, t, seed=3), _positions(settings, t)), np.float64)


def check_patterns(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """The encoder in each pattern: paths agree, the window matters, decoding equals a full
    pass (module docstring)."""
    settings = settings or Settings()
    enc = resolve(encoder)
    tol = dict(rtol=settings.tolerance * 10, atol=settings.tolerance * 10)
    for which in PATTERNS:
        where = f"pattern {which} ({'model' if input_terms(enc) else 'kind'} encoder)"
        window = f"sliding:{WINDOW}"
        reference = _logits(enc, settings, which, "einsum", window)
        if not np.isfinite(reference).all():
            raise fail(enc, "patterns", f"{where}: non-finite einsum logits")
        for path in PATHS:
            got = _logits(enc, settings, which, path, window)
            if got is None:
                continue
            if not np.allclose(got, reference, **tol):
                error = np.abs(got - reference).max()
                raise fail(
                    enc, "patterns", f"{where}: path {path!r} differs from einsum by {error:.3g}"
                )
        if which == "beside_itself":
            unwindowed = _logits(enc, settings, which, "einsum", "full")
            if np.abs(unwindowed - reference).max() < 1e-6:
                raise fail(
                    enc,
                    "patterns",
                    f"{where}: the local kind's window sliding:{WINDOW} changes nothing",
                )
        _check_decoding(enc, settings, which, where, tol)


def _check_decoding(enc: Encoding, settings: Settings, which: str, where: str, tol: dict):
    """Cached greedy generation's logits equal a full pass over the generated sequence."""
    model = build_pattern(enc, settings, which)
    try:
        for _, e in decoding.layer_encodings(model):
            e.check_cacheable()
    except ValueError:
        return  # greedy_generate refuses it (the decoding tests check the refusal)
    t, n = settings.length, NEW_TOKENS
    p = t + 1 - n  # the prompt; the full pass below runs over t = p + n - 1 tokens
    prompts = tokens(settings, p, seed=4)
    positions = _positions(settings, t + 1)
    graphdef, state = nnx.split(model)
    generate = jit(decoding._generate_impl, static_argnums=decoding._STATIC)
    new, logits = generate(graphdef, state, prompts, positions, n, jnp.nan, True, True)
    sequence = jnp.concatenate([prompts, new[:, :-1]], axis=1)  # [B, t]
    run = jit(lambda state, tokens, pos: nnx.merge(graphdef, state)(tokens, pos))
    full = np.asarray(run(state, sequence, positions[:, :t]))[:, p - 1 :]  # [B, n, V]
    logits = np.asarray(logits)
    if not np.isfinite(logits).all() or not np.allclose(logits, full, **tol):
        error = np.nanmax(np.abs(logits - full)) if np.isfinite(logits).any() else np.nan
        raise fail(
            enc,
            "patterns",
            f"{where}: cached decoding of {n} tokens after {p} differs from a full pass by "
            f"{error:.3g}",
        )
    if not np.array_equal(np.asarray(new), np.argmax(logits, -1)):
        raise fail(enc, "patterns", f"{where}: the generated tokens are not the logits' argmax")


def check_pattern_trains(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """A few Adam steps on each pattern's model: finite losses, and every encoder parameter of
    the pattern a finite gradient at every step and a non-zero one at some step."""
    settings = settings or Settings()
    enc = resolve(encoder)
    for which in PATTERNS:
        where = f"pattern {which}"
        model = build_pattern(enc, settings, which)
        losses, grads = train_losses(enc, settings, model=model)
        if not np.isfinite(losses).all():
            raise fail(enc, "pattern_trains", f"{where}: non-finite training loss {losses}")
        broken = {name: s for name, s in grads.items() if not np.isfinite(s).all()}
        if broken:
            raise fail(
                enc, "pattern_trains", f"{where}: non-finite encoder gradients (max |g|) {broken}"
            )
        still = sorted(name for name, s in grads.items() if not any(s))
        if still:
            raise fail(
                enc,
                "pattern_trains",
                f"{where}: encoder parameters {still} get a zero gradient at every one of "
                f"{len(losses)} steps",
            )
