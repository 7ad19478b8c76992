"""Greedy generation from a decoder-only model with a key/value cache that serves every encoder.

:func:`greedy_generate` decodes ``num_new`` tokens after a batch of prompts by argmax, in one
compiled program: a prefill runs the model over the ``P`` prompt tokens in one pass (on the
model's own attention path) and keeps each layer's cache, then a ``lax.fori_loop`` adds one token
per step to a cache preallocated with ``P + num_new`` slots
(:func:`posenc.decoding.greedy.greedy_search` over the model's
:meth:`~posenc.models.lm.Transformer.decode`), so nothing recompiles per step. A layer with a
sliding, banded or chunked window shorter than the output (a pattern's local layers,
:mod:`posenc.layers.pattern`) keeps a cache of its window's size instead
(:mod:`posenc.decoding.window`): ``W`` slots, whatever the output's length.
:func:`greedy_generate_reference` is the definition it is tested against: the whole model run
again on the prompt and the tokens so far at every step, the last logits taken.

What the cache keeps per layer (:class:`posenc.layers.cache.LayerCache`): the keys *before* the
encoder's ``rotate``, the values and the normed layer input ``h``; the slots' positions are one
``[B|1, P + num_new]`` array given up front. Each step calls attention on the ``einsum`` path
over all the slots with the unfilled ones masked (``attend(k_valid=...)``), so each hook sees
what a full pass over the filled slots would give it, and no encoder is named here:

- ``rotate`` (RoPE and its static scalings, xPos, PoPE) is applied to the whole cache again from
  the positions, which is exact also where the rotation reads statistics of the window's
  positions (xPos's centre: unfilled slots take the query's position, so the centre is that
  of the filled slots);
- ``bias`` and ``content_logits`` (ALiBi, T5, Kerple, FIRE, the dynamic bias, Shaw, XL) read the
  explicit positions of the query and the keys, so relative encoders need no special case;
- ``log_decay`` (the Forgetting Transformer) reads ``h`` at the keys; unfilled slots' decays are
  zeroed before the cumulative sum;
- ``contextual_logits`` (CoPE) counts gates that are exactly 0 at masked slots;
- ``householder`` (PaTH) reads ``h`` at the keys too: each step recomputes the Householder
  products over the filled slots from the raw cached keys (unfilled slots get ``H = I``), where
  PaTH's official decoder instead applies each new token's map to the cached keys in place
  (the same logits; ``O(S (64 + Dh) Dh)`` per step and layer here instead of ``O(S Dh)``);
- ``value_term`` (Shaw) sees probabilities that are exactly 0 at masked slots;
- the input terms (token embeddings plus ``embed``: sinusoidal, learned, CAPE; and
  ``embed_tokens``: the causal convolution) are computed by :meth:`Transformer.embed_inputs` over
  the whole token buffer and the new slot taken, the same computation as the full pass, and
  exact for any input term that reads the tokens up to its own only.

``positions`` gives every slot's position (``[B|1, P + num_new]``, default ``arange``); a model
trained with randomized positions (Ruoss et al. 2023) evaluates on a sorted random subset.

Refused, with a one-line ``ValueError`` (:func:`greedy_generate_reference` runs the last two):

- a bidirectional model (``model.causal=False``): later tokens change earlier outputs;
- prompt ids outside ``[0, model.vocab_size)`` (an embedding lookup would clamp them);
- an encoder that is not ``cacheable`` (:meth:`Encoding.check_cacheable`): RoPE and xPos with
  ``scaling="dynamic"``, whose one length for the whole window changes the frequencies of every
  token as the window grows, so the cached keys and values of layers after the first are not
  what a full pass computes (the test shows the difference); CAPE with ``normalize=True``,
  whose centring on the window's mean moves every position as the window grows;
- the linear attention paths (``model.attention_impl`` in
  :data:`posenc.attention.linear.PATHS`): a different model, whose decoding would carry its own
  running sums; not implemented.

Numerics: the cache is exact up to rounding. In float32 the tests find the logits of cached and
full computation within 1e-4 and the tokens identical; in bfloat16 (the default compute dtype)
the prefill's attention path and the ``einsum`` steps round differently from the reference's
passes, so an argmax between two nearly tied logits may differ.

Cost: a step is ``O(P + num_new)`` per layer (one query against every slot, including the
encoder's hooks on those slots), against ``O((P + n)^2)`` for a full pass; the reference also
compiles once per length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.attention import linear as linear_attention
from posenc.decoding import window as window_lib
from posenc.decoding.greedy import greedy_search
from posenc.encodings.base import Encoding
from posenc.encodings.registry import fields_as_set
from posenc.layers.cache import LayerCache
from posenc.models.lm import Transformer


def greedy_generate(
    model: Transformer,
    prompts: jax.Array,
    num_new: int,
    *,
    positions: jax.Array | None = None,
    return_logits: bool = False,
    window_cache: bool = True,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Greedy (argmax) continuation of ``prompts`` with a key/value cache.

    Args:
      model: a causal :class:`~posenc.models.lm.Transformer` (dropout is not applied).
      prompts: ``[B, P]`` integer token ids, ``P >= 1``.
      num_new: tokens to generate, ``>= 1``.
      positions: ``[B|1, P + num_new]`` or ``[P + num_new]`` integer positions of the prompt and
        the generated tokens; default ``arange(P + num_new)``.
      return_logits: also return the logits each token was chosen from.
      window_cache: layers with a sliding, banded or chunked window shorter than the output
        keep a cache of the window's size (:mod:`posenc.decoding.window`); False: every layer
        one slot per token (the same tokens; for comparison).

    Returns:
      ``[B, num_new]`` int32 tokens, and with ``return_logits`` also ``[B, num_new, V]``
      float32 logits (row ``n`` predicts token ``n``).
    """
    prompts, positions = _check(model, prompts, num_new, positions, cached=True)
    graphdef, state = nnx.split(model)
    tokens, logits = _generate(
        graphdef, state, prompts, positions, num_new, 0.0, return_logits, bool(window_cache)
    )
    return (tokens, logits) if return_logits else tokens


