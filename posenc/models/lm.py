"""The decoder-only language model (causal), or with ``causal=False`` a bidirectional encoder
for masked LM: token embedding, blocks, final norm, output projection.

The encoder is a constructor argument and the model never names one: it adds ``embed`` and
``embed_tokens`` terms at the input when the encoder has those hooks, keeps the encoder's
parameters where its ``param_scope`` says (shared ones here, per-layer ones in each
:class:`~posenc.layers.block.Block`), and the blocks hand everything else to
:func:`posenc.attention.core.attend`.

Precision: parameters in float32; matmuls in ``ModelConfig.dtype`` (bfloat16 by default); norms,
softmax and the output logits in float32.

Dropout takes an explicit RNG key (``model(tokens, rng=key)``); without one the model is
deterministic. Dropout is applied to the embeddings and to each residual branch. An encoder with
``augment_positions`` (CAPE) draws its training augmentation from the same key, folded with a
constant, and gets no key (no augmentation) without one.

Generation (:mod:`posenc.decoding`): :meth:`Transformer.forward` also returns each layer's
:class:`~posenc.layers.cache.LayerCache` of the window (the prefill), and
:meth:`Transformer.decode` runs one new token against the caches; both start from
:meth:`Transformer.embed_inputs` and end in :meth:`Transformer.head`, as ``__call__`` does.
Transformer-XL's segment memory is a function over these parts (:mod:`posenc.models.memory`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.attention.core import check_implementation
from posenc.encodings.base import Encoding, Params
from posenc.layers.block import Block, dropout
from posenc.layers.cache import LayerCache
from posenc.layers.config import ModelConfig
from posenc.layers.embed import (
    HeadTransform,
    TokenEmbedding,
    make_output_bias,
    make_unembed,
    output_logits,
    softcap_logits,
)
from posenc.layers.norms import model_norm
from posenc.layers.params import encoder_params, values
from posenc.layers.pattern import LayerKind, layer_of
from posenc.models.losses import TokenLosses, chunked_token_losses

# Folded into the model's key for `augment_positions` (any constant; "CAPE" in ASCII).
_AUGMENT_STREAM = 0x43415045


def bind_encoding(
    encoding: Encoding, config: ModelConfig, causal: bool, kind: LayerKind | None = None
) -> Encoding:
    """``encoding`` bound to the model's dimensions and checked against it: input terms need
    shared parameters (and belong to the whole model, not to a layer ``kind``), the attention
    path must take the encoder and the options, causal-only encoders refuse ``causal=False``;
    one-line errors before anything is traced."""
    encoding = encoding.bind(config.dims)
    input_hooks = {"embed", "embed_tokens"} & set(encoding.hooks)
    if input_hooks and kind is not None:
        raise ValueError(
            f"layers.kinds.{kind.name}.encoding={encoding.name!r} adds an input embedding, "
            "which belongs to the whole model, not to a layer: set it as encoding.name and "
            "give the kind an encoder that acts in attention (or none)"
        )
    if input_hooks and encoding.param_scope != "shared":
        raise ValueError(
            f"encoding {encoding.name!r} adds an input embedding, so its parameters must be "
            "shared (param_scope='shared')"
        )
    options = config.attention_options() if kind is None else kind.options
    check_implementation(encoding, config.attention_impl, options)
    encoding.check_causal(causal)
    return encoding


class Stack(nnx.Module):
    """What the decoder-only model and each side of an encoder-decoder share: the encoder's
    shared parameters, its input terms and the blocks.

    Args:
      config: shape, numerics and architecture options.
      encoding: a bound encoder (:func:`bind_encoding`).
      num_layers: blocks.
      causal: mask keys after the query.
      cross: blocks with cross-attention (an encoder-decoder's decoder).
      rngs: initialisation streams.
      layers: the layer kinds of a pattern, repeated over the blocks
        (:mod:`posenc.layers.pattern`); None or empty: every block with ``encoding`` and the
        config's attention options.
    """

    def __init__(
        self,
        config: ModelConfig,
        encoding: Encoding,
        *,
        num_layers: int,
        causal: bool,
        cross: bool = False,
        rngs: nnx.Rngs,
        layers: tuple[LayerKind, ...] | None = None,
    ):
        self.config = config
        self.encoding = encoding
        self.shared_pos_params = (
            encoder_params(encoding, rngs) if encoding.param_scope == "shared" else None
        )
        self.layers = tuple(layers or ())
        # Each kind's bound encoder, and one set of parameters per kind for a shared-scope one.
        bound = {
            kind.name: encoding
            if kind.encoding is None
            else bind_encoding(kind.encoding, config, causal, kind)
            for kind in self.layers
        }
        for kind in self.layers:
            if kind.encoding is None:
                check_implementation(encoding, config.attention_impl, kind.options)
        own = {
            kind.name: encoder_params(bound[kind.name], rngs)
            for kind in self.layers
            if kind.encoding is not None and bound[kind.name].param_scope == "shared"
        }
        self.kind_pos_params = nnx.Dict(own) if own else None
        blocks = []
        for i in range(num_layers):
            kind = layer_of(self.layers, i) if self.layers else None
            blocks.append(
                Block(
                    config,
                    encoding if kind is None else bound[kind.name],
                    rngs=rngs,
                    layer=i,
                    cross=cross,
                    causal=causal,
                    options=None if kind is None else kind.options,
                    kind=None if kind is None else kind.name,
                )
            )
        self.blocks = nnx.List(blocks)

    def shared(self) -> Params:
        """The encoder's shared parameters (``{}`` if none)."""
        return values(self.shared_pos_params)

    def layer_shared(self, shared: Params | None = None) -> list[Params]:
        """The shared encoder parameters each block reads: its kind's (a pattern's kind with a
        shared-scope encoder of its own) or the model's (``shared``, default :meth:`shared`)."""
        shared = self.shared() if shared is None else shared
        own = {name: values(p) for name, p in (self.kind_pos_params or {}).items()}
        return [own.get(block.kind, shared) for block in self.blocks]

    def input_terms(
        self, tokens_x: jax.Array, positions: jax.Array, rng: jax.Array | None
    ) -> jax.Array:
        """``tokens_x`` (the scaled float32 token embeddings ``[B, T, D]``) plus the encoder's
        input terms (``embed``, ``embed_tokens``) at ``positions [B|1, T]`` (float only for a
        ``continuous_positions`` encoder); ``rng`` is the training key (``augment_positions``)."""
        encoding = self.encoding
        given = jnp.atleast_2d(positions)  # [B|1, T]
        shared = self.shared()
        x = tokens_x
        if "embed" in encoding.hooks:
            embed_positions = self._embed_positions(given, tokens_x.shape[:2], shared, rng)
            x = x + encoding.embed(shared, embed_positions).astype(jnp.float32)
        if "embed_tokens" in encoding.hooks:  # a term read from the token embeddings
            positions = given.astype(jnp.int32)
            x = x + encoding.embed_tokens(shared, tokens_x, positions).astype(jnp.float32)
        return x

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


def default_positions(encoding: Encoding, positions: jax.Array | None, length: int) -> jax.Array:
    """``positions`` as ``[B|1, T]`` (as given: float stays float), or ``arange(length)`` after
    the encoder's ``check_length``."""
    if positions is None:
        encoding.check_length(length)
        positions = jnp.arange(length, dtype=jnp.int32)
    return jnp.atleast_2d(positions)


class Transformer(Stack):
    """Decoder-only language model around one positional encoder (or, with
    ``config.causal=False``, a bidirectional encoder for masked LM): a :class:`Stack` with a
    token embedding before it and a final norm and output projection after it.

    Args:
      config: shape, numerics and architecture options.
      encoding: an unbound encoder (``posenc.encodings.get(...)``); the model binds it to its
        dimensions, which validates the combination (e.g. RoPE and odd head dimensions).
      rngs: parameter initialisation RNG streams.
    """

    def __init__(
        self,
        config: ModelConfig,
        encoding: Encoding,
        *,
        rngs: nnx.Rngs,
        layers: tuple[LayerKind, ...] | None = None,
    ):
        encoding = bind_encoding(encoding, config, config.causal)
        self.config = config
        self.encoding = encoding
        # Construction order fixes the initialisation keys: embedding, shared encoder
        # parameters, blocks, final norm, output projection (posenc's original order).
        self.embed = TokenEmbedding(
            config.vocab_size, config.model_dim, scale=config.scale_embeddings, rngs=rngs
        )
        self.embed_norm = model_norm(config, rngs) if config.embed_norm else None
        super().__init__(
            config,
            encoding,
            num_layers=config.num_layers,
            causal=config.causal,
            rngs=rngs,
            layers=layers,
        )
        self.final_norm = model_norm(config, rngs) if config.norm_position != "post" else None
        self.unembed = (
            None
            if config.tie_embeddings
            else make_unembed(config.model_dim, config.vocab_size, jnp.dtype(config.dtype), rngs)
        )
        # A masked-LM head's parts (BERT, RoBERTa), made last so that a model without them draws
        # every other parameter as before.
        self.head_transform = (
            HeadTransform(
                config.head_transform,
                config.model_dim,
                norm=config.norm,
                eps=config.norm_eps,
                dtype=jnp.dtype(config.dtype),
                rngs=rngs,
                unit_offset=config.norm_unit_offset,
            )
            if config.head_transform
            else None
        )
        self.output_bias = make_output_bias(config.vocab_size) if config.output_bias else None

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """Next-token logits (causal), or logits per position (bidirectional).

        Args:
          tokens: ``[B, T]`` integer token ids.
          positions: ``[B, T]``, ``[1, T]`` or ``[T]`` integer positions, any values (e.g. the
            randomized positions of Ruoss et al. 2023); default ``arange(T)``. Float positions
            reach ``embed`` as they are only for a ``continuous_positions`` encoder (CAPE); every
            other use casts them to int32.
          rng: the training key: dropout, and the position augmentation of an encoder with
            ``augment_positions`` (CAPE); None for a deterministic (evaluation) pass.

        Returns:
          ``[B, T, vocab_size]`` float32 logits.
        """
        return self.forward(tokens, positions, rng=rng)[0]

    def forward(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> tuple[jax.Array, list[LayerCache]]:
        """:meth:`__call__`'s logits and each layer's :class:`LayerCache` of the window (the
        prefill of :mod:`posenc.decoding`); arguments as for :meth:`__call__`."""
        x, caches = self._blocks(tokens, positions, rng)
        return self.head(x), caches

    def prefill(
        self, tokens: jax.Array, positions: jax.Array | None = None
    ) -> tuple[jax.Array, list[LayerCache]]:
        """The last position's logits ``[B, V]`` and each layer's :class:`LayerCache` (what
        cached decoding starts from): :meth:`forward` with the head on the last position alone,
        so a long prompt's ``[B, T, V]`` logits are never formed."""
        x, caches = self._blocks(tokens, positions, None)
        return self.head(x[:, -1:])[:, 0], caches

    def hidden_states(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """The last block's output ``[B, T, D]`` float32, before :meth:`head` (what
        :meth:`token_losses` reads); arguments as for :meth:`__call__`."""
        return self._blocks(tokens, positions, rng)[0]

    def token_losses(
        self,
        hidden: jax.Array,
        targets: jax.Array,
        *,
        smoothing: float | None = None,
        correct: bool = False,
    ) -> TokenLosses:
        """Per-token cross entropy of :meth:`hidden_states` against ``targets [B, T]``, the
        logits formed ``model.loss_chunk`` tokens at a time (by default as many as 128 MiB hold)
        (:func:`posenc.models.losses.chunked_token_losses`, which says what ``smoothing`` and
        ``correct`` add)."""
        return chunked_token_losses(
            hidden,
            targets,
            self.head,
            chunk=self.config.loss_chunk_tokens,
            smoothing=smoothing,
            correct=correct,
        )

    def _blocks(
        self, tokens: jax.Array, positions: jax.Array | None, rng: jax.Array | None
    ) -> tuple[jax.Array, list[LayerCache]]:
        """The last block's output and each layer's cache (:meth:`forward` before the head)."""
        config = self.config
        given = default_positions(self.encoding, positions, tokens.shape[1])  # [B|1, T]
        positions = given.astype(jnp.int32)
        shared = self.layer_shared()

        x = self.embed_inputs(tokens, given, rng=rng)  # [B, T, D] float32
        rngs = jax.random.split(rng, config.num_layers + 1) if rng is not None else None
        x = dropout(x, config.dropout, None if rngs is None else rngs[-1])
        caches = []
        for i, block in enumerate(self.blocks):
            x, cache = block.forward(x, positions, shared[i], None if rngs is None else rngs[i])
            caches.append(cache)
        return x, caches

    def decode(
        self,
        tokens: jax.Array,
        slot: jax.Array | int,
        positions: jax.Array,
        caches: list[LayerCache],
    ) -> tuple[jax.Array, list[LayerCache]]:
        """Logits of one new token at slot ``slot`` of a key/value cache (:mod:`posenc.decoding`).

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
        shared = self.layer_shared()
        x = self.embed_inputs(tokens, positions)  # [B, S, D] float32
        x = jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=1)  # [B, 1, D]
        k_valid = jnp.arange(tokens.shape[1])[None, :] <= slot  # [1, S]
        new_caches = []
        for block, cache, own in zip(self.blocks, caches, shared, strict=True):
            x, cache = block.decode(x, cache, slot, positions, k_valid, own)
            new_caches.append(cache)
        return self.head(x), new_caches

    def embed_inputs(
        self, tokens: jax.Array, positions: jax.Array, *, rng: jax.Array | None = None
    ) -> jax.Array:
        """The input of the first block (before dropout): the token embeddings, the encoder's
        input terms (``embed``, ``embed_tokens``) and the embedding norm if the config has one;
        :meth:`forward` and :meth:`decode` both start here.

        Args:
          tokens: ``[B, T]`` integer token ids.
          positions: ``[B|1, T]`` positions (float only for a ``continuous_positions`` encoder).
          rng: the training key (``augment_positions``); None for a deterministic pass.

        Returns:
          ``[B, T, D]`` float32.
        """
        x = self.input_terms(self.embed(tokens), positions, rng)
        return x if self.embed_norm is None else self.embed_norm(x)

    def head(self, x: jax.Array) -> jax.Array:
        """Final norm, head transform and output projection (and bias, the logits' factor
        ``model.output_logit_scale`` and the soft cap): ``[B, T, D]`` float32 -> ``[B, T, V]``
        float32."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.head_transform is not None:
            x = self.head_transform(x)
        logits = output_logits(x, self.embed, self.unembed, jnp.dtype(self.config.dtype))
        if self.output_bias is not None:
            logits = logits + self.output_bias[...]
        scale = self.config.output_logit_scale
        logits = logits if scale == 1.0 else logits * scale
        return softcap_logits(logits, self.config.output_softcap)

    def num_params(self) -> int:
        """Number of learned parameters (encoder parameters included)."""
        state = nnx.state(self, nnx.Param)
        return sum(int(x.size) for x in jax.tree.leaves(state))
