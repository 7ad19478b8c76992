"""Transformer-XL relative attention (Dai et al. 2019, "Transformer-XL", Sec. 3.3).

The logit of query ``i`` and key ``j`` is the sum of four terms (Eq. in Sec. 3.3)::

    A_ij = q_i . k_j                 (a) content
         + q_i . W_kR R_{i-j}        (b) content-dependent position
         + u   . k_j                 (c) global content bias
         + v   . W_kR R_{i-j}        (d) global position bias

where ``R`` is the sinusoid table of Vaswani et al. evaluated at the distance ``i - j`` (optionally
clamped to ``clamp_len``), ``W_kR`` a learned projection, and ``u``, ``v`` learned per head.
Attention computes (a); this module returns (b) + (c) + (d). Terms (b) and (d) are computed as
``(q_i + v) . W_kR R_d`` against the ``T + S`` distances of the relative table and moved to their
(query, key) pairs with the rel-shift trick (:func:`posenc.encodings.relative.rel_shift`); no
``L x L x D`` tensor is built. The skew keeps ``S`` of each row's ``T + S`` scores, so a long row of
queries is cut into sub-blocks of up to 64 (:func:`_sub_block`), each scored against only the
``sub + S`` distances its rows use (a slice of the projected table): about ``T x S`` dot products
instead of ``T x (T + S)`` (a ``blocked`` tile of 512 x 512 does 56 % of the work).

The relative table needs contiguous positions. For any others (randomized positions, Ruoss et
al. 2023) the sinusoid of ``i - j`` is split with ``sin(a - b) = sin a cos b - cos a sin b`` (and
the same for cos), so that (b) + (d) becomes a product of a query side at ``i`` and a key side at
``j``, again without an ``L x L x D`` tensor; with ``clamp_len`` the pairs farther apart than it
take the sinusoid of ``clamp_len`` instead. ``jax.lax.cond`` picks the path at run time
(:func:`~posenc.encodings.relative.is_contiguous`).

Parameters are kept per layer (the original code's ``untie_r=True`` setting).

Bidirectional attention (``model.causal=False``) uses the same terms for keys after the query,
with negative distances ``i - j`` (``sin`` is odd, so ``R_{-d} != R_d``): the relative table and
the separable path cover both signs, and ``clamp_len`` clamps ``|i - j|``, to
``[-clamp_len, clamp_len]``, as XLNet (Yang et al. 2019) does for its bidirectional relative
attention (``clip_by_value(pos_seq, -clamp_len, clamp_len)``). For a causal model only
``i - j >= 0`` is ever seen, where this is the original clamp.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register
from posenc.encodings.relative import is_contiguous, pairwise_offsets, rel_shift, relative_offsets
from posenc.encodings.sinusoidal import sinusoidal_table


def _sub_block(t: int) -> int:
    """Queries per sub-block of the relative table: ``t`` itself up to 64 (the skew's waste is
    small against a matmul's fixed cost), else the largest divisor of ``t`` from 16 to 64 (or
    ``t`` where there is none, e.g. a prime)."""
    if t <= 64:
        return t
    return next((d for d in range(64, 15, -1) if t % d == 0), t)


@register
@dataclasses.dataclass(frozen=True)
class TransformerXL(Encoding):
    """Relative sinusoids projected by ``W_kR`` plus global biases ``u`` and ``v``.

    Any integer positions: contiguous rows take the rel-shift path, others the separable one.

    Attributes:
      clamp_len: distances beyond this share the sinusoid of ``clamp_len`` (None: no clamping).
      base: wavelength base of the relative sinusoids.
      init_std: standard deviation of the normal initialisers.
    """

    name = "xl"
    paper = "Dai et al. 2019, Transformer-XL: Attentive Language Models Beyond a Fixed-Length..."
    relative = True
    # The original code clamps relative distances at evaluation only (Dai et al. 2019).
    eval_safe_hparams = ("clamp_len",)

    clamp_len: int | None = None
    base: float = 10000.0
    init_std: float = 0.02

    def __post_init__(self):
        if self.clamp_len is not None and (
            not isinstance(self.clamp_len, int) or self.clamp_len < 0
        ):
            raise ValueError(
                f"encoding.clamp_len must be None or an integer >= 0, got {self.clamp_len!r}"
            )

    def validate(self, dims: Dims) -> None:
        if dims.model_dim % 2:
            raise ValueError(
                f"Transformer-XL's relative sinusoids need an even model.model_dim, "
                f"got {dims.model_dim}"
            )

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        h, d, m = dims.num_heads, dims.head_dim, dims.model_dim
        return {"u": (h, d), "v": (h, d), "w_r": (m, h, d)}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        w_r = ("embed", "heads", "head_dim")
        return {"u": ("heads", "head_dim"), "v": ("heads", "head_dim"), "w_r": w_r}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        ru, rv, rw = jax.random.split(rng, 3)
        shapes = self.param_shapes(dims)
        return {
            "u": self.init_std * jax.random.normal(ru, shapes["u"]),
            "v": self.init_std * jax.random.normal(rv, shapes["v"]),
            # Scaled like a dense layer so that W_kR R has unit-ish variance per channel.
            "w_r": jax.random.normal(rw, shapes["w_r"]) / jnp.sqrt(dims.model_dim),
        }

    def relative_keys(self, params: Params, distances: jax.Array, dtype) -> jax.Array:
        """``W_kR R_d``: ``[..., N]`` integer distances ``i - j`` -> ``[..., N, H, Dh]``."""
        if self.clamp_len is not None:
            distances = jnp.clip(distances, -self.clamp_len, self.clamp_len)
        r = sinusoidal_table(distances, self.bound_dims.model_dim, self.base)  # [..., N, D]
        return jnp.einsum("...NM,MHD->...NHD", r.astype(dtype), params["w_r"].astype(dtype))

    def content_logits(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """Terms (b) + (d) + (c): ``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> ``[B, H, T, S]``."""
        query = q + params["v"].astype(q.dtype)  # [B, T, H, Dh]
        position_terms = jax.lax.cond(
            is_contiguous(q_pos, k_pos),
            self._positions_by_offset,
            self._positions_by_pair,
            params["w_r"],
            query,
            q_pos,
            k_pos,
        )  # (b) + (d): [B, H, T, S]
        content_bias = jnp.einsum("HD,BSHD->BHS", params["u"].astype(k.dtype), k)  # (c)
        return position_terms + content_bias[:, :, None, :]

    def _positions_by_offset(self, w_r, query, q_pos, k_pos):
        """Contiguous positions: score the relative table in query sub-blocks, then skew."""
        distances = -relative_offsets(q_pos, k_pos)  # [B|1, T + S], i - j per table column
        rel_keys = self.relative_keys({"w_r": w_r}, distances, query.dtype)  # [B|1, R, H, Dh]
        b, t, h, dh = query.shape
        s = k_pos.shape[-1]
        sub = _sub_block(t)
        n = t // sub
        # Sub-block m (queries m * sub ..) uses the table's columns (T - sub) - m * sub + [0,
        # sub + S): its own relative table (rel_shift's layout for sub queries and S keys).
        columns = (t - sub) - sub * np.arange(n)[:, None] + np.arange(sub + s)[None, :]
        rel_keys = rel_keys[:, columns]  # [B|1, N, sub + S, H, Dh]
        query = query.reshape(b, n, sub, h, dh)  # [B, N, sub, H, Dh]
        if rel_keys.shape[0] == 1:
            per_offset = jnp.einsum("BNTHD,NRHD->BHNTR", query, rel_keys[0])
        else:
            per_offset = jnp.einsum("BNTHD,BNRHD->BHNTR", query, rel_keys)
        return rel_shift(per_offset).reshape(b, h, t, s)  # [B, H, N, sub, S] -> [B, H, T, S]

    def _positions_by_pair(self, w_r, query, q_pos, k_pos):
        """Any positions: ``x_i . W_kR R_{i-j}`` through the angle-difference identities.

        With ``c = x_i W_kR`` split into its sin and cos channels (``R`` interleaves them),
        ``c_s sin((i-j)w) + c_c cos((i-j)w) = A_i cos(jw) + B_i sin(jw)`` where
        ``A_i = c_s sin(iw) + c_c cos(iw)`` and ``B_i = c_c sin(iw) - c_s cos(iw)``.
        """
        dims = self.bound_dims
        c = jnp.einsum("BTHD,MHD->BHTM", query, w_r.astype(query.dtype)).astype(jnp.float32)
        c = c.reshape(*c.shape[:-1], dims.model_dim // 2, 2)  # [B, H, T, D/2, 2]
        c_sin, c_cos = c[..., 0], c[..., 1]
        inv_freq = self.base ** (
            -jnp.arange(0, dims.model_dim, 2, dtype=jnp.float32) / dims.model_dim
        )
        q_angle = q_pos.astype(jnp.float32)[:, None, :, None] * inv_freq  # [B|1, 1, T, D/2]
        k_angle = k_pos.astype(jnp.float32)[..., None] * inv_freq  # [B|1, S, D/2]
        a = c_sin * jnp.sin(q_angle) + c_cos * jnp.cos(q_angle)  # [B, H, T, D/2]
        b = c_cos * jnp.sin(q_angle) - c_sin * jnp.cos(q_angle)
        k_cos, k_sin = jnp.cos(k_angle), jnp.sin(k_angle)
        if k_cos.shape[0] == 1:
            terms = jnp.einsum("BHTF,SF->BHTS", a, k_cos[0]) + jnp.einsum(
                "BHTF,SF->BHTS", b, k_sin[0]
            )
        else:
            terms = jnp.einsum("BHTF,BSF->BHTS", a, k_cos) + jnp.einsum("BHTF,BSF->BHTS", b, k_sin)
        if self.clamp_len is not None:  # pairs beyond +-clamp_len use R_{+-clamp_len}
            flat = c.reshape(*c.shape[:-2], -1)  # [B, H, T, D]
            distance = -pairwise_offsets(q_pos, k_pos)[:, None]  # i - j, [B|1, 1, T, S]
            for sign in (1, -1):
                clamped = jnp.einsum("BHTM,M->BHT", flat, self._r_clamp(sign))
                far = sign * distance > self.clamp_len
                terms = jnp.where(far, clamped[..., None], terms)
        return terms.astype(query.dtype)

    def _r_clamp(self, sign: int = 1) -> jax.Array:
        """``R_{sign * clamp_len}``: ``[D]`` float32."""
        distance = jnp.asarray(sign * self.clamp_len, jnp.int32)
        return sinusoidal_table(distance, self.bound_dims.model_dim, self.base)
