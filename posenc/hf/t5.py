"""T5 and Flan-T5 on posenc's encoder-decoder: T5's bucketed relative bias (posenc's ``t5``
encoder: one table per stack, from the stack's first layer, shared by all its layers;
bidirectional buckets in the encoder, causal ones in the decoder), RMSNorm without a mean,
pre-norm, no biases, a ReLU MLP (T5 v1.0) or a gated GELU one (T5 v1.1, Flan-T5: ``geglu``).

Two of T5's differences are folded into the weights, so posenc's model needs no option for them:

- T5 does not divide the attention logits by ``sqrt(Dh)`` (the scale is in its initialisation);
  posenc does, so the query projections are multiplied by ``sqrt(Dh)`` at import (and divided
  at export).
- T5 v1.0 (tied head) multiplies the decoder output by ``D^-1/2`` before the tied head; that
  is folded into the decoder's final norm scale.

=======================================================  ====================================
Hugging Face                                             posenc
=======================================================  ====================================
``shared.weight``                                        ``embed.embedding`` (both stacks)
``encoder.block.i.layer.0.SelfAttention.{q,k,v,o}``      ``encoder.blocks.i.attn.{q,k,v,o}``
``encoder.block.0.layer.0.SelfAttention.``               ``encoder.shared_pos_params.table``
``relative_attention_bias.weight [buckets, H]``
``encoder.block.i.layer.1.DenseReluDense``               ``encoder.blocks.i.mlp``
``decoder.block.i.layer.1.EncDecAttention``              ``decoder.blocks.i.cross_attn``
``decoder.block.i.layer.2.DenseReluDense``               ``decoder.blocks.i.mlp``
``{encoder,decoder}.final_layer_norm``                   ``encoder_norm``, ``decoder_norm``
``lm_head.weight``                                       ``unembed.kernel`` (Flan-T5)
=======================================================  ====================================
"""

from __future__ import annotations

import math
from typing import Any

from posenc.hf.family import (
    Family,
    Path,
    Rule,
    Spec,
    common_misfits,
    copy,
    embeddings,
    heads_in,
    heads_out,
    hf_tied,
    linear,
    read_sizes,
    register,
    write_sizes,
)
from posenc.hf.fields import HFConfig
from posenc.layers.config import ModelConfig

# feed_forward_proj -> posenc's MLP kind.
_MLPS = {"relu": "relu", "gated-gelu": "geglu", "gelu": "gelu_exact"}
# T5 was pretrained on 512-token inputs.
_TRAIN_LEN = 512
# config.json key -> ModelConfig field; besides these, d_kv is the head width, and num_layers
# the encoder's depth, which the decoder's (num_decoder_layers) defaults to.
_SIZES = {
    "vocab_size": "vocab_size",
    "d_model": "model_dim",
    "d_ff": "mlp_dim",
    "num_heads": "num_heads",
}


