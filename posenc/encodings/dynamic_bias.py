"""Dynamic position bias: a small MLP of the relative distance gives each head's bias, as
x-transformers' ``DynamicPositionBias`` (lucidrains/x-transformers, ``x_transformers.py``; the
idea from CrossFormer, Wang et al. 2021, and SwinV2's log-spaced continuous position bias, Liu et
al. 2022).

For query ``i`` and key ``j`` the scaled logit gets ``f(d)[h]`` with ``d = i - j`` (positive for
the keys a causal query sees), or ``d = sign(i - j) * log(|i - j| + 1)`` with ``log_distance``::

    f = Linear(1, dim) -> [LayerNorm] -> SiLU
        -> (depth - 1) x (Linear(dim, dim) -> [LayerNorm] -> SiLU)
        -> Linear(dim, H)

What follows x-transformers (``DynamicPositionBias`` and its use in ``AttentionLayers``):

- hyperparameters named as there: ``depth`` (``dynamic_pos_bias_mlp_depth = 2``), ``dim`` (the
  MLP width, ``model_dim // 4`` by default), ``log_distance`` and ``norm`` (both False);
- with ``norm``, the first layer's norm is x-transformers' bias-free ``LayerNorm`` (a learned
  scale), the others ``nn.LayerNorm`` (scale and shift), ``eps = 1e-5``;
- one MLP for the whole model: ``AttentionLayers`` builds one ``rel_pos`` and passes it to
  every layer (``param_scope = "shared"``);
- PyTorch's default ``nn.Linear`` initialisation, ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for
  weights and biases; norm scales 1, shifts 0;
- the bias is added after the ``1/sqrt(Dh)`` scaling (``Attend``: ``sim = sim * scale``, then
  ``sim + attn_bias``); bidirectional attention uses the same signed ``d`` (keys after the query
  have ``d < 0``), as x-transformers does.

Like x-transformers, the MLP runs once per distinct distance, not per pair: for contiguous
positions (every training and evaluation window, every tile of the blocked path) the ``T + S``
offsets of the relative table (:func:`~posenc.encodings.relative.relative_offsets`) go through
the MLP and :func:`~posenc.encodings.relative.rel_shift` lays them out as ``[T, S]``; any other
positions (randomized positions) run the MLP on each pair. ``jax.lax.cond`` picks at run time.
Nothing ``L x L`` is stored.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, torch_linear_init
from posenc.encodings.registry import register
from posenc.encodings.relative import (
    is_contiguous,
    pairwise_offsets,
    rel_shift,
    relative_offsets,
)

_LN_EPS = 1e-5  # torch.nn.LayerNorm's default


def _layer_norm(x: jax.Array) -> jax.Array:
    """Normalises the last axis to zero mean, unit (biased) variance, without affine terms."""
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + _LN_EPS)


@register
@dataclasses.dataclass(frozen=True)
class DynamicPositionBias(Encoding):
    """An MLP of the (optionally log-scaled) distance ``i - j``, one output per head, shared by
    all layers.

    Attributes:
      depth: number of ``Linear -> [LayerNorm] -> SiLU`` layers before the output layer (>= 1).
      dim: the MLP width; None for ``model_dim // 4`` (x-transformers' choice).
      log_distance: feed ``sign(d) * log(|d| + 1)`` instead of ``d`` (as SwinV2).
      norm: a LayerNorm after each hidden linear layer.
    """

    name = "dynamic_bias"
    paper = (
        "x-transformers DynamicPositionBias (lucidrains), after CrossFormer (Wang et al. 2021) "
        "and SwinV2 (Liu et al. 2022)"
    )
    relative = True
    param_scope = "shared"
    bias_by_distance = True  # an MLP of i - j

    depth: int = 2
    dim: int | None = None
    log_distance: bool = False
    norm: bool = False

    def __post_init__(self):
        if not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 1:
            raise ValueError(f"encoding.depth must be an integer >= 1, got {self.depth!r}")
        if self.dim is not None and (
            not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 1
        ):
            raise ValueError(f"encoding.dim must be a positive integer or None, got {self.dim!r}")
        for field in ("log_distance", "norm"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"encoding.{field} must be True or False")

    def width(self, dims: Dims) -> int:
        """The MLP width: ``dim``, or ``model_dim // 4``."""
        return self.dim if self.dim is not None else dims.model_dim // 4

    def validate(self, dims: Dims) -> None:
        if self.width(dims) < 1:
            raise ValueError(
                f"encoding dynamic_bias: the MLP width model_dim // 4 is 0 for model_dim="
                f"{dims.model_dim}; set encoding.hparams.dim"
            )

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        w = self.width(dims)
        shapes = {"in_w": (w,), "in_b": (w,)}  # Linear(1, dim): one input
        if self.norm:
            shapes["in_norm_scale"] = (w,)
        for layer in range(1, self.depth):
            shapes[f"hidden{layer}_w"] = (w, w)
            shapes[f"hidden{layer}_b"] = (w,)
            if self.norm:
                shapes[f"hidden{layer}_norm_scale"] = (w,)
                shapes[f"hidden{layer}_norm_bias"] = (w,)
        shapes["out_w"] = (w, dims.num_heads)
        shapes["out_b"] = (dims.num_heads,)
        return shapes

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        keys = dict(zip(shapes, jax.random.split(rng, len(shapes)), strict=True))
        params = {}
        for name, shape in shapes.items():
            if name.endswith("norm_scale"):
                params[name] = jnp.ones(shape, jnp.float32)
            elif name.endswith("norm_bias"):
                params[name] = jnp.zeros(shape, jnp.float32)
            else:
                fan_in = 1 if name.startswith("in_") else self.width(dims)
                params[name] = torch_linear_init(keys[name], shape, fan_in)
        return params

    def mlp(self, params: Params, distance: jax.Array) -> jax.Array:
        """``f`` on signed distances ``i - j``: ``[...]`` integers -> ``[..., H]`` float32."""
        p = {n: jnp.asarray(x, jnp.float32) for n, x in params.items()}
        d = distance.astype(jnp.float32)
        if self.log_distance:
            d = jnp.sign(d) * jnp.log(jnp.abs(d) + 1.0)
        x = d[..., None] * p["in_w"] + p["in_b"]  # [..., dim]
        if self.norm:
            x = _layer_norm(x) * p["in_norm_scale"]
        x = jax.nn.silu(x)
        for layer in range(1, self.depth):
            x = x @ p[f"hidden{layer}_w"] + p[f"hidden{layer}_b"]
            if self.norm:
                x = _layer_norm(x) * p[f"hidden{layer}_norm_scale"]
                x = x + p[f"hidden{layer}_norm_bias"]
            x = jax.nn.silu(x)
        return x @ p["out_w"] + p["out_b"]  # [..., H]

    def bias(self, params: Params, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """``[B|1, T]``, ``[B|1, S]`` positions -> ``[B|1, H, T, S]`` float32 logits."""
        t, s = q_pos.shape[-1], k_pos.shape[-1]

        def per_offset(_):
            # Column r of the relative table holds k - q = (k0 - q0) + r - (T - 1).
            table = self.mlp(params, -relative_offsets(q_pos, k_pos))  # [B|1, T + S, H]
            table = jnp.moveaxis(table, -1, 1)[:, :, None, :]  # [B|1, H, 1, T + S]
            b, h = table.shape[:2]
            return rel_shift(jnp.broadcast_to(table, (b, h, t, t + s)))  # [B|1, H, T, S]

        def per_pair(_):
            out = self.mlp(params, -pairwise_offsets(q_pos, k_pos))  # [B|1, T, S, H]
            return jnp.moveaxis(out, -1, 1)  # [B|1, H, T, S]

        return jax.lax.cond(is_contiguous(q_pos, k_pos), per_offset, per_pair, None)
