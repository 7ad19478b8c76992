"""ALiBi, attention with linear biases (Press, Smith, Lewis 2022, "Train Short, Test Long").

Head ``h`` adds ``-m_h * (i - j)`` to the logit of query ``i`` and key ``j <= i``; nothing is
added to the embeddings (without a causal mask posenc uses ``-m_h * |i - j|``). The slopes form a
geometric sequence (Sec. 3): for ``n`` heads, a power of two, ``m_h = 2^(-8h/n)``, ``h = 1..n``
(8 heads: 1/2, 1/4, ..., 1/256). For other head counts the paper's code takes the slopes of the
closest power of two below, ``n' = 2^floor(log2 n)``, and adds every other slope of ``2n'`` heads
until there are ``n``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Encoding, Params
from posenc.encodings.registry import register
from posenc.encodings.relative import pairwise_offsets


def _geometric_slopes(n: int) -> list[float]:
    ratio = 2.0 ** (-8.0 / n)
    return [ratio**h for h in range(1, n + 1)]


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The per-head slopes ``m_h`` of ALiBi.

    Args:
      num_heads: number of attention heads ``H >= 1``.

    Returns:
      ``[H]`` float32 numpy array, decreasing.
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"model.num_heads must be a positive integer, got {num_heads!r}")
    if num_heads & (num_heads - 1) == 0:
        slopes = _geometric_slopes(num_heads)
    else:
        lower = 2 ** math.floor(math.log2(num_heads))
        slopes = _geometric_slopes(lower) + _geometric_slopes(2 * lower)[0::2][: num_heads - lower]
    return np.asarray(slopes, dtype=np.float32)


@register
@dataclasses.dataclass(frozen=True)
class ALiBi(Encoding):
    """Linear distance penalties with the paper's fixed per-head slopes; no parameters."""

    name = "alibi"
    paper = "Press, Smith, Lewis 2022, Train Short, Test Long (ALiBi)"
    relative = True
    bias_by_distance = True  # -m_h |i - j|

    def bias(self, params: Params, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """``[B|1, T]``, ``[B|1, S]`` positions -> ``[B|1, H, T, S]`` float32 logits."""
        del params
        slopes = jnp.asarray(alibi_slopes(self.bound_dims.num_heads))  # [H]
        # -|i - j|: for causal attention (the paper's setting) this is -(i - j) on every
        # visible key; without a causal mask, keys after the query are penalised alike.
        distance = jnp.abs(pairwise_offsets(q_pos, k_pos)).astype(jnp.float32)  # [B|1, T, S]
        return -slopes[None, :, None, None] * distance[:, None, :, :]  # [B|1, H, T, S]