@register
class T5(Family):
    name = "t5"
    model_types = ("t5",)
    export_type = "t5"
    export_architecture = "T5ForConditionalGeneration"
    # Copies of shared.weight that older files hold for each stack.
    ignored_suffixes = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        kind = _MLPS[hf.expect("feed_forward_proj", tuple(_MLPS), "relu")]
        hf.ignore("dense_act_fn", "is_gated_act")  # transformers derives both from the above
        hf.expect("is_encoder_decoder", (True,), True)
        hf.expect("is_decoder", (False,), False)
        tied_config = hf.take("tie_word_embeddings", True)
        # transformers 5 writes the flag; for older files a tied config means scaled outputs.
        scale_outputs = hf.take("scale_decoder_outputs", tied_config is not False)
        layers = hf.take("num_layers")
        model = ModelConfig(
            **read_sizes(hf, _SIZES),
            head_dim=hf.take("d_kv"),
            num_layers=hf.take("num_decoder_layers", layers),
            num_encoder_layers=layers,
            norm="rmsnorm",
            dtype="float32",
            tie_embeddings="lm_head.weight" not in names,
            mlp=kind,
            mlp_bias=False,
            norm_eps=float(hf.take("layer_norm_epsilon")),
            scale_embeddings=False,
            share_embeddings=True,
        )
        hparams = {
            "num_buckets": hf.take("relative_attention_num_buckets"),
            "max_distance": hf.take("relative_attention_max_distance"),
        }
        extra = {"scale_decoder_outputs": bool(scale_outputs)}
        return Spec(model, "encoder_decoder", "t5", hparams, _TRAIN_LEN, extra)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, dh = m.model_dim, m.num_heads, m.dims.head_dim
        rules = embeddings(spec, "shared.weight", "lm_head.weight")
        buckets = spec.hparams.get("num_buckets", 32)
        for stack, layers in (("encoder", m.encoder_layers), ("decoder", m.num_layers)):
            bias = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            rules.append(copy(bias, (stack, "shared_pos_params", "table"), (buckets, h)))
            for i in range(layers):
                hf, at = f"{stack}.block.{i}.layer.", (stack, "blocks", i)
                rules += _attention(hf + "0.SelfAttention.", (*at, "attn"), d, h, dh)
                rules.append(copy(hf + "0.layer_norm.weight", (*at, "attn_norm", "scale"), (d,)))
                mlp = 1
                if stack == "decoder":
                    rules += _attention(hf + "1.EncDecAttention.", (*at, "cross_attn"), d, h, dh)
                    rules.append(
                        copy(hf + "1.layer_norm.weight", (*at, "cross_norm", "scale"), (d,))
                    )
                    mlp = 2
                rules += _mlp(f"{hf}{mlp}.DenseReluDense.", (*at, "mlp"), d, m.mlp_dim, m.mlp)
                rules.append(copy(f"{hf}{mlp}.layer_norm.weight", (*at, "mlp_norm", "scale"), (d,)))
            rules.append(copy(f"{stack}.final_layer_norm.weight", (f"{stack}_norm", "scale"), (d,)))
        if self._scales_outputs(spec):  # D^-1/2 before the tied head, folded into the norm
            name, path, shape = rules[-1].hf, rules[-1].paths[0], (d,)
            rules[-1] = copy(name, path, shape, scale=1.0 / math.sqrt(d))
        return rules

    @staticmethod
    def _scales_outputs(spec: Spec) -> bool:
        return spec.extra.get("scale_decoder_outputs", hf_tied(spec))

    def fits(self, spec: Spec) -> list[str]:
        return common_misfits(
            spec,
            self.name,
            assembly="encoder_decoder",
            encoding="t5",
            norm="rmsnorm",
            mlp=tuple(_MLPS.values()),
            mlp_bias=False,
            qkv_bias=False,
            out_bias=False,
            norm_position="pre",
            share_embeddings=True,
            num_kv_heads=(None, spec.model.num_heads),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            **write_sizes(m, _SIZES),
            "d_kv": m.dims.head_dim,
            "num_layers": m.encoder_layers,
            "num_decoder_layers": m.num_layers,
            "relative_attention_num_buckets": spec.hparams.get("num_buckets", 32),
            "relative_attention_max_distance": spec.hparams.get("max_distance", 128),
            "layer_norm_epsilon": m.norm_eps,
            "feed_forward_proj": {v: k for k, v in _MLPS.items()}[m.mlp],
            # transformers 4 and 5 both read a tied config as "scale the decoder output".
            "tie_word_embeddings": self._scales_outputs(spec),
            "is_encoder_decoder": True,
            "decoder_start_token_id": 0,
        }


def _attention(hf: str, at: Path, d: int, h: int, dh: int) -> list[Rule]:
    """T5's q, k, v, o (no biases); the query carries the ``sqrt(Dh)`` posenc divides by."""
    return [
        heads_in(hf + "q.weight", (*at, "q"), d, h, dh, scale=math.sqrt(dh)),
        heads_in(hf + "k.weight", (*at, "k"), d, h, dh),
        heads_in(hf + "v.weight", (*at, "v"), d, h, dh),
        heads_out(hf + "o.weight", (*at, "o"), h, dh, d),
    ]


def _mlp(hf: str, at: Path, d: int, f: int, kind: str) -> list[Rule]:
    """``wi`` (or the gated ``wi_0``, ``wi_1``) and ``wo``."""
    rules = [linear(hf + "wo.weight", (*at, "wo", "kernel"), f, d)]
    if kind == "geglu":  # wi_0 goes through the GELU (posenc's gate), wi_1 is linear
        rules.append(linear(hf + "wi_0.weight", (*at, "wg", "kernel"), d, f))
        rules.append(linear(hf + "wi_1.weight", (*at, "wi", "kernel"), d, f))
    else:
        rules.append(linear(hf + "wi.weight", (*at, "wi", "kernel"), d, f))
    return rules