def greedy_generate_reference(
    model: Transformer,
    prompts: jax.Array,
    num_new: int,
    *,
    positions: jax.Array | None = None,
    return_logits: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """:func:`greedy_generate` by full recomputation: at step ``n`` the model runs over the
    prompt and the ``n`` tokens so far (at their positions) and the last logits pick the next
    token. Quadratic work per step and one compilation per length; for tests and as the
    definition. Arguments and returns as for :func:`greedy_generate`."""
    prompts, positions = _check(model, prompts, num_new, positions, cached=False)
    graphdef, state = nnx.split(model)
    sequence, logits = prompts, []
    for n in range(num_new):
        length = prompts.shape[1] + n
        last = _last_logits(graphdef, state, sequence, positions[:, :length])  # [B, V]
        logits.append(last)
        sequence = jnp.concatenate([sequence, jnp.argmax(last, -1)[:, None].astype(jnp.int32)], 1)
    tokens = sequence[:, prompts.shape[1] :]
    return (tokens, jnp.stack(logits, axis=1)) if return_logits else tokens


def _check(
    model: Transformer,
    prompts: jax.Array,
    num_new: int,
    positions: jax.Array | None,
    cached: bool,
) -> tuple[jax.Array, jax.Array]:
    """Validates the arguments (and, for ``cached``, that the model can be cached); returns
    ``prompts [B, P]`` int32 and ``positions [B|1, S]`` int32 with ``S = P + num_new``."""
    config = model.config
    if not config.causal:
        raise ValueError("model.causal=False: greedy generation needs a causal model")
    if cached and config.attention_impl in linear_attention.PATHS:
        raise ValueError(
            f"model.attention_impl={config.attention_impl!r}: greedy generation has no key/value "
            "cache for the linear attention paths; use a softmax path ('auto', 'einsum', ...)"
        )
    if cached:
        for kind, encoding in layer_encodings(model):
            with _named(kind, encoding):
                encoding.check_cacheable()
    if not isinstance(num_new, int | np.integer) or isinstance(num_new, bool) or num_new < 1:
        raise ValueError(f"num_new must be a positive integer, got {num_new!r}")
    prompts = jnp.asarray(prompts)
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [B, P] token ids with P >= 1, got {prompts.shape}")
    if not jnp.issubdtype(prompts.dtype, jnp.integer):
        raise ValueError(f"prompts must be integer token ids, got dtype {prompts.dtype}")
    if not isinstance(prompts, jax.core.Tracer):  # an id past the table would be clamped
        low, high = int(prompts.min()), int(prompts.max())
        if low < 0 or high >= config.vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"prompts hold token id {bad}, outside [0, {config.vocab_size}) "
                f"(model.vocab_size={config.vocab_size})"
            )
    b, s = prompts.shape[0], prompts.shape[1] + int(num_new)
    if positions is None:
        for kind, encoding in layer_encodings(model):
            with _named(kind, encoding):
                encoding.check_length(s)
        positions = jnp.arange(s, dtype=jnp.int32)
    positions = jnp.atleast_2d(jnp.asarray(positions))
    if (
        positions.ndim != 2
        or positions.shape[1] != s
        or positions.shape[0] not in (1, b)
        or not jnp.issubdtype(positions.dtype, jnp.integer)
    ):
        raise ValueError(
            f"positions must be integer [B|1, P + num_new] = [{b}|1, {s}], got "
            f"{positions.dtype}{list(positions.shape)}"
        )
    return prompts.astype(jnp.int32), positions.astype(jnp.int32)


