"""Learned absolute position embeddings (as in GPT-2 / BERT; Vaswani et al. 2017 compare them)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register


@register
@dataclasses.dataclass(frozen=True)
class Learned(Encoding):
    """A learned table of ``max_len`` position vectors added to the token embeddings.

    The table has no row for positions ``>= max_len``: :meth:`check_length` refuses such lengths
    before anything is compiled, and positions passed explicitly beyond the table embed as NaN
    (which then spreads through attention to the whole window: loud, never silently wrong).

    Attributes:
      max_len: rows of the table, i.e. the longest sequence the model can read.
      init_std: standard deviation of the normal initialiser.
    """

    name = "learned"
    paper = "Learned absolute positions (Gehring et al. 2017; Vaswani et al. 2017, Table 3)"
    relative = False  # positions enter the embeddings, not differences
    param_scope = "shared"

    max_len: int = 2048
    init_std: float = 0.02

    def __post_init__(self):
        if not isinstance(self.max_len, int) or self.max_len < 1:
            raise ValueError(f"encoding.max_len must be a positive integer, got {self.max_len!r}")

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        return {"table": (self.max_len, dims.model_dim)}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        (shape,) = self.param_shapes(dims).values()
        table = self.init_std * jax.random.normal(rng, shape)
        return {"table": table.astype(jnp.float32)}

    def check_length(self, length: int) -> None:
        if length > self.max_len:
            raise ValueError(
                "the learned absolute encoding has a table of "
                f"encoding.hparams.max_len={self.max_len} positions and cannot embed a sequence "
                f"of {length} tokens; raise encoding.hparams.max_len (and retrain) or evaluate "
                "at lengths <= max_len"
            )

    def embed(self, params: Params, positions: jax.Array) -> jax.Array:
        """``[B|1, T]`` positions -> ``[B|1, T, D]`` rows of the table (NaN beyond it)."""
        table = params["table"]
        # take() wraps negative indices before "fill" applies; send them past the end instead.
        positions = jnp.where(positions < 0, table.shape[0], positions)
        return jnp.take(table, positions, axis=0, mode="fill", fill_value=jnp.nan)
