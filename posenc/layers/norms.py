"""Normalisation layers: LayerNorm (with or without its bias) or RMSNorm, in float32 whatever the
compute dtype."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from posenc.layers.params import axes_metadata

# "layernorm_nobias": the mean removed and a learned scale, no bias (Cohere's LayerNorm).
NORMS = ("layernorm", "rmsnorm", "layernorm_nobias")


def make_norm(kind: str, dim: int, *, eps: float, rngs: nnx.Rngs) -> nnx.Module:
    """A norm over the last axis of width ``dim``, parameters and arithmetic in float32.

    Args:
      kind: ``"layernorm"`` (scale and bias, mean removed), ``"rmsnorm"`` (scale only, no mean
        removed) or ``"layernorm_nobias"`` (mean removed, scale only: Cohere's).
      dim: the normalised width.
      eps: added to the variance (``1e-6`` by default in posenc; Hugging Face configs state
        theirs, e.g. GPT-2's ``layer_norm_epsilon=1e-5``).
      rngs: initialisation streams (the norms draw keys, so the order of construction fixes
        every later parameter).
    """
    if kind not in NORMS:
        raise ValueError(f"model.norm must be one of {list(NORMS)}, got {kind!r}")
    cls = nnx.RMSNorm if kind == "rmsnorm" else nnx.LayerNorm
    axes = dict(scale_metadata=axes_metadata("embed"))
    if kind == "layernorm":
        axes["bias_metadata"] = axes_metadata("embed")
    if kind == "layernorm_nobias":
        axes["use_bias"] = False
    return cls(dim, epsilon=eps, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs, **axes)
