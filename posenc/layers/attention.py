"""Self- and cross-attention layers: the projections around :func:`posenc.attention.core.attend`.

Parameters (logical axes in brackets): ``q [embed, heads, head_dim]``, ``k`` and
``v [embed, kv_heads, head_dim]``, ``o [heads, head_dim, embed]``, and with the config's biases
``q_bias``, ``k_bias``, ``v_bias`` (``[heads|kv_heads, head_dim]``) and ``o_bias [embed]``. With
grouped-query attention (``num_kv_heads < num_heads``) each key/value head serves
``num_heads / num_kv_heads`` consecutive query heads; attention receives the keys and values
repeated to ``num_heads`` (so every encoder's hooks see one key per query head), while caches
keep ``num_kv_heads``.

Initialisation: ``q``, ``k`` and ``v`` are one LeCun-normal draw of a ``D x (H + 2 KV) Dh``
matrix (one key), split by columns, and self-attention multiplies by that matrix in one matmul;
``o`` is one draw of ``H Dh x D``. This is the draw (and the product) of a fused ``qkv``
projection, so the default model is the one posenc has always built.

Cross-attention (:class:`CrossAttention`) carries no positional term: Vaswani et al., Shaw et al.
(tensor2tensor's encoder-decoder attention is plain dot-product attention) and T5 add none, so
its queries and keys meet only through their contents, whatever encoder the stacks use.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.attention.core import attend
from posenc.encodings.base import Encoding, Params
from posenc.encodings.nope import NoPE
from posenc.layers.cache import CrossCache
from posenc.layers.params import param

_lecun_normal = nnx.initializers.lecun_normal()


def _dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, dtype: jnp.dtype) -> jax.Array:
    """``x [.., n] @ kernel [n, m] (+ bias [m])`` in ``dtype``, as ``nnx.Linear`` computes it."""
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    return y if bias is None else y + bias.astype(dtype)


class _Projections(nnx.Module):
    """``q``, ``k``, ``v`` and ``o`` (and their biases) of one attention layer."""

    def __init__(
        self,
        model_dim: int,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int,
        *,
        qkv_bias: bool,
        out_bias: bool,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        d, h, kv, dh = model_dim, num_heads, num_kv_heads, head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = h, kv, dh
        self.dtype = dtype
        w = _lecun_normal(rngs.params(), (d, (h + 2 * kv) * dh), jnp.float32)
        self.q = param(w[:, : h * dh].reshape(d, h, dh), ("embed", "heads", "head_dim"))
        self.k = param(
            w[:, h * dh : (h + kv) * dh].reshape(d, kv, dh), ("embed", "kv_heads", "head_dim")
        )
        self.v = param(w[:, (h + kv) * dh :].reshape(d, kv, dh), ("embed", "kv_heads", "head_dim"))
        biases: list[nnx.Param | None] = [None, None, None]
        if qkv_bias:
            b = jnp.zeros(((h + 2 * kv) * dh,), jnp.float32)  # as nnx.Linear's bias (one key)
            rngs.params()
            biases = [
                param(b[: h * dh].reshape(h, dh), ("heads", "head_dim")),
                param(b[h * dh : (h + kv) * dh].reshape(kv, dh), ("kv_heads", "head_dim")),
                param(b[(h + kv) * dh :].reshape(kv, dh), ("kv_heads", "head_dim")),
            ]
        self.q_bias, self.k_bias, self.v_bias = biases
        wo = _lecun_normal(rngs.params(), (h * dh, d), jnp.float32)
        self.o = param(wo.reshape(h, dh, d), ("heads", "head_dim", "embed"))
        self.o_bias = param(jnp.zeros((d,), jnp.float32), ("embed",)) if out_bias else None
        if out_bias:
            rngs.params()

    def _kernel(self, names: tuple[str, ...]) -> tuple[jax.Array, jax.Array | None]:
        """The named projections side by side: ``[D, sum of widths]`` and their biases."""
        d = self.q.shape[0]
        kernel = jnp.concatenate([getattr(self, n)[...].reshape(d, -1) for n in names], axis=1)
        if self.q_bias is None:
            return kernel, None
        bias = [getattr(self, f"{n}_bias")[...].reshape(-1) for n in names]
        return kernel, jnp.concatenate(bias)

    def _split(self, y: jax.Array, names: tuple[str, ...]) -> list[jax.Array]:
        """``[B, T, sum of widths]`` -> one ``[B, T, heads, Dh]`` per name."""
        b, t, _ = y.shape
        heads = {"q": self.num_heads, "k": self.num_kv_heads, "v": self.num_kv_heads}
        sizes = [heads[n] * self.head_dim for n in names]
        cuts = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
        return [
            part.reshape(b, t, heads[n], self.head_dim)  # [B, T, H|KV, Dh]
            for part, n in zip(jnp.split(y, cuts, axis=-1), names, strict=True)
        ]

    def project(self, h: jax.Array, names: tuple[str, ...]) -> list[jax.Array]:
        """``h: [B, T, D]`` through the named projections in one matmul."""
        kernel, bias = self._kernel(names)
        return self._split(_dense(h, kernel, bias, self.dtype), names)

    def output(self, attn: jax.Array) -> jax.Array:
        """``[B, T, H, Dh]`` -> ``[B, T, D]`` in the compute dtype."""
        b, t = attn.shape[:2]
        wo = self.o[...]
        bias = None if self.o_bias is None else self.o_bias[...]
        flat = attn.reshape(b, t, self.num_heads * self.head_dim)  # [B, T, H * Dh]
        return _dense(flat, wo.reshape(-1, wo.shape[-1]), bias, self.dtype)

    def repeat_kv(self, x: jax.Array) -> jax.Array:
        """``[B, S, KV, Dh] -> [B, S, H, Dh]``: each key/value head for its group of queries."""
        group = self.num_heads // self.num_kv_heads
        return x if group == 1 else jnp.repeat(x, group, axis=2)


class SelfAttention(_Projections):
    """Self-attention with a positional encoder's hooks (see the module docstring).

    The block calls :meth:`qkv` (on the normed input, or memory and input together), then
    :meth:`__call__` with the keys and values it chose (the window's, a cache's).
    """

    def qkv(self, h: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``h: [B, T, D]`` -> ``q [B, T, H, Dh]``, ``k, v [B, T, KV, Dh]`` (compute dtype)."""
        q, k, v = self.project(h, ("q", "k", "v"))
        return q, k, v

    def __call__(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        *,
        encoding: Encoding,
        params: Params,
        q_pos: jax.Array,
        k_pos: jax.Array,
        **attend_kwargs: Any,
    ) -> jax.Array:
        """Attention of ``q`` over ``k, v`` with ``encoding``'s hooks, then ``o``.

        Args:
          q: ``[B, T, H, Dh]``; k, v: ``[B, S, KV, Dh]``.
          encoding, params: the bound encoder and this layer's parameters.
          q_pos, k_pos: integer positions ``[B|1, T]`` and ``[B|1, S]``.
          **attend_kwargs: the rest of :func:`posenc.attention.core.attend`'s keywords (causal,
            implementation, block size, layer inputs, ``k_valid``, ...).

        Returns:
          ``[B, T, D]`` in the compute dtype.
        """
        attn = attend(
            q,
            self.repeat_kv(k),
            self.repeat_kv(v),
            encoding=encoding,
            params=params,
            q_pos=q_pos,
            k_pos=k_pos,
            **attend_kwargs,
        )
        return self.output(attn)


