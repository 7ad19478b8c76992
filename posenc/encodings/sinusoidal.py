"""Absolute sinusoidal encoding (Vaswani et al. 2017, "Attention Is All You Need", Sec. 3.5)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.registry import register


def sinusoidal_table(positions: jax.Array, dim: int, base: float = 10000.0) -> jax.Array:
    """The paper's sinusoids at explicit integer positions.

    ``PE(pos, 2i) = sin(pos / base^(2i/d))`` and ``PE(pos, 2i+1) = cos(pos / base^(2i/d))``,
    interleaved as in the paper. Angles are computed in float32 from the integer positions (a
    bf16 position would already be off by 16 at position 4096).

    Args:
      positions: integer array of any shape ``[...]``.
      dim: ``d``, an even number of channels.
      base: the wavelength base, 10000 in the paper.

    Returns:
      ``[..., dim]`` float32.
    """
    if dim < 2 or dim % 2:
        raise ValueError(f"sinusoidal_table needs an even dim >= 2, got {dim}")
    inv_freq = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)  # [d/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [..., d/2]
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., d/2, 2]
    return table.reshape(*positions.shape, dim)  # [..., d]


@register
@dataclasses.dataclass(frozen=True)
class Sinusoidal(Encoding):
    """Fixed sinusoids added to the token embeddings.

    Attributes:
      base: wavelength base of the sinusoids (10000 in the paper).
    """

    name = "sinusoidal"
    paper = "Vaswani et al. 2017, Attention Is All You Need"
    relative = False  # positions enter the embeddings, not differences
    param_scope = "shared"

    base: float = 10000.0

    def __post_init__(self):
        check_positive("encoding.base", self.base)

    def validate(self, dims: Dims) -> None:
        if dims.model_dim % 2:
            raise ValueError(
                f"sinusoidal encoding needs an even model.model_dim, got {dims.model_dim}"
            )

    def embed(self, params: Params, positions: jax.Array) -> jax.Array:
        """``[B|1, T]`` positions -> ``[B|1, T, D]`` float32 sinusoids."""
        del params
        return sinusoidal_table(positions, self.bound_dims.model_dim, self.base)
