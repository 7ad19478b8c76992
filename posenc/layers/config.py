"""The shape, numerics and architecture options shared by posenc's parts and assemblies.

Options name mechanisms, never model families (``mlp="swiglu"``, ``residual="parallel"``,
``norm_position="post"``); each default is posenc's own decoder-only model, so a config that
sets none of them builds exactly that model.
"""

from __future__ import annotations

import dataclasses
import math

from posenc.attention.core import IMPLEMENTATIONS
from posenc.attention.options import OPTION_FIELDS, AttentionOptions
from posenc.encodings.base import Dims
from posenc.layers.mlp import ACTIVATIONS as HEAD_ACTIVATIONS
from posenc.layers.mlp import MLP_KINDS
from posenc.layers.norms import NORMS

DTYPES = ("bfloat16", "float32", "float16")
NORM_POSITIONS = ("pre", "post", "sandwich", "post_branch")
RESIDUALS = ("sequential", "parallel", "parallel_shared_norm")
# Rematerialisation of each block in the backward pass (posenc.layers.block.REMAT_POLICIES).
REMATS = ("none", "full", "dots")
# Bytes of float32 logits the loss forms at once by default (model.loss_chunk None,
# posenc.models.losses.chunked_token_losses): 682 tokens of a 49,152-token vocabulary, 130,561 of
# posenc's 257 byte ids (so byte-level batches are not chunked).
LOSS_CHUNK_BYTES = 2**27


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the transformer.

    Attributes:
      vocab_size: token ids are in ``[0, vocab_size)`` (257 for bytes plus a separator).
      num_layers: transformer blocks (the decoder's, in an encoder-decoder).
      model_dim: residual stream width ``D``.
      num_heads: attention heads ``H``; ``head_dim = model_dim // num_heads`` unless given.
      mlp_dim: hidden width of the MLP.
      head_dim: per-head width; None derives it from ``model_dim // num_heads``.
      dropout: dropout rate on the embeddings and residual branches.
      norm: ``"layernorm"``, ``"rmsnorm"`` or ``"layernorm_nobias"``
        (:mod:`posenc.layers.norms`).
      dtype: compute dtype of the matmuls.
      tie_embeddings: reuse the token embedding as the output projection.
      attention_impl: an attention path, see :mod:`posenc.attention.core`.
      attention_block_size: query block of the ``blocked`` path and the ``auto`` threshold;
        the chunk of the linear paths' causal prefix sums.
      performer_features: random features per head of the ``linear_performer`` path (FAVOR+'s
        ``m``), fixed per layer (:mod:`posenc.attention.linear`).
      causal: mask keys after the query (a decoder, for causal LM); False runs attention
        unmasked on every path (a bidirectional encoder, for masked LM).
      mem_len: Transformer-XL memory: the number of earlier tokens whose per-layer states a
        call with memory keeps for the next segment (Dai et al. 2019, Sec. 3.2); 0: none.
      num_kv_heads: key/value heads (grouped-query attention, Ainslie et al. 2023): each
        group of ``num_heads / num_kv_heads`` query heads shares one; None: ``num_heads``.
      qkv_bias: biases on the query, key and value projections.
      out_bias: a bias on the attention output projection.
      mlp: the MLP kind (:data:`posenc.layers.mlp.MLP_KINDS`).
      mlp_bias: biases on the MLP's projections.
      norm_position: where each sublayer's norms sit (:mod:`posenc.layers.block`): ``"pre"``
        (``x + f(norm(x))``, and a final norm), ``"post"`` (``norm(x + f(x))``, as Vaswani et
        al. and BERT; no final norm), ``"sandwich"`` (``x + norm_out(f(norm_in(x)))``, a norm
        before and after each sublayer, and a final norm: Gemma 2 and 3) or ``"post_branch"``
        (``x + norm(f(x))``, the sublayer's output normed before the residual add, its input
        not: OLMo 2 and 3; and a final norm).
      residual: ``"sequential"`` (attention, then the MLP on its output), ``"parallel"``
        (``x + attn(norm1(x)) + mlp(norm2(x))``, as GPT-NeoX) or ``"parallel_shared_norm"``
        (``x + attn(h) + mlp(h)``, ``h = norm(x)``: one norm for both, as GPT-J and Cohere).
      norm_eps: the norms' epsilon.
      scale_embeddings: multiply token embeddings by ``sqrt(D)`` (Vaswani et al.).
      norm_unit_offset: every norm (QK-norm's learned scales too) multiplies by
        ``1 + scale`` instead of ``scale``, the scale starting at 0 (Gemma's RMSNorm): the same
        functions, with the parameter stored as the offset from 1
        (:class:`posenc.layers.norms.UnitOffsetNorm`).
      output_softcap: ``cap * tanh(logits / cap)`` on the output logits (Gemma 2's
        ``final_logit_softcapping=30``); 0: none. Decoder-only model only.
      embed_norm: a norm on the embeddings before the first block (BLOOM, BERT).
      num_encoder_layers: the encoder's blocks in an encoder-decoder (None: ``num_layers``);
        unused by the decoder-only model.
      share_embeddings: an encoder-decoder's source and target share one token table (a joint
        vocabulary, as Vaswani et al.); unused by the decoder-only model.
      head_transform: None, or an activation of :data:`HEAD_ACTIVATIONS`: before the output
        projection, a biased dense ``D -> D``, that activation and a norm (the masked-LM head of
        BERT and RoBERTa); decoder-only model only.
      output_bias: a bias ``[V]`` added to the output logits (BERT's and RoBERTa's head);
        decoder-only model only.
      remat: what each block keeps for the backward pass (:data:`REMATS`): ``"none"`` every
        intermediate; ``"full"`` only its input, recomputing the block in the backward pass;
        ``"dots"`` the outputs of the weight matmuls (projections and MLP), recomputing
        attention and the elementwise ops. It changes memory and time, never the numbers.
      loss_chunk: tokens (rows x positions) whose logits the loss forms at once
        (:func:`posenc.models.losses.chunked_token_losses`), in training and evaluation; 0:
        the whole batch's; None: as many as :data:`LOSS_CHUNK_BYTES` of float32 logits hold
        (:attr:`loss_chunk_tokens`). It changes memory, and the losses only in float rounding.
      window, sinks, qk_norm, qk_norm_placement, softcap, logit_scale, temperature_floor,
        temperature_scale, ssmax: every layer's attention options
        (:class:`posenc.attention.options.AttentionOptions`; a layer kind of ``config.layers``
        may override each); the defaults change nothing.
      output_logit_scale: a factor on the output logits, after the output projection and bias
        (Cohere's ``logit_scale``, 0.0625 in Command R7B); 1: none.
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
    num_kv_heads: int | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    mlp: str = "gelu"
    mlp_bias: bool = True
    norm_position: str = "pre"
    residual: str = "sequential"
    norm_eps: float = 1e-6
    scale_embeddings: bool = True
    norm_unit_offset: bool = False
    output_softcap: float = 0.0
    embed_norm: bool = False
    num_encoder_layers: int | None = None
    share_embeddings: bool = True
    head_transform: str | None = None
    output_bias: bool = False
    remat: str = "none"
    loss_chunk: int | None = None
    window: str = "full"
    sinks: bool = False
    qk_norm: str = "none"
    qk_norm_placement: str = "before_rotate"
    softcap: float = 0.0
    logit_scale: float = 0.0
    temperature_floor: int = 0
    temperature_scale: float = 0.1
    ssmax: bool = False
    # issue 32 (pretrained families): the model's own options beyond the attention's.
    output_logit_scale: float = 1.0

    def __post_init__(self):
        positive = ("vocab_size", "num_layers", "model_dim", "num_heads", "mlp_dim")
        for field in (*positive, "performer_features"):
            _require_positive(field, getattr(self, field))
        for field in ("head_dim", "num_kv_heads", "num_encoder_layers"):
            if getattr(self, field) is not None:
                _require_positive(field, getattr(self, field))
        if self.head_dim is None and self.model_dim % self.num_heads:
            raise ValueError(
                f"model.model_dim={self.model_dim} is not divisible by model.num_heads="
                f"{self.num_heads}; change one of them or set model.head_dim"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(
                f"model.num_kv_heads={self.num_kv_heads} must divide model.num_heads="
                f"{self.num_heads} (each key/value head serves a group of query heads)"
            )
        for field in ("mem_len", "loss_chunk"):
            value = getattr(self, field)
            if field == "loss_chunk" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"model.{field} must be an integer >= 0, got {value!r}")
        for field in (
            "causal",
            "tie_embeddings",
            "qkv_bias",
            "out_bias",
            "mlp_bias",
            "scale_embeddings",
            "norm_unit_offset",
            "embed_norm",
            "share_embeddings",
            "output_bias",
        ):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(
                    f"model.{field} must be True or False, got {getattr(self, field)!r}"
                )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.norm_eps, int | float) or not self.norm_eps > 0:
            raise ValueError(f"model.norm_eps must be a positive number, got {self.norm_eps!r}")
        cap = self.output_softcap
        if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0 <= cap < math.inf:
            raise ValueError(
                f"model.output_softcap must be a finite number >= 0 (0: off), got {cap!r}"
            )
        for field, allowed in (
            ("norm", NORMS),
            ("dtype", DTYPES),
            ("attention_impl", IMPLEMENTATIONS),
            ("mlp", MLP_KINDS),
            ("norm_position", NORM_POSITIONS),
            ("residual", RESIDUALS),
            ("remat", REMATS),
        ):
            if getattr(self, field) not in allowed:
                raise ValueError(
                    f"model.{field} must be one of {list(allowed)}, got {getattr(self, field)!r}"
                )
        if self.head_transform is not None and self.head_transform not in HEAD_ACTIVATIONS:
            raise ValueError(
                f"model.head_transform must be None or one of {list(HEAD_ACTIVATIONS)}, got "
                f"{self.head_transform!r}"
            )
        self.attention_options()  # checks the options, naming model.<field>
        if self.residual != "sequential" and self.norm_position != "pre":
            raise ValueError(
                f"model.residual={self.residual!r} needs model.norm_position='pre' (a parallel "
                f"block norms its input once for both branches), got {self.norm_position!r}"
            )
        scale = self.output_logit_scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, int | float)
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise ValueError(
                f"model.output_logit_scale must be a finite number > 0 (1: none), got {scale!r}"
            )

    def attention_options(self, **overrides: object) -> AttentionOptions:
        """Every layer's attention options, with a layer kind's ``overrides`` (their errors name
        ``prefix``, ``model`` by default)."""
        fields = {name: getattr(self, name) for name in OPTION_FIELDS}
        prefix = overrides.pop("prefix", "model")
        return AttentionOptions(**{**fields, **overrides}, prefix=prefix)

    @property
    def dims(self) -> Dims:
        head_dim = self.head_dim or self.model_dim // self.num_heads
        return Dims(num_heads=self.num_heads, head_dim=head_dim, model_dim=self.model_dim)

    @property
    def loss_chunk_tokens(self) -> int:
        """Tokens whose logits the loss forms at once: ``loss_chunk``, or for None as many as
        :data:`LOSS_CHUNK_BYTES` of float32 logits hold (0: all of a batch's)."""
        if self.loss_chunk is not None:
            return self.loss_chunk
        return max(1, LOSS_CHUNK_BYTES // (4 * self.vocab_size))

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``num_heads`` unless grouped-query attention)."""
        return self.num_kv_heads or self.num_heads

    @property
    def encoder_layers(self) -> int:
        """The encoder's blocks in an encoder-decoder."""
        return self.num_encoder_layers or self.num_layers


def _require_positive(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"model.{field} must be a positive integer, got {value!r}")
