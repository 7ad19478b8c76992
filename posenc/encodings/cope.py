"""Contextual position encoding, CoPE (Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual
Position Encoding: Learning to Count What's Important", its formulas and the code in its appendix).

A query counts only the keys it finds relevant. Between query ``i`` and key ``j``::

    g_ik   = sigmoid(q_i . k_k / sqrt(Dh))                 gate; 0 for masked (future) keys
    p_ij   = min(sum_{k=j..i} g_ik, max_pos - 1)           contextual position, fractional
    z_i[p] = q_i . e[p]                                    p = 0 .. max_pos - 1
    cope_ij = (p_ij - floor p_ij) z_i[ceil p_ij] + (1 - p_ij + floor p_ij) z_i[floor p_ij]
    a_ij   = softmax_j(q_i . k_j / sqrt(Dh) + cope_ij)

Transcribed from the paper's reference code (and x-transformers' ``CoPE``, which follows it): the
gate is the sigmoid of the scaled, masked attention logit (the paper's formula writes
``sigmoid(q_i . k_j)`` with the ``1/sqrt(Dh)`` left implicit; its code adds ``log(mask)`` first, so
future keys have gate 0 and do not count); the interpolation weighs the scalars ``z_i[p]``
rather than the vectors ``e[p]`` (the paper's efficiency remark; the same value); ``cope_ij``
joins the scaled logits unscaled. ``e`` is one ``[max_pos, Dh]`` table per layer shared by the
heads, zeros at initialisation as in the paper's code.

Positions never enter: ``p_ij`` counts keys, so CoPE is invariant to shifting positions
(``relative = True``) and sees no position past training, only counts clipped at ``max_pos - 1``.
Since ``p_ij`` depends on every key between ``j`` and ``i``, CoPE is a ``contextual_logits`` hook
(:mod:`posenc.encodings.base`): the suffix sum is carried across key tiles, so the ``blocked``
path evaluates long windows in memory linear in their length; the fused kernels, which never
form the logits, refuse it.

CoPE is causal as defined (``p_ij`` counts the keys ``j .. i`` of a query ``i >= j``): it declares
``causal_only`` and the model refuses it with ``model.causal=False``. (``attend(causal=False)``
would count every key from ``j`` to the end of the window, which is not the paper's method.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.registry import register


@register
@dataclasses.dataclass(frozen=True)
class CoPE(Encoding):
    """Contextual positions counted by sigmoid gates, one embedding table per layer.

    Attributes:
      max_pos: number of embeddings ``e[0 .. max_pos-1]``; contextual positions are clipped at
        ``max_pos - 1`` (x-transformers' default, 16; the paper sets it per task).
      init_std: standard deviation of the normal initialiser of ``e``; 0 (the paper's zeros)
        makes CoPE start as NoPE and learn its embeddings.
    """

    name = "cope"
    paper = (
        "Golovneva, Wang, Weston, Sukhbaatar 2024, Contextual Position Encoding: Learning to "
        "Count What's Important"
    )
    relative = True  # positions are counted from the content, never read
    # The paper counts the keys from j up to the query i (j <= i); nothing for keys after it.
    causal_only = True

    max_pos: int = 16
    init_std: float = 0.0

    def __post_init__(self):
        if not isinstance(self.max_pos, int) or isinstance(self.max_pos, bool) or self.max_pos < 1:
            raise ValueError(f"encoding.max_pos must be an integer >= 1, got {self.max_pos!r}")
        check_positive("encoding.init_std", self.init_std, allow_zero=True)

    @property
    def carry_limit(self) -> float:
        """Counts are clipped at ``max_pos - 1``: a query whose count from the later keys has
        reached it sees position ``max_pos - 1`` on every earlier key, whatever the gates."""
        return float(self.max_pos - 1)

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        return {"embeddings": (self.max_pos, dims.head_dim)}  # e: [max_pos, Dh]

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        (shape,) = self.param_shapes(dims).values()
        return {"embeddings": (self.init_std * jax.random.normal(rng, shape)).astype(jnp.float32)}

    def contextual_logits(
        self, params: Params, q: jax.Array, k: jax.Array, logits: jax.Array, carry: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """CoPE's logits ``cope_ij`` for a tile of keys, and the gates counted so far.

        Args:
          params: ``{"embeddings": [max_pos, Dh]}``.
          q: ``[B, T, H, Dh]`` queries.
          k: ``[B, S, H, Dh]`` keys (unused: the gates come from ``logits``).
          logits: ``[B, H, T, S]`` float32 scaled logits, masked pairs at ``-1e30`` (gate 0).
          carry: ``[B, H, T]`` float32 sum of the gates of the keys after this tile.

        Returns:
          ``[B, H, T, S]`` float32 terms for the scaled logits, and ``[B, H, T]`` the gates summed
          from the first key of this tile on (the carry for the tile before it).
        """
        del k
        gates = jax.nn.sigmoid(logits)  # [B, H, T, S]; exactly 0 where masked
        counted = carry[..., None] + _suffix_sums(gates)  # sum_{k>=j}
        pos = jnp.minimum(counted, self.max_pos - 1)  # p_ij, clipped
        table = params["embeddings"].astype(q.dtype)
        z = jnp.einsum("BTHD,PD->BHTP", q, table, preferred_element_type=jnp.float32)
        return _interpolate(z, pos), counted[..., 0]


@jax.custom_vjp
def _interpolate(z: jax.Array, pos: jax.Array) -> jax.Array:
    """``z[..., ceil p] * w + z[..., floor p] * (1 - w)``, ``w = p - floor p``: ``z [B, H, T, P]``
    at fractional positions ``pos [B, H, T, S]`` in ``[0, P - 1]`` -> ``[B, H, T, S]``.

    The gradient is the one autodiff gives (the gates are reached through ``w``, as in the
    paper's code: ``z[ceil] - z[floor]`` per unit of ``pos``), written by hand for ``z``: autodiff
    turns the two gathers into scatter-adds, which made CoPE's attention gradient at 128 tokens
    cost 52-76 ms on XLA:CPU (this VM, ``[8, 4, 128, 128]``); summing the incoming gradient
    against each position's hat function ``max(0, 1 - |pos - p|)`` costs 14 ms, the same values.
    """
    return _interpolate_forward(z, pos)[0]


def _interpolate_forward(z, pos):
    """The interpolation, and what its gradient needs: ``z``, ``pos`` and the slope
    ``z[ceil] - z[floor]`` (one ``[B, H, T, S]`` array kept instead of two gathers again)."""
    floor = jnp.floor(pos)
    z_floor = jnp.take_along_axis(z, floor.astype(jnp.int32), axis=-1)
    slope = jnp.take_along_axis(z, jnp.ceil(pos).astype(jnp.int32), axis=-1) - z_floor
    return z_floor + slope * (pos - floor), (z, pos, slope)


def _interpolate_backward(saved, grad):
    z, pos, slope = saved

    # Entry p of z weighs 1 - w at floor p = p, w at ceil p = p: the hat max(0, 1 - |pos - p|).
    # A loop over p, not one reduction per p unrolled: XLA:CPU's YNNPACK fusions take a constant
    # p as a materialised [B, H, T, S] operand, 16 broadcasts that cost 14 of a CoPE training
    # step's 58 ms (2 layers, [8, 4, 128, 128], this VM, profiled); a loop's p stays a scalar.
    def column(p, d_z):
        hat = jnp.maximum(0.0, 1.0 - jnp.abs(pos - p.astype(pos.dtype)))
        return jax.lax.dynamic_update_index_in_dim(d_z, jnp.sum(grad * hat, axis=-1), p, axis=-1)

    d_z = jax.lax.fori_loop(0, z.shape[-1], column, jnp.zeros(z.shape, grad.dtype))
    return d_z.astype(z.dtype), grad * slope


_interpolate.defvjp(_interpolate_forward, _interpolate_backward)


def _suffix_sums(x: jax.Array, chunk: int = 32) -> jax.Array:
    """``sum_{k >= j} x[..., k]`` for every ``j`` of the last axis.

    Chunks of ``chunk`` columns: a matmul with a triangle of ones within each, plus the sums of
    the chunks after it. Equal to ``lax.cumsum(x, reverse=True)`` up to float rounding; XLA:CPU
    lowers that as a window reduction, ``S`` additions per entry, which made it the costliest
    step of CoPE on a ``512 x 512`` tile (1.8 ms against 0.7 ms here, this VM).
    """
    s = x.shape[-1]
    pad = -s % chunk
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x
    pieces = padded.reshape(*x.shape[:-1], (s + pad) // chunk, chunk)  # [..., N, C]
    later_or_same = jnp.tril(jnp.ones((chunk, chunk), x.dtype))  # [k, j] = 1 where k >= j
    # HIGHEST: a float32 count, not TF32's (GPUs) or bfloat16 passes (TPUs) of a default matmul.
    within = jnp.einsum(
        "...nk,kj->...nj", pieces, later_or_same, precision=jax.lax.Precision.HIGHEST
    )
    totals = pieces.sum(axis=-1)  # [..., N]
    after = jax.lax.cumsum(totals, axis=totals.ndim - 1, reverse=True) - totals
    return (within + after[..., None]).reshape(padded.shape)[..., :s]