def layer_encodings(model: Transformer) -> list[tuple[str | None, Encoding]]:
    """The distinct bound encoders a model uses, with where each is set: ``(None, the model's)``
    (``config.encoding``: its input terms, and the layers that name no encoder of their own),
    then ``(kind, encoder)`` for each layer kind of a pattern with an encoder of its own
    (:mod:`posenc.layers.pattern`). What a per-layer check (``check_cacheable``,
    ``check_length``) must ask, not ``model.encoding`` alone."""
    blocks = list(getattr(model, "blocks", ()))
    own = model.encoding
    used = not blocks or any(b.encoding is own for b in blocks)
    used = used or bool({"embed", "embed_tokens"} & set(own.hooks))
    out: list[tuple[str | None, Encoding]] = [(None, own)] if used else []
    for block in blocks:
        if block.encoding is not own and all(block.encoding is not e for _, e in out):
            out.append((block.kind, block.encoding))
    return out


@contextlib.contextmanager
def _named(kind: str | None, encoding: Encoding) -> Iterator[None]:
    """Re-raises an encoder's ``ValueError`` with its hyperparameters named as the user sets
    them: ``encoding.hparams.<x>`` for the model's, ``layers.kinds.<kind>.hparams.<x>`` for a
    layer kind's."""
    try:
        with fields_as_set(encoding.name):
            yield
    except ValueError as e:
        if kind is None:
            raise
        message = str(e).replace("encoding.hparams.", f"layers.kinds.{kind}.hparams.")
        raise ValueError(f"layers.kinds.{kind}.encoding={encoding.name!r}: {message}") from None


def _last_logits_impl(graphdef, state, tokens, positions):
    """The model's last-position logits ``[B, V]`` for ``tokens [B, T]`` (the head on the last
    position alone: a long prompt's ``[B, T, V]`` logits are never formed)."""
    model = nnx.merge(graphdef, state)
    return model.head(model.hidden_states(tokens, positions)[:, -1:])[:, 0]


def _generate_impl(
    graphdef, state, prompts, positions, num_new, fill, return_logits, window_cache=True
):
    """Prefill, then ``num_new - 1`` cached steps in one ``fori_loop``.

    ``fill`` (a traced scalar) is the value of the cache's slots before they are written: 0,
    or NaN in the tests, which shows that unfilled slots never reach an output.
    ``window_cache``: local layers keep window-sized caches (:mod:`posenc.decoding.window`).
    """
    model = nnx.merge(graphdef, state)
    b, p = prompts.shape
    s = p + num_new
    first, prefill = model.prefill(prompts, positions[:, :p])  # [B, V]: no [B, P, V] logits
    plan = window_lib.layouts(model, s) if window_cache else ()
    windowed = any(layout.kind != "full" for layout in plan)
    if windowed:
        caches = [layout.prefill(layer, fill) for layout, layer in zip(plan, prefill, strict=True)]
    else:
        caches = [
            LayerCache(
                *(
                    jnp.full((b, s, *x.shape[2:]), fill).astype(x.dtype).at[:, :p].set(x)
                    for x in layer
                )
            )
            for layer in prefill
        ]
    buffer = jnp.zeros((b, s), jnp.int32).at[:, :p].set(prompts)
    buffer = buffer.at[:, p].set(jnp.argmax(first, -1).astype(jnp.int32))

    def step(tokens, slot, caches):
        if windowed:
            logits, caches = window_lib.decode(model, tokens, slot, positions, caches, plan)
        else:
            logits, caches = model.decode(tokens, slot, positions, caches)
        return logits[:, 0], caches  # [B, V]

    # The first new token came from the prefill; the loop adds the other num_new - 1.
    rest = greedy_search(
        step, caches, buffer, start=p, max_len=num_new - 1, return_logits=return_logits
    )
    new, out = rest if return_logits else (rest, None)
    tokens = jnp.concatenate([buffer[:, p : p + 1], new], axis=1)  # [B, num_new]
    if return_logits:
        out = first[:, None] if num_new == 1 else jnp.concatenate([first[:, None], out], 1)
    return tokens, out


# Jitted once per model structure (the graphdef), length and ``num_new``; tests re-jit the
# ``_impl`` functions with other compiler options.
_STATIC = (0, 4, 6, 7)  # graphdef, num_new, return_logits, window_cache
_generate = jax.jit(_generate_impl, static_argnums=_STATIC)
_last_logits = jax.jit(_last_logits_impl)
