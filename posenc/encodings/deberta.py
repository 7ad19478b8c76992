"""DeBERTa's disentangled attention (He, Liu, Gao, Chen 2021, "DeBERTa: Decoding-enhanced BERT
with Disentangled Attention", Sec. 3.1, eq. (2)-(4)).

Each token has a content vector and each relative distance a position vector ``P_d`` (a learned
table of ``2k`` rows). With ``Q^c, K^c`` the content queries and keys and the position queries
and keys ``Q^r = P W_{q,r}``, ``K^r = P W_{k,r}`` (eq. (2)), the logit of query ``i`` and key
``j`` is::

    A_ij = Q^c_i . K^c_j                      content-to-content
         + Q^c_i . K^r_{delta(i, j)}          content-to-position (c2p)
         + K^c_j . Q^r_{delta(j, i)}          position-to-content (p2c)
    H_o  = softmax(A / sqrt(3 d)) V^c                                   (eq. (4))

    delta(i, j) = clip(i - j + k, 0, 2k - 1)                            (eq. (3))

with ``d`` the per-head width (the code's ``scale_factor = 3`` on the query's per-head size).
The p2c term follows the paper, ``delta(j, i)``: the relative position of the query seen from the
key. (The released code, microsoft/DeBERTa ``disentangled_attention.py``, gathers the p2c term at
``delta(i, j)`` instead; we transcribe the paper.)

DeBERTa-v2 log-buckets the distances (``buckets``, the code's ``position_buckets``): with
``mid = buckets // 2``, a distance ``r`` becomes ``r`` for ``|r| <= mid`` and otherwise
``sign(r) * (mid + ceil(log(|r| / mid) / log((k - 1) / mid) * (mid - 1)))`` after clamping ``r``
to ``[-(k-1), k-1]`` (``make_log_bucket_position``, with ``k`` = ``max_relative_positions``), and
the table then has ``2 * buckets`` rows indexed by ``clip(bucket(i - j) + buckets, 0,
2 * buckets - 1)``. The buckets are odd in ``r``, so p2c's ``bucket(j - i) = -bucket(i - j)``.
The bucket of each ``|r|`` is computed once in float64 (numpy) as a lookup table, so it is
exactly the formula's at every boundary.

On posenc's hooks: ``rotate`` multiplies ``q`` by ``1/sqrt(3)`` (so ``q . k`` and c2p, which see
the rotated ``q``, carry it), and ``content_logits`` returns ``c2p + p2c / sqrt(3)``; attention
adds them to ``q . k`` and scales the sum by ``1/sqrt(d)``: together ``A / sqrt(3 d)``.

Choices (documented departures):

- Parameter scope. The paper shares ``P`` across layers and learns ``W_{q,r}``, ``W_{k,r}`` per
  layer; posenc's encoders keep all their parameters either per layer or shared, so here every
  layer has its own ``P`` (``2k x D``) and projections (``D x H x Dh`` each), a superset of the
  shared table.
- No layer norm or dropout on ``P`` (DeBERTa-v2's ``norm_rel_ebd``), no biases in ``W_{q,r}``,
  ``W_{k,r}`` (eq. (2) has none; v1's code has one on ``W_{q,r}``), and no p2p term.
- Bidirectional (BERT's) and causal attention both work: causal attention only masks.

Memory: c2p and p2c are ``[B, H, T, 2k]`` projections gathered to ``[B, H, T, S]`` at each
pair's index (``take_along_axis``, as the paper's code ``torch.gather``); no ``T x S x D`` tensor.
Any integer positions.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register


@functools.lru_cache(maxsize=32)
def log_bucket_table(buckets: int, max_distance: int) -> np.ndarray:
    """``bucket(r)`` for ``r = 0 .. max_distance - 1`` (DeBERTa-v2's ``make_log_bucket_position``
    on non-negative distances, in float64): ``[max_distance]`` int32."""
    mid = buckets // 2
    r = np.arange(max_distance, dtype=np.float64)
    abs_pos = np.where(r < mid, mid - 1, r)
    log_pos = np.ceil(np.log(abs_pos / mid) / np.log((max_distance - 1) / mid) * (mid - 1)) + mid
    return np.where(abs_pos <= mid, r, log_pos).astype(np.int32)


def relative_index(
    q_pos: jax.Array, k_pos: jax.Array, max_distance: int, buckets: int | None
) -> jax.Array:
    """``delta(i, j)``, the row of ``P`` each (query, key) pair uses (eq. (3); with ``buckets``,
    of DeBERTa-v2's log buckets).

    Args:
      q_pos: ``[..., T]`` integer query positions ``i``.
      k_pos: ``[..., S]`` integer key positions ``j``.
      max_distance: ``k``, the paper's (and code's) ``max_relative_positions``.
      buckets: DeBERTa-v2's ``position_buckets``, or None for plain clipping.

    Returns:
      ``[..., T, S]`` int32 indices into a table of ``2k`` (or ``2 * buckets``) rows.
    """
    rel = q_pos[..., :, None].astype(jnp.int32) - k_pos[..., None, :].astype(jnp.int32)
    span = max_distance
    if buckets is not None:
        span = buckets
        table = jnp.asarray(log_bucket_table(buckets, max_distance))
        magnitude = jnp.minimum(jnp.abs(rel), max_distance - 1)
        rel = jnp.sign(rel) * table[magnitude]
    return jnp.clip(rel + span, 0, 2 * span - 1)


@register
@dataclasses.dataclass(frozen=True)
class DeBERTa(Encoding):
    """Disentangled attention: content-to-position and position-to-content terms over relative
    position embeddings of clipped (or log-bucketed) distances, logits scaled by ``1/sqrt(3 d)``.

    Attributes:
      max_distance: ``k``, the paper's ``max_relative_positions`` (512 in the paper): distances
        are clipped to ``[-k, k)`` (eq. (3)), or with ``buckets`` clamped to ``k - 1`` before
        bucketing.
      buckets: DeBERTa-v2's ``position_buckets`` (256 in its configs), or None (v1, the paper):
        log buckets beyond ``buckets // 2``; needs ``4 <= buckets`` and ``buckets // 2 <
        max_distance - 1``.
      init_std: standard deviation of the normal initialiser of ``P`` (BERT's 0.02).
    """

    name = "deberta"
    paper = "He, Liu, Gao, Chen 2021, DeBERTa: Decoding-enhanced BERT with Disentangled Attention"
    relative = True

    max_distance: int = 512
    buckets: int | None = None
    init_std: float = 0.02

    def __post_init__(self):
        k = self.max_distance
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(
                f"encoding.max_distance (DeBERTa's k) must be an integer >= 1, got {k!r}"
            )
        b = self.buckets
        if b is not None and (
            not isinstance(b, int) or isinstance(b, bool) or b < 4 or b // 2 >= k - 1
        ):
            raise ValueError(
                "encoding.buckets (DeBERTa-v2's position_buckets) must be None or an integer >= 4 "
                f"with buckets // 2 < max_distance - 1 = {k - 1}, got {b!r}"
            )

    @property
    def table_rows(self) -> int:
        """Rows of ``P``: ``2k``, or ``2 * buckets`` with log buckets."""
        return 2 * (self.buckets if self.buckets is not None else self.max_distance)

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        h, d, m = dims.num_heads, dims.head_dim, dims.model_dim
        return {"p": (self.table_rows, m), "w_qr": (m, h, d), "w_kr": (m, h, d)}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        w = ("embed", "heads", "head_dim")
        return {"p": (None, "embed"), "w_qr": w, "w_kr": w}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        rp, rq, rk = jax.random.split(rng, 3)
        shapes = self.param_shapes(dims)
        scale = 1.0 / math.sqrt(dims.model_dim)  # a dense layer's
        return {
            "p": (self.init_std * jax.random.normal(rp, shapes["p"])).astype(jnp.float32),
            "w_qr": (scale * jax.random.normal(rq, shapes["w_qr"])).astype(jnp.float32),
            "w_kr": (scale * jax.random.normal(rk, shapes["w_kr"])).astype(jnp.float32),
        }

    def rotate(self, params: Params, q: jax.Array, k: jax.Array, q_pos, k_pos):
        """``q / sqrt(3)`` (``[B, T, H, Dh]``), ``k`` unchanged: the ``sqrt(3)`` of eq. (4)'s
        ``1/sqrt(3 d)`` for ``q . k`` and c2p."""
        del params, q_pos, k_pos
        return (q * (1.0 / math.sqrt(3.0))).astype(q.dtype), k

    def content_logits(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """``c2p + p2c / sqrt(3)`` for every pair (``q`` is already divided by ``sqrt(3)``).

        Args:
          q: ``[B, T, H, Dh]`` rotated content queries; k: ``[B, S, H, Dh]`` content keys.
          q_pos: ``[B|1, T]``; k_pos: ``[B|1, S]``.

        Returns:
          ``[B, H, T, S]`` unscaled logits (attention scales them by ``1/sqrt(Dh)``).
        """
        p = params["p"].astype(q.dtype)  # [2k, D]
        k_r = jnp.einsum("RM,MHD->RHD", p, params["w_kr"].astype(q.dtype))  # [2k, H, Dh]
        q_r = jnp.einsum("RM,MHD->RHD", p, params["w_qr"].astype(q.dtype))
        b, t, h, _ = q.shape
        s = k.shape[1]
        c2p_all = jnp.einsum("BTHD,RHD->BHTR", q, k_r)  # [B, H, T, 2k]
        p2c_all = jnp.einsum("BSHD,RHD->BHSR", k, q_r)  # [B, H, S, 2k]
        index = relative_index(q_pos, k_pos, self.max_distance, self.buckets)  # delta(i, j)
        index_t = relative_index(k_pos, q_pos, self.max_distance, self.buckets)  # delta(j, i)
        index = jnp.broadcast_to(index[:, None], (b, h, t, s))
        index_t = jnp.broadcast_to(index_t[:, None], (b, h, s, t))
        c2p = jnp.take_along_axis(c2p_all, index, axis=-1)  # [B, H, T, S]
        p2c = jnp.take_along_axis(p2c_all, index_t, axis=-1).swapaxes(-1, -2)  # [B, H, T, S]
        return c2p.astype(jnp.float32) + p2c.astype(jnp.float32) / math.sqrt(3.0)
