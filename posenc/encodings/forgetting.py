"""The Forgetting Transformer's forget gate, FoX (Lin, Nikishin, He, Courville 2025, "Forgetting
Transformer: Softmax Attention with a Forget Gate", ICLR 2025).

Each token ``t`` and head ``h`` has a scalar forget gate computed from the layer input ``x_t``
(the attention's normed input, the same ``x`` that gives ``q``, ``k`` and ``v``), and the logit of
query ``i`` and key ``j <= i`` is decayed by the product of the gates between them::

    f_t  = sigmoid(w_f . x_t + b_f)                     w_f: [D, H], b_f: [H]
    D_ij = sum_{l=j+1..i} log f_l = c_i - c_j,          c_t = sum_{l<=t} log f_l
    a_ij = softmax_j(q_i . k_j / sqrt(Dh) + D_ij)

The paper's ``O = softmax(Q K^T + D) V`` with ``D_ij = log F_ij``, and its official code
(``forgetting-transformer``: ``fgate_proj = Linear(hidden_size, num_heads, bias=True)`` on the
block's normed input, ``log_fgate = logsigmoid(...)`` in float32, ``c = cumsum(log_fgate)`` and
``c_i - c_j`` added to ``q . k * sm_scale`` inside the kernel); x-transformers'
``DataDependentAlibi`` is the same construction. Initialisation follows the official code:
``w_f`` normal with std 0.02, ``b_f`` zeros. This is the gate alone, FoX (LLaMA) in the paper's
terms; the "Pro" block's output gate, QK-norm and key/value shift are architecture, not position.

FoX reads no positions: ``D_ij`` depends on the content between ``j`` and ``i``, so shifting
positions changes nothing (``relative = True``). It is a ``log_decay`` hook
(:mod:`posenc.encodings.base`): attention sums the log gates once per window and adds
``c_i - c_j`` as a float32 bias on every path (a dense bias on the fused kernels, per tile on the
``blocked`` path). ``c_i`` is constant along a row and changes no probability; subtracting it,
as the official kernel does, keeps the logits near the diagonal small, where float32 resolves them.
FoX is causal: it defines no decay for keys after the query (``attend(causal=False)`` would add
``c_i - c_j > 0`` there), so it declares ``causal_only`` and the model refuses it with
``model.causal=False``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params, check_positive
from posenc.encodings.registry import register


@register
@dataclasses.dataclass(frozen=True)
class Forgetting(Encoding):
    """A data-dependent forget gate per token and head, one projection per layer.

    Attributes:
      init_std: standard deviation of the normal initialiser of ``w_f`` (the official code's 0.02).
      bias_init: initial ``b_f`` (the official code's 0, so ``f ~ 1/2`` at first; x-transformers
        starts at 5, ``f ~ 0.993``, forgetting slowly).
    """

    name = "forgetting"
    paper = (
        "Lin, Nikishin, He, Courville 2025, Forgetting Transformer: Softmax Attention with a "
        "Forget Gate (ICLR 2025)"
    )
    relative = True  # the decay depends on the content between j and i, never on positions
    causal_only = True  # no decay is defined for keys after the query

    init_std: float = 0.02
    bias_init: float = 0.0

    def __post_init__(self):
        check_positive("encoding.init_std", self.init_std, allow_zero=True)
        if not isinstance(self.bias_init, int | float) or isinstance(self.bias_init, bool):
            raise ValueError(f"encoding.bias_init must be a number, got {self.bias_init!r}")

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        return {"w": (dims.model_dim, dims.num_heads), "b": (dims.num_heads,)}

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        return {"w": ("embed", "heads"), "b": ("heads",)}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        w = self.init_std * jax.random.normal(rng, shapes["w"])
        return {"w": w.astype(jnp.float32), "b": jnp.full(shapes["b"], self.bias_init, jnp.float32)}

    def log_decay(self, params: Params, inputs: jax.Array) -> jax.Array:
        """``log f_t = log sigmoid(w_f . x_t + b_f)``: ``[B, S, D]`` -> ``[B, S, H]`` float32."""
        x = inputs.astype(jnp.float32)
        logits = jnp.einsum("BSD,DH->BSH", x, params["w"]) + params["b"]
        return jax.nn.log_sigmoid(logits)
