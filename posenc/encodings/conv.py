"""Convolutional position information (Baevski, Zhou, Mohamed, Auli 2020, "wav2vec 2.0: A
Framework for Self-Supervised Learning of Speech Representations", Sec. 2, "relative positional
embedding").

Instead of an embedding of positions, a grouped 1-D convolution over the input embeddings,
followed by a GELU, is added to them::

    x'_t = x_t + GELU( b + sum_{m=0}^{K-1} W_m x_{t - K + 1 + m} )       (causal, the default)

with ``W_m`` block diagonal over ``groups`` groups of ``D / groups`` channels (the paper's kernel
``K = 128`` and 16 groups on 768 channels), zero padding outside the window, and the exact
(erf) GELU of the paper's code (``nn.GELU()``). The convolution is cross-correlation, as
PyTorch's ``Conv1d``: ``W_m`` multiplies the input ``K - 1 - m`` tokens back.

Causal by default (``causal=True``): only left padding, so position ``t`` sees tokens ``t - K +
1 .. t``, which a language model needs. ``causal=False`` is wav2vec 2.0's centred convolution
(padding ``K // 2`` on both sides and, for an even ``K``, the last output dropped, the code's
``SamePad``): position ``t`` sees ``t - K // 2 .. t + K - 1 - K // 2``. A causal model
(``model.causal=True``) refuses it (it would see later tokens); a bidirectional model takes
either.

The term is computed by the ``embed_tokens`` hook from the token embeddings (before any
absolute term), once per window, in float32. It ignores position values: the convolution runs
over the order of the tokens in the window, so shifting positions changes nothing (declared
``relative = True``, which the battery's shift check confirms) and randomized positions (Ruoss
et al. 2023) have no effect on it. Attention itself is position-free (NoPE) apart from this
term.

Choices: no weight normalisation (wav2vec 2.0's code wraps the convolution in
``weight_norm(dim=2)``, a reparametrisation of the same function; the paper does not mention
it); the weights are initialised as that code does, normal with standard deviation
``sqrt(4 / (K * D))``, the bias at zero. Defaults are scaled for posenc's tiny models
(``kernel_size=16``, ``groups=4``); the paper's are 128 and 16.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register


def grouped_conv(
    x: jax.Array, weight: jax.Array, bias: jax.Array, groups: int, causal: bool
) -> jax.Array:
    """The convolution alone (before the GELU): ``x: [B, T, D]``, ``weight: [K, D / groups, D]``
    (tap, input channel within the group, output channel), ``bias: [D]`` -> ``[B, T, D]``.

    Output channel ``o`` reads the input channels of its group ``o // (D / groups)``.
    """
    k = weight.shape[0]
    padding = (k - 1, 0) if causal else (k // 2, k - 1 - k // 2)
    out = jax.lax.conv_general_dilated(
        x,
        weight.astype(x.dtype),
        window_strides=(1,),
        padding=(padding,),
        dimension_numbers=("NWC", "WIO", "NWC"),
        feature_group_count=groups,
        precision=jax.lax.Precision.HIGHEST,
    )
    return out + bias.astype(x.dtype)


@register
@dataclasses.dataclass(frozen=True)
class Conv(Encoding):
    """A grouped convolution over the token embeddings, through a GELU, added to them.

    Attributes:
      kernel_size: ``K``, tokens each output reads (128 in the paper).
      groups: channel groups of the convolution (16 in the paper); must divide
        ``model.model_dim``.
      causal: left padding only (position ``t`` sees ``t - K + 1 .. t``); False is wav2vec 2.0's
        centred convolution, for a bidirectional model only.
    """

    name = "conv"
    paper = (
        "Baevski, Zhou, Mohamed, Auli 2020, wav2vec 2.0: A Framework for Self-Supervised "
        "Learning of Speech Representations (convolutional relative positional embedding)"
    )
    relative = True  # reads the order of the tokens, never position values
    param_scope = "shared"  # one convolution at the input

    kernel_size: int = 16
    groups: int = 4
    causal: bool = True

    def __post_init__(self):
        for field in ("kernel_size", "groups"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"encoding.{field} must be a positive integer, got {value!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"encoding.causal must be True or False, got {self.causal!r}")

    def validate(self, dims: Dims) -> None:
        if dims.model_dim % self.groups:
            raise ValueError(
                f"encoding.groups={self.groups} must divide model.model_dim={dims.model_dim} "
                "(conv's grouped convolution)"
            )

    def for_direction(self, causal: bool) -> Conv:
        """The causal convolution for a causal stack, wav2vec 2.0's centred one otherwise."""
        return dataclasses.replace(self, causal=causal)

    def check_causal(self, causal: bool) -> None:
        super().check_causal(causal)
        if causal and not self.causal:
            raise ValueError(
                "model.causal=True needs encoding.hparams.causal=True for conv: the centred "
                "convolution (causal=False) reads later tokens"
            )

    def param_shapes(self, dims: Dims) -> dict[str, tuple[int, ...]]:
        d = dims.model_dim
        return {"weight": (self.kernel_size, d // self.groups, d), "bias": (d,)}

    def init(self, rng: jax.Array, dims: Dims) -> Params:
        shapes = self.param_shapes(dims)
        std = math.sqrt(4.0 / (self.kernel_size * dims.model_dim))  # wav2vec 2.0's code
        return {
            "weight": (std * jax.random.normal(rng, shapes["weight"])).astype(jnp.float32),
            "bias": jnp.zeros(shapes["bias"], jnp.float32),
        }

    def embed_tokens(self, params: Params, x: jax.Array, positions: jax.Array) -> jax.Array:
        """``GELU(conv(x))``: ``x: [B, T, D]`` token embeddings -> ``[B, T, D]`` float32;
        ``positions`` are not read (the convolution runs over the window's order)."""
        del positions
        out = grouped_conv(
            x.astype(jnp.float32), params["weight"], params["bias"], self.groups, self.causal
        )
        return jax.nn.gelu(out, approximate=False)
