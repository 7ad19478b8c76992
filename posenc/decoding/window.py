"""Window-sized key/value caches for a model's local layers (sliding, banded, chunked windows).

A layer whose attention window (:mod:`posenc.attention.options`) lets a query see at most ``W``
keys needs no more than ``W`` cache slots, whatever the output's length: Gemma's, Mistral's and
Cohere's local layers keep a window-sized cache, and that is the memory these models save in
generation. :func:`layouts` gives each layer of a decoder-only model its :class:`Layout`:

- ``"sliding"`` (``sliding:W``; ``banded:W``, which under the causal mask is the same window):
  ``W`` slots kept in time order, a shift register: before step ``t`` they hold tokens
  ``max(0, t - W) .. t - 1``; from ``t = W`` on, each step drops the oldest (one shift of ``W``
  slots, the cost of reading them) and writes the new token last;
- ``"chunked"`` (``chunked:C``): ``C`` slots, token ``t`` at slot ``t mod C``; the slots of the
  previous chunk are masked until overwritten (a query sees its own chunk only);
- ``"full"``: one slot per token of the whole output (a full window, a window no shorter than
  the output, or a layer whose encoder has a ``householder`` hook: PaTH's maps at a window's
  first tokens read the inputs before it, which a window-sized cache would have dropped).

An encoder whose ``rotate`` reads the keys before each key (its ``key_lookback``,
:mod:`posenc.encodings.base`: modded-nanogpt's key offset) gets ``W + key_lookback`` sliding
slots, the oldest masked by the window yet passed to ``rotate``, and a full cache in place of a
chunked one.

Each step passes the layer's :meth:`~posenc.layers.block.Block.decode` the new token's slot,
the positions of the slots (a ``[B|1, slots]`` slice of every token's positions) and the filled
slots (``k_valid``). The block's attention sees exactly what a full pass with the window gives
the new query: the keys of its window, in time order, at their positions, and the query at key
index ``slot``, so that the window's mask lets every valid slot through and Scalable-Softmax's
count (the keys the query may see) is the window's. Hooks that read statistics of the keys'
positions (xPos's centre) see the window's keys instead of all earlier ones: the logits are
those of the full pass up to rounding, as xPos's logits do not depend on the centre.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.layers.cache import LayerCache
from posenc.models.lm import Transformer


@dataclasses.dataclass(frozen=True)
class Layout:
    """One layer's cache: ``kind`` (``"full"``, ``"sliding"``, ``"chunked"``) and its ``slots``."""

    kind: str
    slots: int

    def prefill(self, cache: LayerCache, fill: jax.Array) -> LayerCache:
        """The prefill's ``[B, P, ...]`` cache laid out in this layout's slots (the rest
        ``fill``)."""
        p = cache.k.shape[1]
        if self.kind == "full":
            keep = slice(0, p)
        elif self.kind == "sliding":
            keep = slice(max(0, p - self.slots), p)  # the window before token p
        else:
            keep = slice((p // self.slots) * self.slots, p)  # token p's chunk so far
        n = keep.stop - keep.start

        def lay(x):
            out = jnp.full((x.shape[0], self.slots, *x.shape[2:]), fill).astype(x.dtype)
            return out.at[:, :n].set(x[:, keep])

        return LayerCache(*(lay(x) for x in cache))

    def step(
        self, cache: LayerCache, t: jax.Array, positions: jax.Array
    ) -> tuple[LayerCache, jax.Array, jax.Array, jax.Array]:
        """Before token ``t``'s step: the cache made ready, the token's slot, the slots'
        positions ``[B|1, slots]`` and the filled slots ``[1, slots]`` (the new one included).

        Args:
          cache: this layer's cache as the last step left it.
          t: the new token's index in the output (a traced scalar).
          positions: ``[B|1, total]`` every token's position.
        """
        w = self.slots
        if self.kind == "full":
            slot, start = t, 0
        elif self.kind == "sliding":
            slot = jnp.minimum(t, w - 1)
            full = t >= w  # every slot taken: drop the oldest
            cache = LayerCache(*(jnp.where(full, jnp.roll(x, -1, axis=1), x) for x in cache))
            start = t - slot
        else:
            slot = t % w
            start = t - slot
            pad = -positions.shape[1] % w  # so that the last chunk's slice stays in bounds
            positions = jnp.pad(positions, ((0, 0), (0, pad)), mode="edge")
        slots = jax.lax.dynamic_slice_in_dim(positions, start, w, axis=1)  # [B|1, W]
        valid = jnp.arange(w)[None, :] <= slot  # [1, W]
        return cache, slot, slots, valid


def layouts(model: Transformer, total: int) -> tuple[Layout, ...]:
    """Each block's :class:`Layout` for an output of ``total`` tokens (module docstring)."""
    out = []
    for block in model.blocks:
        window = block.options.parsed_window
        # An encoder whose rotate reads earlier keys (its key_lookback) needs them in the cache:
        # a sliding cache keeps that many slots more (masked by the window, read by rotate); a
        # chunk's first keys read the previous chunk's last ones, so a chunked layer keeps all.
        # A householder encoder's maps read the inputs before their token (PaTH's short
        # convolution), so the first keys of a window need the tokens before it: a full cache.
        lookback = block.encoding.key_lookback
        slots = window.size + lookback
        reads_back = "householder" in block.encoding.hooks
        if reads_back:
            out.append(Layout("full", total))
        elif window.kind in ("sliding", "banded") and slots < total:
            out.append(Layout("sliding", slots))
        elif window.kind == "chunked" and window.size < total and not lookback:
            out.append(Layout("chunked", window.size))
        else:
            out.append(Layout("full", total))
    return tuple(out)


def decode(
    model: Transformer,
    tokens: jax.Array,
    t: jax.Array | int,
    positions: jax.Array,
    caches: list[LayerCache],
    plan: tuple[Layout, ...],
) -> tuple[jax.Array, list[LayerCache]]:
    """:meth:`Transformer.decode` with each layer's cache in its :class:`Layout`: the logits of
    token ``t`` of the buffer ``tokens [B, total]`` (``[B, 1, V]``) and the updated caches.

    The input term is computed over the whole buffer and token ``t`` taken (as
    :meth:`Transformer.decode` does); then each block decodes over its own slots.
    """
    positions = jnp.atleast_2d(positions).astype(jnp.int32)  # [B|1, total]
    shared = model.layer_shared()
    x = model.embed_inputs(tokens, positions)  # [B, total, D] float32
    x = jax.lax.dynamic_slice_in_dim(x, t, 1, axis=1)  # [B, 1, D]
    new = []
    for block, cache, own, layout in zip(model.blocks, caches, shared, plan, strict=True):
        cache, slot, slot_positions, valid = layout.step(cache, t, positions)
        x, cache = block.decode(x, cache, slot, slot_positions, valid, own)
        new.append(cache)
    return model.head(x), new
