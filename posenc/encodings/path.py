"""PaTH attention (Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim 2025, "PaTH Attention: Position
Encoding via Accumulating Householder Transformations", NeurIPS 2025; official code: the
``PaTHAttention`` layer and ``parallel_path_attn`` kernel of ``fla-org/flash-linear-attention``,
``fla/layers/path_attn.py`` and ``fla/ops/path_attn/``).

Each token ``t`` and head has a Householder-like map computed from the layer input ``x_t`` (the
attention's normed input, the ``x`` that gives ``q``, ``k`` and ``v``), and the logit of query
``i`` and key ``j <= i`` passes the key through every map between them::

    H_t    = I - beta_t w_t w_t^T
    w_t    = l2norm(silu(conv3(x W_down W_up))_t)       per head; conv3: causal, depthwise, size 3
    beta_t = 2 sigmoid(x_t . u + b)                     in (0, 2): eigenvalue 1 - beta in (-1, 1)
    a_ij   = softmax_j(q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(Dh))            (j = i: q_i . k_i)

The paper writes the logit as ``k_j^T (prod_{s=j+1}^{i} H_s) q_i``, the product from ``H_{j+1}``
on the left to ``H_i`` on the right, which (each ``H_s`` symmetric) is the order above: the
official decoding step applies each new token's ``H_t`` to every cached key
(``k <- k - beta_t (k . w_t) w_t``) before appending the new key untransformed, and its
reference ``naive_path_attn`` builds the same products chunk by chunk. Transcribed from the
official layer: ``W_down [D, 32]``, ``W_up [32, H Dh]`` (its default low-rank ``w_proj``; rank 0
here: one ``[D, H Dh]`` matrix, its ``use_low_rank_w=False``), no biases; a causal depthwise
convolution of size 3 without bias followed by SiLU (its ``ShortConvolution``, whose last tap
multiplies ``x_t``); L2 normalisation per head as ``w / sqrt(|w|^2 + 1e-6)`` in float32 (its
``l2_norm``); ``beta`` from ``Linear(D, H, bias=True)``. Initialisation as the official
models': every weight normal with std 0.02, biases zero (so ``beta = 1`` at first). The paper's
text names the parts (low-rank layer, filter-size-3 convolution, L2 normalisation,
``beta = 2 sigmoid``) without the SiLU or the epsilon: those come from the code.

PaTH-FoX (``forget_gate=True``): the Forgetting Transformer's gate per token and head,
``f_t = sigmoid(x_t . w_f + b_f)``, adds ``sum_{l=j+1..i} log f_l`` to the logit, exactly as
the ``forgetting`` encoder (same parameterisation and initialisation); it is this encoder's
``log_decay`` hook, so attention handles it as FoX's. posenc adds the decay *after* the
``1/sqrt(Dh)`` scale, as FoX's paper and code and posenc's ``forgetting`` do; the fla PaTH kernel
multiplies the decay by the softmax scale too (``(q^T P k + c_i - c_j) * scale``), which is the
same family of models with the gate's log scaled by ``1/sqrt(Dh)``. So PaTH-FoX with ``beta = 0``
is posenc's ``forgetting`` exactly, and PaTH with ``beta = 0`` is NoPE.

PaTH reads no positions (``relative = True``) and is causal (``causal_only``: the products run
from a key forward to its query). Attention computes the products through the ``householder``
hook (:mod:`posenc.encodings.base`; :mod:`posenc.attention.householder` for the algorithm:
compact products per chunk, queries carried from the last key tile to the first), on the
``einsum`` and ``blocked`` paths; the fused kernels and linear attention refuse it. A key/value
cache reproduces a full pass (``cacheable``): it keeps each token's raw key and layer input, and
each step recomputes the products from the layer inputs of the filled slots, where the official
decoder updates the cached keys in place (the same logits; a step costs ``O(S (C + Dh) Dh)``
here instead of ``O(S Dh)``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.registry import register

_L2_EPS = 1e-6  # fla's l2_norm: w / sqrt(sum w^2 + eps)


@register
@dataclasses.dataclass(frozen=True)
class PaTH(Encoding):
    """Data-dependent Householder products between each key and its query, one set of
    projections per layer.

    Attributes:
      forget_gate: PaTH-FoX: add the Forgetting Transformer's decay (a ``log_decay`` hook).
      rank: the inner width of the low-rank projection giving ``w`` (the official 32); 0: one
        full ``[D, H Dh]`` projection.
      conv_size: the causal short convolution's width over ``w`` (the official 3); 0: none (and
        no SiLU).
      init_std: standard deviation of the normal initialiser of every weight (the official 0.02).
    """

    name = "path"
    paper = (
        "Yang, Shen, Wen, Tan, Mishra, Ren, Panda, Kim 2025, PaTH Attention: Position Encoding "
        "via Accumulating Householder Transformations (NeurIPS 2025)"
    )
    relative = True  # the maps come from the content between j and i; positions are never read
    causal_only = True  # the products run from a key forward to its query

    forget_gate: bool = False
    rank: int = 32
    conv_size: int = 3
    init_std: float = 0.02

    def __post_init__(self):
        if not isinstance(self.forget_gate, bool):
            got = self.forget_gate
            raise ValueError(f"encoding.forget_gate must be True or False, got {got!r}")
        for field in ("rank", "conv_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"encoding.{field} must be an integer >= 0, got {value!r}")
        check_positive("encoding.init_std", self.init_std, allow_zero=True)

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        width, d, h = dims.num_heads * dims.head_dim, dims.model_dim, dims.num_heads
        shapes: dict[str, tuple[int, ...]] = {}
        if self.rank:
            shapes.update(w_down=(d, self.rank), w_up=(self.rank, width))
        else:
            shapes["w_proj"] = (d, width)
        if self.conv_size:
            shapes["conv"] = (self.conv_size, width)  # tap m multiplies x_{t - size + 1 + m}
        shapes.update(beta_w=(d, h), beta_b=(h,))
        if self.forget_gate:
            shapes.update(gate_w=(d, h), gate_b=(h,))
        return shapes

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        axes = {"beta_w": ("embed", "heads"), "beta_b": ("heads",)}
        if self.forget_gate:
            axes.update(gate_w=("embed", "heads"), gate_b=("heads",))
        return axes

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        keys = jax.random.split(rng, len(shapes))
        out = {}
        for key, (name, shape) in zip(keys, shapes.items(), strict=True):
            if name.endswith("_b"):
                out[name] = jnp.zeros(shape, jnp.float32)
            else:
                out[name] = (self.init_std * jax.random.normal(key, shape)).astype(jnp.float32)
        return out

    def householder(self, params: Params, inputs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``w`` (unit per head, up to the epsilon) and ``beta`` of ``H_t = I - beta_t w_t
        w_t^T``: ``[B, S, D]`` -> ``[B, S, H, Dh]``, ``[B, S, H]`` float32. Entry ``t`` reads
        ``inputs`` at ``t`` and the ``conv_size - 1`` tokens before it."""
        dims = self.bound_dims
        x = inputs.astype(jnp.float32)
        if self.rank:
            w = x @ params["w_down"] @ params["w_up"]  # [B, S, H Dh]
        else:
            w = x @ params["w_proj"]
        if self.conv_size:
            taps = params["conv"]
            size = self.conv_size
            padded = jnp.pad(w, ((0, 0), (size - 1, 0), (0, 0)))
            s = w.shape[1]
            w = sum(padded[:, m : m + s] * taps[m] for m in range(size))
            w = jax.nn.silu(w)
        w = w.reshape(*w.shape[:2], dims.num_heads, dims.head_dim)
        w = w / jnp.sqrt(jnp.sum(w * w, axis=-1, keepdims=True) + _L2_EPS)
        beta = 2.0 * jax.nn.sigmoid(x @ params["beta_w"] + params["beta_b"])  # [B, S, H]
        return w, beta

    @property
    def log_decay(self):
        # PaTH-FoX only: attention checks for the hook.
        return self._log_decay if self.forget_gate else None

    def _log_decay(self, params: Params, inputs: jax.Array) -> jax.Array:
        """FoX's ``log f_t = log sigmoid(w_f . x_t + b_f)``: ``[B, S, D]`` -> ``[B, S, H]``."""
        x = inputs.astype(jnp.float32)
        return jax.nn.log_sigmoid(x @ params["gate_w"] + params["gate_b"])
