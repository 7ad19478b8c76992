"""The encoder-decoder transformer (Vaswani et al. 2017; T5's layout, Raffel et al. 2020).

A bidirectional encoder stack reads the source; a causal decoder stack reads the target and, in
every block, attends to the encoder output (cross-attention). Both stacks are built from the
same parts as the decoder-only model (:class:`~posenc.models.lm.Stack` of
:class:`~posenc.layers.block.Block`), pre-norm by default with a final norm on each side, and an
output projection tied to the target embedding (``tie_embeddings``). Source and target share one
token table when ``share_embeddings`` (a joint vocabulary), else each has its own.

Positions: the config's one encoder serves both stacks in the form each direction needs
(:meth:`posenc.encodings.base.Encoding.for_direction`: T5's bidirectional buckets in the encoder,
causal ones in the decoder; conv's centred and causal convolutions), each stack with its own
parameters (T5 keeps separate encoder and decoder bias tables). Causal-only encoders (FoX, CoPE)
cannot serve the encoder and are refused at construction. Cross-attention carries no positional
term (:mod:`posenc.layers.attention`).

Padding: sources are right-padded and ``src_mask`` marks the real tokens. Padded tokens are
removed from every encoder attention and from cross-attention exactly (``attend``'s
``k_valid``), and their token embeddings are zeroed before input terms that read neighbours
(conv), so a padded source gives the real tokens the outputs the unpadded source gives them.
Targets are right-padded too; the decoder is causal, so padding after a token never reaches it.

Decoding (:mod:`posenc.decoding`): :meth:`EncoderDecoder.encode` once, :meth:`cross_caches`
once, then :meth:`decode` one token at a time against self-attention caches.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.encodings.base import Encoding
from posenc.layers.block import dropout
from posenc.layers.cache import CrossCache, LayerCache
from posenc.layers.config import ModelConfig
from posenc.layers.embed import TokenEmbedding, make_unembed, output_logits
from posenc.layers.norms import model_norm
from posenc.models.lm import Stack, bind_encoding, default_positions
from posenc.models.losses import TokenLosses, chunked_token_losses


def bind_sides(config: ModelConfig, encoding: Encoding) -> tuple[Encoding, Encoding]:
    """The encoder bound for each stack: its bidirectional form for the encoder, its causal
    form for the decoder (:meth:`~posenc.encodings.base.Encoding.for_direction`), each checked
    as the decoder-only model checks it; one-line errors naming the side."""
    sides = []
    for side, causal in (("encoder", False), ("decoder", True)):
        try:
            sides.append(bind_encoding(encoding.for_direction(causal), config, causal=causal))
        except ValueError as e:
            raise ValueError(f"model.assembly='encoder_decoder', {side} side: {e}") from None
    return sides[0], sides[1]


class EncoderDecoder(nnx.Module):
    """Encoder-decoder transformer around one positional encoder (module docstring).

    Args:
      config: shape, numerics and architecture options (``num_encoder_layers``,
        ``share_embeddings``; ``causal`` and ``mem_len`` do not apply).
      encoding: an unbound encoder; each stack binds the form its direction needs.
      rngs: parameter initialisation RNG streams.
    """

    def __init__(self, config: ModelConfig, encoding: Encoding, *, rngs: nnx.Rngs):
        if config.mem_len:
            raise ValueError("model.mem_len: Transformer-XL memory is for the decoder-only model")
        if config.embed_norm:
            raise ValueError("model.embed_norm: the encoder-decoder has no embedding norm")
        if config.head_transform or config.output_bias:
            raise ValueError(
                "model.head_transform and model.output_bias are a masked-LM head's; the "
                "encoder-decoder has none"
            )
        if config.output_softcap:
            raise ValueError(
                "model.output_softcap caps the decoder-only model's output logits; the "
                "encoder-decoder has none (set it to 0)"
            )
        if config.output_logit_scale != 1.0:
            raise ValueError(
                "model.output_logit_scale scales the decoder-only model's output logits; the "
                "encoder-decoder has none (set it to 1)"
            )
        enc, dec = bind_sides(config, encoding)
        self.config = config
        # The config's encoder (in the decoder's form; both sides have the same hooks).
        self.encoding = dec
        dtype = jnp.dtype(config.dtype)

        def norm():
            return model_norm(config, rngs)

        pre = config.norm_position != "post"  # a final norm on each stack
        self.embed = TokenEmbedding(
            config.vocab_size, config.model_dim, scale=config.scale_embeddings, rngs=rngs
        )
        self.src_embed = (
            None
            if config.share_embeddings
            else TokenEmbedding(
                config.vocab_size, config.model_dim, scale=config.scale_embeddings, rngs=rngs
            )
        )
        self.encoder = Stack(config, enc, num_layers=config.encoder_layers, causal=False, rngs=rngs)
        self.encoder_norm = norm() if pre else None
        self.decoder = Stack(
            config, dec, num_layers=config.num_layers, causal=True, cross=True, rngs=rngs
        )
        self.decoder_norm = norm() if pre else None
        self.unembed = (
            None
            if config.tie_embeddings
            else make_unembed(config.model_dim, config.vocab_size, dtype, rngs)
        )

    def __call__(
        self,
        src: jax.Array,
        tgt: jax.Array,
        *,
        src_mask: jax.Array | None = None,
        src_positions: jax.Array | None = None,
        tgt_positions: jax.Array | None = None,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """The decoder's next-token logits under teacher forcing.

        Args:
          src: ``[B, S]`` source token ids, right-padded.
          tgt: ``[B, T]`` decoder input ids (BOS + target), right-padded.
          src_mask: ``[B, S]`` bool, the real source tokens; None: all.
          src_positions, tgt_positions: integer positions ``[B|1, S]``, ``[B|1, T]``;
            default ``arange``.
          rng: the training key (dropout); None for a deterministic pass.

        Returns:
          ``[B, T, vocab_size]`` float32 logits.
        """
        return self.head(
            self.hidden_states(
                src,
                tgt,
                src_mask=src_mask,
                src_positions=src_positions,
                tgt_positions=tgt_positions,
                rng=rng,
            )
        )

    def hidden_states(
        self,
        src: jax.Array,
        tgt: jax.Array,
        *,
        src_mask: jax.Array | None = None,
        src_positions: jax.Array | None = None,
        tgt_positions: jax.Array | None = None,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """The decoder's last block output ``[B, T, D]`` float32 under teacher forcing, before
        :meth:`head` (what :meth:`token_losses` reads); arguments as for :meth:`__call__`."""
        enc_rng, dec_rng = jax.random.split(rng) if rng is not None else (None, None)
        encoded, src_mask = self.encode(src, src_mask, src_positions, rng=enc_rng)
        cross = self.cross_caches(encoded, src_mask)
        return self._decoder_blocks(tgt, cross, tgt_positions, dec_rng)[0]

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
        (:func:`posenc.models.losses.chunked_token_losses`)."""
        return chunked_token_losses(
            hidden,
            targets,
            self.head,
            chunk=self.config.loss_chunk_tokens,
            smoothing=smoothing,
            correct=correct,
        )

    def encode(
        self,
        src: jax.Array,
        src_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """The encoder output ``[B, S, D]`` float32 (after its final norm) and the source mask
        ``[B, S]`` bool (all True when None was given); arguments as for :meth:`__call__`."""
        config, stack = self.config, self.encoder
        b, s = src.shape
        src_mask = jnp.ones((b, s), bool) if src_mask is None else jnp.asarray(src_mask, bool)
        given = default_positions(stack.encoding, positions, s)
        positions = given.astype(jnp.int32)
        table = self.embed if self.src_embed is None else self.src_embed
        tokens_x = table(src) * src_mask[:, :, None]  # padding reads as zeros (conv)
        x = stack.input_terms(tokens_x, given, rng)
        rngs = jax.random.split(rng, len(stack.blocks) + 1) if rng is not None else None
        x = dropout(x, config.dropout, None if rngs is None else rngs[-1])
        shared = stack.shared()
        for i, block in enumerate(stack.blocks):
            x = block(x, positions, shared, None if rngs is None else rngs[i], k_valid=src_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, src_mask

    def cross_caches(self, encoded: jax.Array, src_mask: jax.Array) -> list[CrossCache]:
        """Each decoder layer's cross-attention keys and values over ``encoded [B, S, D]``."""
        return [block.cross_attn.kv(encoded, src_mask) for block in self.decoder.blocks]

    def decode_forward(
        self,
        tgt: jax.Array,
        cross: list[CrossCache],
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> tuple[jax.Array, list[LayerCache]]:
        """The decoder over a whole target window: logits ``[B, T, V]`` float32 and each
        layer's :class:`LayerCache` (the prefill of a cached decoder)."""
        x, caches = self._decoder_blocks(tgt, cross, positions, rng)
        return self.head(x), caches

    def _decoder_blocks(
        self,
        tgt: jax.Array,
        cross: list[CrossCache],
        positions: jax.Array | None,
        rng: jax.Array | None,
    ) -> tuple[jax.Array, list[LayerCache]]:
        """The decoder's last block output and each layer's cache (before the head)."""
        config, stack = self.config, self.decoder
        given = default_positions(stack.encoding, positions, tgt.shape[1])
        positions = given.astype(jnp.int32)
        x = stack.input_terms(self.embed(tgt), given, rng)
        rngs = jax.random.split(rng, len(stack.blocks) + 1) if rng is not None else None
        x = dropout(x, config.dropout, None if rngs is None else rngs[-1])
        shared = stack.shared()
        caches = []
        for i, (block, c) in enumerate(zip(stack.blocks, cross, strict=True)):
            x, cache = block.forward(
                x, positions, shared, None if rngs is None else rngs[i], cross=c
            )
            caches.append(cache)
        return x, caches

    def decode(
        self,
        tokens: jax.Array,
        slot: jax.Array | int,
        positions: jax.Array,
        caches: list[LayerCache],
        cross: list[CrossCache],
    ) -> tuple[jax.Array, list[LayerCache]]:
        """Logits ``[B, 1, V]`` of the decoder input at ``slot`` of the token buffer
        ``tokens [B, S]`` (filled up to and including ``slot``), against self-attention caches
        filled before ``slot`` and the cross-attention caches; returns the updated caches (as
        :meth:`posenc.models.lm.Transformer.decode`)."""
        stack = self.decoder
        positions = jnp.atleast_2d(positions).astype(jnp.int32)  # [B|1, S]
        x = stack.input_terms(self.embed(tokens), positions, None)  # [B, S, D]
        x = jax.lax.dynamic_slice_in_dim(x, slot, 1, axis=1)  # [B, 1, D]
        k_valid = jnp.arange(tokens.shape[1])[None, :] <= slot  # [1, S]
        shared = stack.shared()
        new_caches = []
        for block, cache, c in zip(stack.blocks, caches, cross, strict=True):
            x, cache = block.decode(x, cache, slot, positions, k_valid, shared, cross=c)
            new_caches.append(cache)
        return self.head(x), new_caches

    def empty_caches(self, batch: int, slots: int) -> list[LayerCache]:
        """Zeroed self-attention caches of ``slots`` tokens for :meth:`decode`, compute dtype."""
        c, dims = self.config, self.config.dims
        dtype = jnp.dtype(c.dtype)
        kv = (batch, slots, c.kv_heads, dims.head_dim)
        h = jnp.zeros((batch, slots, c.model_dim), dtype)
        return [LayerCache(h=h, k=jnp.zeros(kv, dtype), v=jnp.zeros(kv, dtype))] * c.num_layers

    def head(self, x: jax.Array) -> jax.Array:
        """The decoder's final norm and output projection: ``[B, T, D]`` -> ``[B, T, V]``."""
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return output_logits(x, self.embed, self.unembed, jnp.dtype(self.config.dtype))

    def num_params(self) -> int:
        """Number of learned parameters (encoder parameters included)."""
        state = nnx.state(self, nnx.Param)
        return sum(int(x.size) for x in jax.tree.leaves(state))
