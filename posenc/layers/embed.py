"""Token embedding and output projection.

The table is ``[vocab, embed]`` float32, drawn from ``N(0, 1/D)``; lookups are float32 and, by
default, multiplied by ``sqrt(D)`` as in Vaswani et al., so token embeddings and sinusoids
(entries in ``[-1, 1]``) start on the same scale. The output projection is the table itself
(tied, ``x @ E^T`` in float32) or a separate ``[embed, vocab]`` matrix in the compute dtype.
A masked-LM head (BERT, RoBERTa) adds a :class:`HeadTransform` before it and a bias after it.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.layers.mlp import ACTIVATIONS
from posenc.layers.norms import make_norm
from posenc.layers.params import axes_metadata, param


class TokenEmbedding(nnx.Embed):
    """``[B, T]`` ids -> ``[B, T, D]`` float32 (times ``sqrt(D)`` when ``scale``).

    Args:
      vocab_size: ids are in ``[0, vocab_size)``.
      model_dim: ``D``.
      scale: multiply by ``sqrt(D)``.
      rngs: initialisation streams (one key).
    """

    def __init__(self, vocab_size: int, model_dim: int, *, scale: bool, rngs: nnx.Rngs):
        super().__init__(
            vocab_size,
            model_dim,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            embedding_init=nnx.initializers.normal(1.0 / math.sqrt(model_dim)),
            embedding_metadata=axes_metadata("vocab", "embed"),
            rngs=rngs,
        )
        self.scale = math.sqrt(model_dim) if scale else None

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = super().__call__(tokens)  # [B, T, D] float32
        return x if self.scale is None else x * self.scale

    def tied_logits(self, x: jax.Array) -> jax.Array:
        """``x: [B, T, D]`` float32 -> ``[B, T, V]`` float32 through the table itself."""
        return x @ self.embedding[...].T


def make_unembed(model_dim: int, vocab_size: int, dtype: jnp.dtype, rngs: nnx.Rngs) -> nnx.Linear:
    """A separate output projection ``[embed, vocab]`` (untied embeddings)."""
    return nnx.Linear(
        model_dim,
        vocab_size,
        use_bias=False,
        dtype=dtype,
        param_dtype=jnp.float32,
        kernel_metadata=axes_metadata("embed", "vocab"),
        rngs=rngs,
    )


def output_logits(
    x: jax.Array, embed: TokenEmbedding, unembed: nnx.Linear | None, dtype: jnp.dtype
) -> jax.Array:
    """``[B, T, D]`` float32 (after the final norm) -> ``[B, T, V]`` float32 logits."""
    if unembed is None:
        return embed.tied_logits(x)
    return unembed(x.astype(dtype)).astype(jnp.float32)


class HeadTransform(nnx.Module):
    """``[B, T, D]`` float32 -> ``norm(act(x W + b))`` ``[B, T, D]`` float32: the transform of
    BERT's and RoBERTa's masked-LM head, before the output projection.

    Args:
      activation: a key of :data:`posenc.layers.mlp.ACTIVATIONS`.
      model_dim: ``D``.
      norm: the norm kind; eps: its epsilon; unit_offset: its scale as ``1 + w``
        (:func:`posenc.layers.norms.make_norm`).
      dtype: compute dtype of the dense layer.
      rngs: initialisation streams.
    """

    def __init__(
        self,
        activation: str,
        model_dim: int,
        *,
        norm: str,
        eps: float,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        unit_offset: bool = False,
    ):
        self.activation = activation
        self.dense = nnx.Linear(
            model_dim,
            model_dim,
            dtype=dtype,
            param_dtype=jnp.float32,
            kernel_metadata=axes_metadata("embed", None),
            bias_metadata=axes_metadata("embed"),
            rngs=rngs,
        )
        self.norm = make_norm(norm, model_dim, eps=eps, rngs=rngs, unit_offset=unit_offset)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = ACTIVATIONS[self.activation](self.dense(x.astype(self.dense.dtype)))
        return self.norm(h.astype(jnp.float32))


def softcap_logits(logits: jax.Array, cap: float) -> jax.Array:
    """``cap * tanh(logits / cap)`` (float32; Gemma 2's ``final_logit_softcapping``): every
    logit within ``(-cap, cap)``, small ones nearly unchanged; ``cap = 0``: ``logits`` as they
    are."""
    if not cap:
        return logits
    return jnp.tanh(logits / cap) * cap


def make_output_bias(vocab_size: int) -> nnx.Param:
    """A zero-initialised bias ``[V]`` on the output logits."""
    return param(jnp.zeros((vocab_size,), jnp.float32), ("vocab",))
