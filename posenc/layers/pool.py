"""A pooled output head for sequence classification and regression, and segment embeddings.

BERT (Devlin et al. 2019, Sec. 3) classifies a sequence from the final state of its first token
(``[CLS]``) passed through a "pooler" (a dense layer with tanh), then a linear layer to the
classes; sentence pairs are one sequence ``[CLS] a [SEP] b [SEP]`` whose tokens also get a
segment embedding (A or B). Mean pooling over the real tokens (Sentence-BERT's choice) is the
other common reading of a sequence. Both are here; the head knows nothing of the stack below it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.layers.params import axes_metadata

POOLS = ("first", "mean")


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """What the classifier adds to the shared parts.

    Attributes:
      num_labels: classes; 1 is a regression (one real output, squared-error loss), as Hugging
        Face's sequence-classification heads read ``num_labels == 1``.
      pool: ``"first"`` (the first token's state, BERT's ``[CLS]``) or ``"mean"`` (the mean over
        the real tokens).
      num_segments: segment (token type) ids, 2 for BERT's sentence pairs; 0: no segment
        embedding.
      pooler: BERT's dense + tanh layer between the pooled state and the output layer.
    """

    num_labels: int = 2
    pool: str = "first"
    num_segments: int = 2
    pooler: bool = True

    def __post_init__(self):
        if (
            not isinstance(self.num_labels, int)
            or isinstance(self.num_labels, bool)
            or self.num_labels < 1
        ):
            raise ValueError(f"model.num_labels must be an integer >= 1, got {self.num_labels!r}")
        if self.pool not in POOLS:
            raise ValueError(f"model.pool must be one of {list(POOLS)}, got {self.pool!r}")
        if not isinstance(self.num_segments, int) or not 0 <= self.num_segments:
            raise ValueError(
                f"model.num_segments must be an integer >= 0, got {self.num_segments!r}"
            )
        if not isinstance(self.pooler, bool):
            raise ValueError(f"model.pooler must be True or False, got {self.pooler!r}")

    @property
    def regression(self) -> bool:
        return self.num_labels == 1


def pool(x: jax.Array, mask: jax.Array, kind: str) -> jax.Array:
    """``x [B, T, D]`` float32 over real tokens ``mask [B, T]`` -> ``[B, D]``: the first
    token's state, or the mean over the real tokens."""
    if kind == "first":
        return x[:, 0]
    weights = mask.astype(x.dtype)[:, :, None]  # [B, T, 1]
    return (x * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1.0)


class PooledHead(nnx.Module):
    """Pooling, BERT's pooler (optional) and the output layer: ``[B, T, D] -> [B, labels]``.

    Args:
      model_dim: ``D``.
      config: the head's options.
      dtype: compute dtype of the dense layers (parameters float32, outputs float32).
      rngs: initialisation streams.
    """

    def __init__(self, model_dim: int, config: HeadConfig, dtype: jnp.dtype, *, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(1.0 / math.sqrt(model_dim))
        self.pooler = (
            nnx.Linear(
                model_dim,
                model_dim,
                dtype=dtype,
                param_dtype=jnp.float32,
                kernel_init=init,
                kernel_metadata=axes_metadata("embed", "mlp"),
                rngs=rngs,
            )
            if config.pooler
            else None
        )
        self.out = nnx.Linear(
            model_dim,
            config.num_labels,
            dtype=dtype,
            param_dtype=jnp.float32,
            kernel_init=init,
            kernel_metadata=axes_metadata("embed", None),
            rngs=rngs,
        )

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """``x [B, T, D]`` float32 (after the final norm), ``mask [B, T]`` bool ->
        ``[B, num_labels]`` float32 logits (a regression: ``[B, 1]`` predictions)."""
        h = pool(x, mask, self.config.pool)  # [B, D]
        if self.pooler is not None:
            h = jnp.tanh(self.pooler(h).astype(jnp.float32))
        return self.out(h).astype(jnp.float32)


class SegmentEmbedding(nnx.Embed):
    """BERT's token-type embedding: ``[B, T]`` segment ids -> ``[B, T, D]`` float32, added to
    the token embeddings (segment 0: ``[CLS] a [SEP]``, segment 1: ``b [SEP]``).

    Drawn from ``N(0, 1/D)`` like the token table, so that with the token embeddings scaled by
    ``sqrt(D)`` it starts as a small term beside them.
    """

    def __init__(self, num_segments: int, model_dim: int, *, rngs: nnx.Rngs):
        super().__init__(
            num_segments,
            model_dim,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            embedding_init=nnx.initializers.normal(1.0 / math.sqrt(model_dim)),
            embedding_metadata=axes_metadata(None, "embed"),
            rngs=rngs,
        )
