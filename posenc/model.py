"""The shared decoder-only transformer (Flax NNX) that every positional encoder plugs into.

Pre-norm blocks (norm -> attention -> residual, norm -> MLP -> residual), a final norm and a
tied output projection by default. The encoder is a constructor argument and the model never
names one: it adds ``embed`` and ``embed_tokens`` terms at the input when the encoder has those
hooks, keeps the encoder's parameters where its ``param_scope`` says, and hands everything else
to :func:`posenc.attention.attend`, with each layer's normed input (which hooks such as
``log_decay`` may read).

Precision: parameters in float32; matmuls in ``ModelConfig.dtype`` (bfloat16 by default);
norms, softmax and the output logits in float32.

Dropout takes an explicit RNG key (``model(tokens, rng=key)``); without one the model is
deterministic. Dropout is applied to the embeddings and to each residual branch. An encoder with
``augment_positions`` (CAPE) draws its training augmentation from the same key, folded with a
constant, and gets no key (no augmentation) without one.

Generation (:mod:`posenc.generate`): :meth:`Transformer.forward` also returns each layer's
:class:`LayerCache` of the window (the prefill), and :meth:`Transformer.decode` runs one new
token against the caches; both start from :meth:`Transformer.embed_inputs` and end in
:meth:`Transformer.head`, as ``__call__`` does.

Segment-level recurrence (Dai et al. 2019, *Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context*, Sec. 3.2): ``model(tokens, positions, memory=mem)`` returns
``(logits, new_mem)``. ``mem: [L, B, M, D]`` holds, per layer, the hidden states that entered
that layer for the ``M`` tokens before the segment (the paper's ``h^{n-1}_{tau}``); layer ``l``
computes its keys and values from ``concat(stop_gradient(mem_l), h_l)`` and its queries from the
segment, and the paper's ``SG`` is ``jax.lax.stop_gradient``. With pre-norm blocks the cache is
the residual stream *before* the layer's norm, and the current norm is applied to memory and
segment together: the norm acts per token, so this equals caching the normed states, except that
the norm's parameters are the current ones, as the paper applies the current ``W_k, W_v`` to the
cached states. Positions span memory and segment (``[M + T]``, the memory's first); attention's
queries are the last ``T`` of the ``M + T`` keys (:func:`posenc.attention.attend`), so every
encoder that takes positions runs with memory unchanged; input terms (``embed``) are computed
for the segment's positions. An encoder with ``embed_tokens`` (a term read from neighbouring
token embeddings, which the memory does not keep) is refused with memory. ``new_mem`` is the
last ``mem_len`` states of ``concat(mem_l, h_l)`` per layer, gradient stopped. Without
``memory`` the model is unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from posenc.attention import IMPLEMENTATIONS, attend, check_implementation
from posenc.encodings.base import Dims, Encoding, Params

NORMS = ("layernorm", "rmsnorm")
DTYPES = ("bfloat16", "float32", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the transformer.

    Attributes:
      vocab_size: token ids are in ``[0, vocab_size)`` (257 for bytes plus a separator).
      num_layers: transformer blocks.
      model_dim: residual stream width ``D``.
      num_heads: attention heads ``H``; ``head_dim = model_dim // num_heads`` unless given.
      mlp_dim: hidden width of the MLP.
      head_dim: per-head width; None derives it from ``model_dim // num_heads``.
      dropout: dropout rate on the embeddings and residual branches.
      norm: ``"layernorm"`` or ``"rmsnorm"``.
      dtype: compute dtype of the matmuls.
      tie_embeddings: reuse the token embedding as the output projection.
      attention_impl: an attention path, see :mod:`posenc.attention`.
      attention_block_size: query block of the ``blocked`` path and the ``auto`` threshold;
        the chunk of the linear paths' causal prefix sums.
      performer_features: random features per head of the ``linear_performer`` path (FAVOR+'s
        ``m``), fixed per layer (:mod:`posenc.linear_attention`).
      causal: mask keys after the query (a decoder, for causal LM); False runs attention
        unmasked on every path (a bidirectional encoder, for masked LM).
      mem_len: Transformer-XL memory: the number of earlier tokens whose per-layer states a
        call with ``memory`` keeps for the next segment (Dai et al. 2019, Sec. 3.2); 0: none
        (training and evaluation without memory, as before).
    """

    vocab_size: int = 257
    num_layers: int = 2
    model_dim: int = 64
    num_heads: int = 4
    mlp_dim: int = 256
    head_dim: int | None = None
    dropout: float = 0.0
    norm: str = "layernorm"
    dtype: str = "bfloat16"
    tie_embeddings: bool = True
    attention_impl: str = "auto"
    attention_block_size: int = 512
    performer_features: int = 256
    causal: bool = True
    mem_len: int = 0

    def __post_init__(self):
        positive = ("vocab_size", "num_layers", "model_dim", "num_heads", "mlp_dim")
        for field in (*positive, "performer_features"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{field} must be a positive integer, got {value!r}")
        if self.head_dim is None and self.model_dim % self.num_heads:
            raise ValueError(
                f"model.model_dim={self.model_dim} is not divisible by model.num_heads="
                f"{self.num_heads}; change one of them or set model.head_dim"
            )
        if not isinstance(self.mem_len, int) or isinstance(self.mem_len, bool) or self.mem_len < 0:
            raise ValueError(f"model.mem_len must be an integer >= 0, got {self.mem_len!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"model.causal must be True or False, got {self.causal!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        for field, allowed in (
            ("norm", NORMS),
            ("dtype", DTYPES),
            ("attention_impl", IMPLEMENTATIONS),
        ):
            if getattr(self, field) not in allowed:
                raise ValueError(
                    f"model.{field} must be one of {list(allowed)}, got {getattr(self, field)!r}"
                )

    @property
    def dims(self) -> Dims:
        head_dim = self.head_dim or self.model_dim // self.num_heads
        return Dims(num_heads=self.num_heads, head_dim=head_dim, model_dim=self.model_dim)


# Folded into the model's key for `augment_positions` (any constant; "CAPE" in ASCII).
_AUGMENT_STREAM = 0x43415045


def _dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def _norm(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
    cls = nnx.LayerNorm if config.norm == "layernorm" else nnx.RMSNorm
    return cls(config.model_dim, dtype=jnp.float32, param_dtype=jnp.float32, rngs=rngs)


class EncoderParam(nnx.Param):
    """A positional encoder's learned parameter (T5's table, Shaw's embeddings, XL's u and v).

    A type of its own so that code above the model can tell encoder parameters apart without
    knowing attribute names: the optimizer, for one, does not decay them.
    """


def _encoder_params(encoding: Encoding, rngs: nnx.Rngs) -> nnx.Dict:
    params = encoding.init(rngs.params(), encoding.bound_dims)
    return nnx.Dict({name: EncoderParam(value) for name, value in params.items()})


def _values(params: nnx.Dict | None) -> Params:
    return {} if params is None else {name: p[...] for name, p in params.items()}


class LayerCache(NamedTuple):
    """What one layer's key/value cache keeps per token (:mod:`posenc.generate`).

    ``k`` is kept before the encoder's ``rotate``: attention rotates the whole cache again at
    every step from the slots' positions, which is exact also for a rotation that reads the
    window's positions (xPos's centre). ``h`` is the layer's normed input, which ``log_decay``
    reads.

    Attributes:
      h: ``[B, S, D]`` normed layer input, compute dtype.
      k: ``[B, S, H, Dh]`` keys (before ``rotate``), compute dtype.
      v: ``[B, S, H, Dh]`` values, compute dtype.
    """

    h: jax.Array
    k: jax.Array
    v: jax.Array


class Block(nnx.Module):
    """Pre-norm transformer block; owns the encoder's parameters when they are per layer.

    ``layer`` is the block's index in the model, which fixes the random features of the
    ``linear_performer`` attention path.
    """

    def __init__(self, config: ModelConfig, encoding: Encoding, *, rngs: nnx.Rngs, layer: int = 0):
        dims = config.dims
        dtype = jnp.dtype(config.dtype)
        dense = dict(dtype=dtype, param_dtype=jnp.float32, rngs=rngs)
        inner = dims.num_heads * dims.head_dim
        self.config = config
        self.encoding = encoding
        self.layer = layer
        self.attn_norm = _norm(config, rngs)
        self.qkv = nnx.Linear(config.model_dim, 3 * inner, use_bias=False, **dense)
        self.out = nnx.Linear(inner, config.model_dim, use_bias=False, **dense)
        self.mlp_norm = _norm(config, rngs)
        self.mlp_in = nnx.Linear(config.model_dim, config.mlp_dim, **dense)
        self.mlp_out = nnx.Linear(config.mlp_dim, config.model_dim, **dense)
        self.pos_params = (
            _encoder_params(encoding, rngs) if encoding.param_scope == "layer" else None
        )

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        shared_params: Params,
        rng: jax.Array | None,
        memory: jax.Array | None = None,
    ) -> jax.Array:
        """``x: [B, T, D]`` float32 residual stream -> same shape.

        ``memory``: ``[B, M, D]`` float32 residual stream of the ``M`` tokens before ``x``
        (already gradient-stopped), read as extra keys and values; ``positions`` then covers
        ``[M + T]``, the memory's first. None: self-attention over ``x`` alone.
        """
        return self.forward(x, positions, shared_params, rng, memory)[0]

    def forward(
        self,
        x: jax.Array,
        positions: jax.Array,
        shared_params: Params,
        rng: jax.Array | None = None,
        memory: jax.Array | None = None,
    ) -> tuple[jax.Array, LayerCache]:
        """The block over a whole window, and what a key/value cache keeps of it.

        Args:
          x: ``[B, T, D]`` float32 residual stream.
          positions: ``[B|1, T]`` integer positions (``[B|1, M + T]`` with ``memory``).
          shared_params: the model's shared encoder parameters (``{}`` if none).
          rng: dropout key; None for a deterministic pass.
          memory: ``[B, M, D]`` Transformer-XL memory (see :meth:`__call__`), or None.

        Returns:
          ``x`` after the block, ``[B, T, D]`` float32, and the :class:`LayerCache` of the keys
          (``h``, ``k``, ``v`` at the ``T`` tokens, or ``M + T`` with memory; ``k`` before
          ``rotate``).
        """
        config = self.config
        attn_rng, mlp_rng = jax.random.split(rng) if rng is not None else (None, None)
        q_pos = positions
        if memory is None:
            h, q, k, v = self._project(x)
        else:  # keys and values over memory + segment, queries from the segment
            h, q, k, v = self._project(jnp.concatenate([memory, x], axis=1))  # [B, M + T, ...]
            q, q_pos = q[:, memory.shape[1] :], positions[:, memory.shape[1] :]
        attn = attend(
            q,
            k,
            v,
            encoding=self.encoding,
            params=self._params(shared_params),
            q_pos=q_pos,
            k_pos=positions,
            implementation=config.attention_impl,
            block_size=config.attention_block_size,
            causal=config.causal,
            inputs=h,  # the normed layer input, for encoders that read it (log_decay)
            layer=self.layer,
            performer_features=config.performer_features,
        )
        return self._finish(x, attn, attn_rng, mlp_rng), LayerCache(h=h, k=k, v=v)

    def decode(
        self,
        x: jax.Array,
        cache: LayerCache,
        slot: jax.Array | int,
        positions: jax.Array,
        k_valid: jax.Array,
        shared_params: Params,
    ) -> tuple[jax.Array, LayerCache]:
        """The block for one new token at cache slot ``slot``, attending over the cache
        (deterministic; causal models only).

        The new token's ``h``, ``k`` and ``v`` are written into the cache, then its query
        attends over every slot on the ``einsum`` path with ``k_valid`` masking the slots not
        yet filled (exactly, see :func:`posenc.attention.attend`): each encoder's hooks see the
        keys' positions and layer inputs as in a full pass over the filled slots.

        Args:
          x: ``[B, 1, D]`` float32 residual stream of the new token.
          cache: this layer's :class:`LayerCache` with ``S`` slots.
          slot: the new token's slot (an int or a traced scalar).
          positions: ``[B|1, S]`` integer positions of every slot.
          k_valid: ``[B|1, S]`` bool, the filled slots, the new one included and last.
          shared_params: the model's shared encoder parameters (``{}`` if none).

        Returns:
          ``x`` after the block, ``[B, 1, D]`` float32, and the updated cache.
        """
        if x.shape[1] != 1:
            raise ValueError(f"Block.decode takes one new token, got x of shape {x.shape}")
        h, q, k, v = self._project(x)
        cache = LayerCache(
            *(
                jax.lax.dynamic_update_slice_in_dim(old, new.astype(old.dtype), slot, axis=1)
                for old, new in zip(cache, (h, k, v), strict=True)
            )
        )
        attn = attend(
            q,
            cache.k,
            cache.v,
            encoding=self.encoding,
            params=self._params(shared_params),
            q_pos=jax.lax.dynamic_slice_in_dim(positions, slot, 1, axis=1),
            k_pos=positions,
            implementation="einsum",
            causal=True,
            inputs=cache.h,
            layer=self.layer,
            k_valid=k_valid,
        )
        return self._finish(x, attn, None, None), cache

    def _params(self, shared_params: Params) -> Params:
        """This layer's encoder parameters."""
        return shared_params if self.pos_params is None else _values(self.pos_params)

    def _project(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
        """``x: [B, T, D]`` -> the normed input ``h: [B, T, D]`` and ``q, k, v: [B, T, H, Dh]``,
        in the compute dtype."""
        config, dims = self.config, self.config.dims
        b, t, _ = x.shape
        h = self.attn_norm(x).astype(config.dtype)
        qkv = self.qkv(h).reshape(b, t, 3, dims.num_heads, dims.head_dim)  # [B, T, 3, H, Dh]
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, T, H, Dh] each
        return h, q, k, v

    def _finish(
        self,
        x: jax.Array,
        attn: jax.Array,
        attn_rng: jax.Array | None,
        mlp_rng: jax.Array | None,
    ) -> jax.Array:
        """Output projection, residual and MLP: ``x: [B, T, D]``, ``attn: [B, T, H, Dh]`` ->
        ``[B, T, D]`` float32."""
        config, dims = self.config, self.config.dims
        b, t, _ = x.shape
        attn = self.out(attn.reshape(b, t, dims.num_heads * dims.head_dim))  # [B, T, D]
        x = x + _dropout(attn, config.dropout, attn_rng).astype(jnp.float32)

        h = self.mlp_norm(x).astype(config.dtype)
        h = self.mlp_out(jax.nn.gelu(self.mlp_in(h)))
        return x + _dropout(h, config.dropout, mlp_rng).astype(jnp.float32)


class Transformer(nnx.Module):
    """Decoder-only language model around one positional encoder (or, with
    ``config.causal=False``, a bidirectional encoder for masked LM).

    Args:
      config: shape and numerics.
      encoding: an unbound encoder (``posenc.encodings.get(...)``); the model binds it to its
        dimensions, which validates the combination (e.g. RoPE and odd head dimensions).
      rngs: parameter initialisation RNG streams.
    """

    def __init__(self, config: ModelConfig, encoding: Encoding, *, rngs: nnx.Rngs):
        encoding = encoding.bind(config.dims)
        input_hooks = {"embed", "embed_tokens"} & set(encoding.hooks)
        if input_hooks and encoding.param_scope != "shared":
            raise ValueError(
                f"encoding {encoding.name!r} adds an input embedding, so its parameters must be "
                "shared (param_scope='shared')"
            )
        check_implementation(encoding, config.attention_impl)  # before anything is traced
        encoding.check_causal(config.causal)  # causal-only encoders refuse causal=False
        self.config = config
        self.encoding = encoding
        std = 1.0 / math.sqrt(config.model_dim)
        self.embed = nnx.Embed(
            config.vocab_size,
            config.model_dim,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            embedding_init=nnx.initializers.normal(std),
            rngs=rngs,
        )
        self.shared_pos_params = (
            _encoder_params(encoding, rngs) if encoding.param_scope == "shared" else None
        )
        self.blocks = nnx.List(
            [Block(config, encoding, rngs=rngs, layer=i) for i in range(config.num_layers)]
        )
        self.final_norm = _norm(config, rngs)
        self.unembed = (
            None
            if config.tie_embeddings
            else nnx.Linear(
                config.model_dim,
                config.vocab_size,
                use_bias=False,
                dtype=jnp.dtype(config.dtype),
                param_dtype=jnp.float32,
                rngs=rngs,
            )
        )

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
        memory: jax.Array | None = None,
        mem_len: int | None = None,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """Next-token logits (causal), or logits per position (bidirectional).

        Args:
          tokens: ``[B, T]`` integer token ids.
          positions: ``[B, T]``, ``[1, T]`` or ``[T]`` integer positions, any values (e.g. the
            randomized positions of Ruoss et al. 2023); default ``arange(T)``. Float positions
            reach ``embed`` as they are only for a ``continuous_positions`` encoder (CAPE); every
            other use casts them to int32. With ``memory`` of ``M`` tokens, the positions of
            memory and segment, ``[B|1, M + T]`` or ``[M + T]``; default ``arange(M + T)``.
          rng: the training key: dropout, and the position augmentation of an encoder with
            ``augment_positions`` (CAPE); None for a deterministic (evaluation) pass.
          memory: ``[L, B, M, D]`` float32 Transformer-XL memory (``M`` may be 0): per layer,
            the residual stream that entered it for the ``M`` tokens before ``tokens``, as the
            previous call returned it. None: no memory, and only the logits are returned.
          mem_len: states kept in the returned memory; default ``config.mem_len``. Evaluation
            may keep more than training did.

        Returns:
          ``[B, T, vocab_size]`` float32 logits; with ``memory``, ``(logits, new_memory)``
          where ``new_memory: [L, B, min(mem_len, M + T), D]`` is the last ``mem_len`` states
          of ``concat(memory_l, input_l)`` per layer, gradient stopped.
        """
        if memory is None:
            return self.forward(tokens, positions, rng=rng)[0]
        return self._forward_memory(tokens, positions, rng, memory, mem_len)

    def forward(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> tuple[jax.Array, list[LayerCache]]:
        """:meth:`__call__`'s logits (without memory) and each layer's :class:`LayerCache` of the
        window (the prefill of :mod:`posenc.generate`); arguments as for :meth:`__call__`."""
        config, encoding = self.config, self.encoding
        t = tokens.shape[1]
        if positions is None:
            encoding.check_length(t)
            positions = jnp.arange(t, dtype=jnp.int32)
        given = jnp.atleast_2d(positions)  # [B|1, T]
        positions = given.astype(jnp.int32)
        shared = _values(self.shared_pos_params)

        x = self.embed_inputs(tokens, given, rng=rng)  # [B, T, D] float32
        rngs = jax.random.split(rng, config.num_layers + 1) if rng is not None else None
        x = _dropout(x, config.dropout, None if rngs is None else rngs[-1])
        caches = []
        for i, block in enumerate(self.blocks):
            x, cache = block.forward(x, positions, shared, None if rngs is None else rngs[i])
            caches.append(cache)
        return self.head(x), caches

    def _forward_memory(
        self,
        tokens: jax.Array,
        positions: jax.Array | None,
        rng: jax.Array | None,
        memory: jax.Array,
        mem_len: int | None,
    ) -> tuple[jax.Array, jax.Array]:
        """:meth:`__call__` with Transformer-XL memory: ``(logits, new_memory)``."""
        config, encoding = self.config, self.encoding
        t = tokens.shape[1]
        m = memory.shape[2]
        if positions is None:
            encoding.check_length(m + t)
            positions = jnp.arange(m + t, dtype=jnp.int32)
        given = jnp.atleast_2d(positions)  # [B|1, M + T]
        positions = given.astype(jnp.int32)
        expected = (config.num_layers, tokens.shape[0], m, config.model_dim)
        if memory.shape != expected or positions.shape[1] != m + t:
            raise ValueError(
                f"memory must be [L, B, M, D] = {expected[:2]} + [M, {config.model_dim}] "
                f"with positions [B|1, M + T = {m + t}], got memory {tuple(memory.shape)} "
                f"and positions {tuple(positions.shape)}"
            )
        if "embed_tokens" in encoding.hooks:
            raise ValueError(
                f"encoding {encoding.name!r} reads neighbouring token embeddings "
                "(embed_tokens), which Transformer-XL memory does not keep; use "
                "model.mem_len=0 with it"
            )
        memory = jax.lax.stop_gradient(memory)  # the paper's SG(h^{n-1}_tau)
        shared = _values(self.shared_pos_params)

        x = self.embed_inputs(tokens, given[:, m:], rng=rng)  # the segment's input terms
        rngs = jax.random.split(rng, config.num_layers + 1) if rng is not None else None
        x = _dropout(x, config.dropout, None if rngs is None else rngs[-1])
        inputs = []  # the residual stream entering each layer, for the next memory
        for i, block in enumerate(self.blocks):
            inputs.append(x)
            x = block(x, positions, shared, None if rngs is None else rngs[i], memory[i])
        logits = self.head(x)
        keep = config.mem_len if mem_len is None else mem_len
        states = jnp.concatenate([memory, jnp.stack(inputs)], axis=2)  # [L, B, M + T, D]
        new_memory = states[:, :, max(0, m + t - keep) :]
        return logits, jax.lax.stop_gradient(new_memory)

    def empty_memory(self, batch: int) -> jax.Array:
        """The memory before a stream's first segment: ``[L, batch, 0, D]`` float32."""
        c = self.config
        return jnp.zeros((c.num_layers, batch, 0, c.model_dim), jnp.float32)

    def decode(
        self,
        tokens: jax.Array,
        slot: jax.Array | int,
        positions: jax.Array,
        caches: list[LayerCache],
    ) -> tuple[jax.Array, list[LayerCache]]:
        """Logits of one new token at slot ``slot`` of a key/value cache (:mod:`posenc.generate`).

        The input term is computed as in :meth:`forward`, over the whole token buffer, and the
        new slots are taken from it, so any causal input term (one that reads earlier tokens
        too) is exact; then each block attends over its cache (:meth:`Block.decode`), with the
        slots after the new tokens masked.

        Args:
          tokens: ``[B, S]`` the token buffer, filled up to and including ``slot`` (later slots
            are ignored).
          slot: the new token's slot (an int or a traced scalar).
          positions: ``[B|1, S]`` integer positions of every slot.
          caches: each layer's :class:`LayerCache`, filled before ``slot``.

        Returns:
          ``[B, 1, vocab_size]`` float32 logits and the updated caches.
        """
        if not self.config.causal:
            raise ValueError(
                "model.causal=False: decoding with a key/value cache needs a causal model"
            )
        positions = jnp.atleast_2d(positions).astype(jnp.int32)  # [B|1, S]
        shared = _values(self.shared_pos_params)
        x = self.embed_inputs(tokens, positions)  # [B, S, D] float32
        x = jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=1)  # [B, 1, D]
        k_valid = jnp.arange(tokens.shape[1])[None, :] <= slot  # [1, S]
        new_caches = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, cache = block.decode(x, cache, slot, positions, k_valid, shared)
            new_caches.append(cache)
        return self.head(x), new_caches

    def embed_inputs(
        self, tokens: jax.Array, positions: jax.Array, *, rng: jax.Array | None = None
    ) -> jax.Array:
        """The input of the first block (before dropout): the token embeddings and the encoder's
        input terms (``embed``, ``embed_tokens``); :meth:`forward` and :meth:`decode` both start
        here.

        Args:
          tokens: ``[B, T]`` integer token ids.
          positions: ``[B|1, T]`` positions (float only for a ``continuous_positions`` encoder).
          rng: the training key (``augment_positions``); None for a deterministic pass.

        Returns:
          ``[B, T, D]`` float32.
        """
        encoding = self.encoding
        given = jnp.atleast_2d(positions)  # [B|1, T]
        shared = _values(self.shared_pos_params)
        embed_positions = self._embed_positions(given, tokens.shape, shared, rng)

        # Token embeddings scaled by sqrt(D) as in Vaswani et al., so they and the sinusoids
        # (entries in [-1, 1]) start on the same scale.
        tokens_x = self.embed(tokens) * math.sqrt(self.config.model_dim)  # [B, T, D] float32
        x = tokens_x
        if "embed" in encoding.hooks:
            x = x + encoding.embed(shared, embed_positions).astype(jnp.float32)
        if "embed_tokens" in encoding.hooks:  # a term read from the token embeddings
            positions = given.astype(jnp.int32)
            x = x + encoding.embed_tokens(shared, tokens_x, positions).astype(jnp.float32)
        return x

    def head(self, x: jax.Array) -> jax.Array:
        """Final norm and output projection: ``[B, T, D]`` float32 -> ``[B, T, V]`` float32."""
        x = self.final_norm(x)
        if self.unembed is None:
            return x @ self.embed.embedding[...].T  # [B, T, V] float32
        return self.unembed(x.astype(self.config.dtype)).astype(jnp.float32)

    def _embed_positions(
        self, given: jax.Array, shape: tuple[int, int], shared: Params, rng: jax.Array | None
    ) -> jax.Array:
        """The positions ``embed`` receives: int32 ``[B|1, T]``, or for an encoder with
        ``continuous_positions`` float32, broadcast to ``[B, T]`` and passed through its
        ``augment_positions`` (with a key folded from ``rng`` in training, None otherwise)."""
        encoding = self.encoding
        if not encoding.continuous_positions:
            return given.astype(jnp.int32)
        positions = jnp.broadcast_to(given.astype(jnp.float32), shape)  # [B, T]
        if "augment_positions" not in encoding.hooks:
            return positions
        # Folded in rather than split off, so that the dropout keys stay what they were.
        key = None if rng is None else jax.random.fold_in(rng, _AUGMENT_STREAM)
        return encoding.augment_positions(shared, positions, key).astype(jnp.float32)

    def num_params(self) -> int:
        """Number of learned parameters (encoder parameters included)."""
        state = nnx.state(self, nnx.Param)
        return sum(int(x.size) for x in jax.tree.leaves(state))


def token_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token cross entropy in nats: ``[B, T, V]`` logits -> ``[B, T]`` float32."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