# Cross-attention's "encoder": no hooks at all (module docstring).
_NO_POSITIONS = NoPE()


class CrossAttention(_Projections):
    """Attention of the decoder's queries over the encoder output, without positions."""

    def kv(self, encoded: jax.Array, valid: jax.Array) -> CrossCache:
        """The keys and values of the encoder output, once per source.

        Args:
          encoded: ``[B, S, D]`` float32 encoder output.
          valid: ``[B, S]`` bool, the source tokens that are not padding.
        """
        k, v = self.project(encoded, ("k", "v"))
        return CrossCache(k=k, v=v, valid=valid)

    def __call__(
        self, h: jax.Array, cache: CrossCache, *, implementation: str, block_size: int
    ) -> jax.Array:
        """``h: [B, T, D]`` normed decoder stream -> ``[B, T, D]`` (compute dtype); padded
        source tokens are removed exactly (``attend``'s ``k_valid``)."""
        (q,) = self.project(h, ("q",))
        t, s = q.shape[1], cache.k.shape[1]
        if implementation not in ("einsum", "blocked"):
            implementation = "auto"  # the fused kernels take no key mask: auto picks a path
        attn = attend(
            q,
            self.repeat_kv(cache.k),
            self.repeat_kv(cache.v),
            encoding=_NO_POSITIONS,
            params={},
            q_pos=jnp.zeros((1, t), jnp.int32),
            k_pos=jnp.zeros((1, s), jnp.int32),
            causal=False,
            implementation=implementation,
            block_size=block_size,
            k_valid=cache.valid,
        )
        return self.output(attn)
