"""The feed-forward sublayer, by kind.

=============  ====================================  ========================================
kind           computes                              used by
=============  ====================================  ========================================
``gelu``       ``W_o gelu_tanh(W_i x)``              posenc's default, GPT-2, GPT-NeoX
``gelu_exact`` ``W_o gelu_erf(W_i x)``               BERT, RoBERTa
``relu``       ``W_o relu(W_i x)``                   Vaswani et al., T5 v1.0
``swiglu``     ``W_o (silu(W_g x) * W_i x)``         LLaMA, Mistral, Qwen (Shazeer 2020)
``geglu``      ``W_o (gelu_tanh(W_g x) * W_i x)``    T5 v1.1 / Flan-T5 (Shazeer 2020)
=============  ====================================  ========================================

``gelu_tanh`` is the tanh approximation (``jax.nn.gelu(approximate=True)``, Hugging Face's
``gelu_new``/``gelu_pytorch_tanh``); ``gelu_erf`` the exact one. Matmuls run in the compute dtype;
the output is in the compute dtype too (the block adds it to the float32 residual stream).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.layers.params import axes_metadata

MLP_KINDS = ("gelu", "gelu_exact", "relu", "swiglu", "geglu")
_GATED = {"swiglu": jax.nn.silu, "geglu": lambda x: jax.nn.gelu(x, approximate=True)}
# The activations of the plain kinds (also the choices of ``ModelConfig.head_transform``).
ACTIVATIONS = _PLAIN = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
}


class Mlp(nnx.Module):
    """``[.., D] -> [.., D]``: ``wi`` (and ``wg`` for the gated kinds) then ``wo``.

    Args:
      kind: one of :data:`MLP_KINDS`.
      model_dim: ``D``.
      mlp_dim: the hidden width.
      use_bias: biases on every projection.
      dtype: compute dtype.
      rngs: initialisation streams.
    """

    def __init__(
        self,
        kind: str,
        model_dim: int,
        mlp_dim: int,
        *,
        use_bias: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        if kind not in MLP_KINDS:
            raise ValueError(f"model.mlp must be one of {list(MLP_KINDS)}, got {kind!r}")
        self.kind = kind

        def dense(n_in, n_out, axes):
            return nnx.Linear(
                n_in,
                n_out,
                use_bias=use_bias,
                dtype=dtype,
                param_dtype=jnp.float32,
                kernel_metadata=axes_metadata(*axes),
                bias_metadata=axes_metadata(axes[1]),
                rngs=rngs,
            )

        self.wi = dense(model_dim, mlp_dim, ("embed", "mlp"))
        self.wg = dense(model_dim, mlp_dim, ("embed", "mlp")) if kind in _GATED else None
        self.wo = dense(mlp_dim, model_dim, ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.wg is None:
            return self.wo(_PLAIN[self.kind](self.wi(x)))
        return self.wo(_GATED[self.kind](self.wg(x)) * self.wi(x))
