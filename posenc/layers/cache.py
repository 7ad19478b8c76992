"""What attention layers keep between decoding steps.

A self-attention cache preallocates one slot per token of the whole output and is written slot
by slot (:meth:`posenc.layers.block.Block.decode`); a cross-attention cache holds the encoder
output's keys and values, computed once per source
(:meth:`posenc.layers.attention.CrossAttention.kv`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax


class LayerCache(NamedTuple):
    """What one layer's self-attention cache keeps per token.

    ``k`` is kept before the encoder's ``rotate``: attention rotates the whole cache again at
    every step from the slots' positions, which is exact also for a rotation that reads the
    window's positions (xPos's centre). ``h`` is the layer's normed input, which ``log_decay``
    reads.

    Attributes:
      h: ``[B, S, D]`` normed layer input, compute dtype.
      k: ``[B, S, KV, Dh]`` keys (before ``rotate``), compute dtype.
      v: ``[B, S, KV, Dh]`` values, compute dtype.
    """

    h: jax.Array
    k: jax.Array
    v: jax.Array


class CrossCache(NamedTuple):
    """One decoder layer's cross-attention keys and values over the encoder output.

    Attributes:
      k: ``[B, S, KV, Dh]`` keys, compute dtype.
      v: ``[B, S, KV, Dh]`` values, compute dtype.
      valid: ``[B, S]`` bool, the source tokens that are not padding.
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
