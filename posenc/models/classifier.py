"""Sequence classification and regression over the bidirectional stack (BERT's fine-tuning,
Devlin et al. 2019, Sec. 3.2): the masked-LM model's parts, a segment embedding and a pooled
head instead of the output projection.

The shared parts carry the names the decoder-only :class:`~posenc.models.lm.Transformer` gives
them (``embed``, ``embed_norm``, ``shared_pos_params``, ``blocks``, ``final_norm``), so the
parameters of a masked-LM run (or of a model imported into one) initialise them one for one
(``train.init_from``); the classifier's own parts (:data:`OWN_PARTS`: the segment embedding and
the head) start fresh, and the LM's output projection is not used.

Inputs are right-padded rows ``[CLS] a [SEP] (b [SEP])``; ``mask`` marks the real tokens.
Padding is removed from every attention exactly (``k_valid``), its token embeddings are zeroed
(an input term that reads neighbours, conv, sees zeros as at a sequence end), and mean pooling
averages over the real tokens only: a padded row is classified as the unpadded row is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from posenc.encodings.base import Encoding
from posenc.layers.block import dropout
from posenc.layers.config import ModelConfig
from posenc.layers.embed import TokenEmbedding
from posenc.layers.norms import model_norm
from posenc.layers.pattern import LayerKind
from posenc.layers.pool import HeadConfig, PooledHead, SegmentEmbedding
from posenc.models.lm import Stack, bind_encoding, default_positions

# The classifier's parameters that no language model has: they start fresh under init_from.
OWN_PARTS = ("segment_embed", "head")


class Classifier(Stack):
    """A bidirectional stack with a pooled classification (or regression) head.

    Args:
      config: shape, numerics and architecture options; ``causal`` must be False (every token
        reads both sides, as in BERT) and ``mem_len`` 0.
      encoding: an unbound encoder; causal-only encoders are refused.
      head: the head's options (labels, pooling, segments).
      rngs: parameter initialisation streams.
    """

    def __init__(
        self,
        config: ModelConfig,
        encoding: Encoding,
        head: HeadConfig,
        *,
        rngs: nnx.Rngs,
        layers: tuple[LayerKind, ...] | None = None,
    ):
        if config.output_softcap:
            raise ValueError(
                "model.output_softcap caps a language model's output logits; the classifier "
                "has none (set it to 0)"
            )
        if config.output_logit_scale != 1.0:
            raise ValueError(
                "model.output_logit_scale scales a language model's output logits; the "
                "classifier has none (set it to 1)"
            )
        if config.causal:
            raise ValueError(
                "model.assembly='classifier' needs model.causal=False: the classifier reads every "
                "token in both directions, as the masked-LM model it is fine-tuned from"
            )
        if config.mem_len:
            raise ValueError("model.mem_len: Transformer-XL memory is for the decoder-only model")
        encoding = bind_encoding(encoding, config, causal=False)
        self.config = config
        self.encoding = encoding
        # The Transformer's construction order for the shared parts, then the classifier's own.
        self.embed = TokenEmbedding(
            config.vocab_size, config.model_dim, scale=config.scale_embeddings, rngs=rngs
        )
        self.embed_norm = model_norm(config, rngs) if config.embed_norm else None
        super().__init__(
            config,
            encoding,
            num_layers=config.num_layers,
            causal=False,
            rngs=rngs,
            layers=layers,
        )
        self.final_norm = model_norm(config, rngs) if config.norm_position != "post" else None
        self.segment_embed = (
            SegmentEmbedding(head.num_segments, config.model_dim, rngs=rngs)
            if head.num_segments
            else None
        )
        self.head = PooledHead(config.model_dim, head, jnp.dtype(config.dtype), rngs=rngs)

    def __call__(
        self,
        tokens: jax.Array,
        segments: jax.Array | None = None,
        mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """Class logits (or regression outputs) of each row.

        Args:
          tokens: ``[B, T]`` token ids, right-padded.
          segments: ``[B, T]`` segment ids in ``[0, num_segments)``; None: all 0.
          mask: ``[B, T]`` bool, the real tokens; None: all.
          positions: integer positions ``[B|1, T]``; default ``arange(T)``.
          rng: the training key (dropout); None for a deterministic pass.

        Returns:
          ``[B, num_labels]`` float32.
        """
        return self.head(
            self.encode(tokens, segments, mask, positions, rng=rng), self._mask(tokens, mask)
        )

    def encode(
        self,
        tokens: jax.Array,
        segments: jax.Array | None = None,
        mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        *,
        rng: jax.Array | None = None,
    ) -> jax.Array:
        """The final states ``[B, T, D]`` float32 (after the final norm); arguments as for
        :meth:`__call__`."""
        config = self.config
        mask = self._mask(tokens, mask)
        given = default_positions(self.encoding, positions, tokens.shape[1])  # [B|1, T]
        tokens_x = self.embed(tokens)  # [B, T, D] float32
        if self.segment_embed is not None:
            segs = jnp.zeros_like(tokens) if segments is None else segments
            tokens_x = tokens_x + self.segment_embed(segs)
        tokens_x = tokens_x * mask[:, :, None]  # padding reads as zeros (conv)
        x = self.input_terms(tokens_x, given, rng)
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        rngs = jax.random.split(rng, config.num_layers + 1) if rng is not None else None
        x = dropout(x, config.dropout, None if rngs is None else rngs[-1])
        positions, shared = given.astype(jnp.int32), self.layer_shared()
        for i, block in enumerate(self.blocks):
            x = block(x, positions, shared[i], None if rngs is None else rngs[i], k_valid=mask)
        return x if self.final_norm is None else self.final_norm(x)

    @staticmethod
    def _mask(tokens: jax.Array, mask: jax.Array | None) -> jax.Array:
        return jnp.ones(tokens.shape, bool) if mask is None else jnp.asarray(mask, bool)

    def num_params(self) -> int:
        """Number of learned parameters (encoder parameters included)."""
        state = nnx.state(self, nnx.Param)
        return sum(int(x.size) for x in jax.tree.leaves(state))
