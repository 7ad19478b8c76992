"""Normalisation layers: LayerNorm (with or without its bias) or RMSNorm, in float32 whatever
the compute dtype.

With a unit offset (``ModelConfig.norm_unit_offset``) the norm multiplies by ``1 + scale``
instead of ``scale``, the parameter starting at 0 (Gemma's RMSNorm): the same functions, with
the parameter stored as the offset from the identity (what weight decay pulls toward, and what
Gemma's checkpoints hold).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.layers.params import axes_metadata, param

if TYPE_CHECKING:
    from posenc.layers.config import ModelConfig

# "layernorm_nobias": the mean removed and a learned scale, no bias (Cohere's LayerNorm).
NORMS = ("layernorm", "rmsnorm", "layernorm_nobias")


class UnitOffsetNorm(nnx.Module):
    """``[.., dim] -> [.., dim]`` float32: ``x_hat * (1 + scale) (+ bias)`` with ``x_hat`` the
    input over its root mean square (``"rmsnorm"``) or, mean removed, its standard deviation
    (``"layernorm"``; ``"layernorm_nobias"`` without the bias), ``eps`` added to the mean
    square; ``scale`` (and ``bias``) start at 0.

    Arithmetic in float32 in Gemma's order: normalise, then multiply by ``1 + scale``
    (``1 + scale`` rounded to float32 first, as transformers' ``Gemma2RMSNorm`` computes it).
    """

    def __init__(self, kind: str, dim: int, *, eps: float):
        self.kind = kind
        self.eps = eps
        self.scale = param(jnp.zeros((dim,), jnp.float32), ("embed",))
        zeros = jnp.zeros((dim,), jnp.float32)
        self.bias = param(zeros, ("embed",)) if kind == "layernorm" else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        if self.kind != "rmsnorm":  # "layernorm", "layernorm_nobias": mean removed
            x = x - jnp.mean(x, axis=-1, keepdims=True)
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        y = y * (1.0 + self.scale[...])
        return y if self.bias is None else y + self.bias[...]


def model_norm(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    """A norm over the residual stream as the model's options say (``model.norm``,
    ``norm_eps``, ``norm_unit_offset``): every block's and the final one."""
    return make_norm(
        config.norm,
        config.model_dim,
        eps=config.norm_eps,
        rngs=rngs,
        unit_offset=config.norm_unit_offset,
    )


def make_norm(
    kind: str, dim: int, *, eps: float, rngs: nnx.Rngs, unit_offset: bool = False
) -> nnx.Module:
    """A norm over the last axis of width ``dim``, parameters and arithmetic in float32.

    Args:
      kind: ``"layernorm"`` (scale and bias, mean removed), ``"rmsnorm"`` (scale only, no mean
        removed) or ``"layernorm_nobias"`` (mean removed, scale only: Cohere's).
      dim: the normalised width.
      eps: added to the variance (``1e-6`` by default in posenc; Hugging Face configs state
        theirs, e.g. GPT-2's ``layer_norm_epsilon=1e-5``).
      rngs: initialisation streams (the norms draw keys, so the order of construction fixes
        every later parameter).
      unit_offset: multiply by ``1 + scale``, the scale starting at 0 (:class:`UnitOffsetNorm`,
        which draws no key).
    """
    if kind not in NORMS:
        raise ValueError(f"model.norm must be one of {list(NORMS)}, got {kind!r}")
    if unit_offset:
        return UnitOffsetNorm(kind, dim, eps=eps)
    cls = nnx.RMSNorm if kind == "rmsnorm" else nnx.LayerNorm
    axes = dict(scale_metadata=axes_metadata("embed"))
    if kind == "layernorm":
        axes["bias_metadata"] = axes_metadata("embed")
    if kind == "layernorm_nobias":
        axes["use_bias"] = False
    return cls(dim, epsilon=eps, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs, **axes)
