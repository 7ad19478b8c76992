"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", Sec. 3.4).

Each pair of query/key channels ``(x_a, x_b)`` is rotated by the angle ``m * theta_i`` where
``m`` is the token's position and ``theta_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``::

    [x_a']   [cos(m theta_i)  -sin(m theta_i)] [x_a]
    [x_b'] = [sin(m theta_i)   cos(m theta_i)] [x_b]

so that ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``n - m``.
Two layouts pair the channels differently:

- ``"interleaved"`` (the paper, Eq. 34): pairs ``(x_{2i}, x_{2i+1})``;
- ``"half"`` (GPT-NeoX, LLaMA): pairs ``(x_i, x_{i + d/2})``.

With ``fraction < 1`` only the first ``d = 2 * floor(fraction * Dh / 2)`` channels of each head are
rotated (GPT-NeoX's ``rotary_pct``); the rest pass through unchanged.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_choice, check_positive
from posenc.encodings.registry import register

LAYOUTS = ("half", "interleaved")


def rotary_dims(head_dim: int, fraction: float = 1.0) -> int:
    """How many channels of a head RoPE rotates: the even number ``2 * floor(fraction*Dh/2)``."""
    return 2 * int(fraction * head_dim // 2)


def apply_rope(
    x: jax.Array,
    positions: jax.Array,
    *,
    base: float = 10000.0,
    layout: str = "half",
    fraction: float = 1.0,
) -> jax.Array:
    """Rotates the channels of ``x`` by position-dependent angles.

    Angles are computed in float32 from the integer positions, the rotation in float32, and the
    result cast back to ``x.dtype``.

    Args:
      x: ``[B, T, H, Dh]`` queries or keys.
      positions: ``[B, T]``, ``[1, T]`` or ``[T]`` integer positions.
      base: ``theta_i = base^(-2i/d)``; 10000 in the paper, 500000 (LLaMA 3) or 1e6 in newer LLMs.
      layout: ``"half"`` or ``"interleaved"`` (see the module docstring).
      fraction: fraction of each head's channels to rotate.

    Returns:
      ``[B, T, H, Dh]``, same dtype as ``x``.
    """
    check_choice("encoding.layout", layout, LAYOUTS)
    head_dim = x.shape[-1]
    d = rotary_dims(head_dim, fraction)
    if d < 2:
        raise ValueError(
            f"RoPE rotates pairs of channels but a head of {head_dim} channels with "
            f"encoding.fraction={fraction} leaves {d}; use a larger head or fraction"
        )
    positions = jnp.atleast_2d(positions)  # [B|1, T]
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # [d/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B|1, T, d/2]
    cos = jnp.cos(angles)[:, :, None, :]  # [B|1, T, 1, d/2]
    sin = jnp.sin(angles)[:, :, None, :]
    rot, rest = x[..., :d].astype(jnp.float32), x[..., d:]
    if layout == "interleaved":
        pairs = rot.reshape(*rot.shape[:-1], d // 2, 2)  # [B, T, H, d/2, 2]
        a, b = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
        out = out.reshape(rot.shape)  # [B, T, H, d]
    else:
        a, b = rot[..., : d // 2], rot[..., d // 2 :]
        out = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return jnp.concatenate([out.astype(x.dtype), rest], axis=-1)


@register
@dataclasses.dataclass(frozen=True)
class RoPE(Encoding):
    """Rotary position embedding applied to queries and keys in every layer.

    Attributes:
      base: ``theta_i = base^(-2i/d)``.
      layout: ``"half"`` (GPT-NeoX/LLaMA) or ``"interleaved"`` (the paper).
      fraction: fraction of each head's channels that are rotated, in ``(0, 1]``.
    """

    name = "rope"
    paper = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding"
    relative = True

    base: float = 10000.0
    layout: str = "half"
    fraction: float = 1.0

    def __post_init__(self):
        check_positive("encoding.base", self.base)
        check_choice("encoding.layout", self.layout, LAYOUTS)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"encoding.fraction must be in (0, 1], got {self.fraction!r}")

    def validate(self, dims: Dims) -> None:
        d = rotary_dims(dims.head_dim, self.fraction)
        if self.fraction == 1.0 and dims.head_dim % 2:
            raise ValueError(
                f"RoPE rotates channel pairs and cannot rotate a head dimension of "
                f"{dims.head_dim} (odd); choose model.model_dim / model.num_heads even, or set "
                "encoding.fraction < 1 to rotate only part of each head"
            )
        if d < 2:
            raise ValueError(
                f"RoPE with encoding.fraction={self.fraction} rotates {d} of the "
                f"{dims.head_dim} channels of a head; it needs at least 2"
            )

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> both rotated by their positions."""
        del params  # fixed frequencies; learned rotary variants read theirs from here
        kw = dict(base=self.base, layout=self.layout, fraction=self.fraction)
        return apply_rope(q, q_pos, **kw), apply_rope(k, k_pos, **kw)
