"""Parameters with logical axis names, and the positional encoder's parameters as NNX state.

Every parameter a layer makes carries the names of its axes (``embed``, ``heads``, ``kv_heads``,
``head_dim``, ``mlp``, ``vocab``) as the metadata ``axes``; :mod:`posenc.devices.sharding` alone
maps them to mesh axes. Encoder parameters (:class:`EncoderParam`) carry the names their encoder
declares (``Encoding.param_axes``: Transformer-XL's ``W_kR`` is ``[embed, heads, head_dim]``
like a projection); those it does not name are replicated.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.attention.options import AttentionOptions
from posenc.encodings.base import Encoding, Params

# Metadata key of a parameter's logical axis names.
AXES = "axes"


def param(value: jax.Array, axes: Sequence[str | None]) -> nnx.Param:
    """``value`` as an :class:`nnx.Param` whose axes are named ``axes`` (one name per axis)."""
    if len(axes) != value.ndim:
        raise ValueError(f"param of shape {value.shape} needs {value.ndim} axis names, got {axes}")
    return nnx.Param(value, **{AXES: tuple(axes)})


def axes_metadata(*axes: str | None) -> dict[str, tuple[str | None, ...]]:
    """``kernel_metadata``/``embedding_metadata`` for Flax's own layers."""
    return {AXES: tuple(axes)}


class EncoderParam(nnx.Param):
    """A positional encoder's learned parameter (T5's table, Shaw's embeddings, XL's u and v).

    A type of its own so that code above the model can tell encoder parameters apart without
    knowing attribute names: the optimizer, for one, does not decay them.
    """


def encoder_params(encoding: Encoding, rngs: nnx.Rngs) -> nnx.Dict:
    """The encoder's ``init`` (one key from ``rngs.params``) held as :class:`EncoderParam` s,
    with the axis names the encoder declares (``param_axes``)."""
    params = encoding.init(rngs.params(), encoding.bound_dims)
    axes = encoding.param_axes()
    if set(axes) - set(params):
        raise ValueError(
            f"encoding {encoding.name!r}: param_axes names {sorted(set(axes) - set(params))}, "
            f"which init does not return (it returns {sorted(params)})"
        )
    held = {}
    for name, value in params.items():
        if name in axes and len(axes[name]) != value.ndim:
            raise ValueError(
                f"encoding {encoding.name!r}: param_axes names {len(axes[name])} axes for "
                f"{name!r}, which has shape {value.shape}"
            )
        held[name] = EncoderParam(value, **({AXES: tuple(axes[name])} if name in axes else {}))
    return nnx.Dict(held)


def values(params: nnx.Dict | None) -> Params:
    """The plain arrays of :func:`encoder_params` (``{}`` for None), as the hooks take them."""
    return {} if params is None else {name: p[...] for name, p in params.items()}


# The logical axes of the attention options' parameters.
_OPTION_AXES = {
    "q_norm": ("head_dim",),
    "k_norm": ("head_dim",),
    "sinks": ("heads",),
    "ssmax": ("heads",),
}


# QK-norm's scales over all heads together (``[H * Dh]``, ``[KV * Dh]``): replicated, as the norm
# reads every head of a token.
_ALL_HEADS_AXES = (None,)
# The options' parameters that are norm scales (stored as ``w`` of ``1 + w`` with
# ``ModelConfig.norm_unit_offset``).
NORM_SCALES = ("q_norm", "k_norm")


def option_params(
    options: AttentionOptions,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int | None = None,
    unit_offset: bool = False,
) -> nnx.Dict | None:
    """The learned parameters of a layer's attention options (QK-norm scales, sink logits,
    Scalable-Softmax's ``s``) at their initial values, float32; None when there are none.
    ``num_kv_heads`` sizes the keys' scale of ``qk_norm="rms_all_heads"``; ``unit_offset``
    stores QK-norm's scales as the offset from 1 (initially 0: ``ModelConfig.norm_unit_offset``)."""
    learned = options.learned(num_heads, head_dim, num_kv_heads)
    if not learned:
        return None
    out = {}
    for name, (shape, value) in learned.items():
        axes = _OPTION_AXES[name]
        if name in NORM_SCALES:
            value = value - 1.0 if unit_offset else value
            axes = _ALL_HEADS_AXES if options.qk_norm == "rms_all_heads" else axes
        out[name] = param(jnp.full(shape, value, jnp.float32), axes)
    return nnx.Dict(out)
