"""BLOOM: ALiBi (posenc's ``alibi`` encoder: BLOOM's slopes are ALiBi's, including the rule for
head counts that are not powers of two), a LayerNorm on the embeddings (``embed_norm``), a fused
per-head ``query_key_value``, biases, a tanh-GELU MLP of width ``4 D``, tied embeddings.

====================================================  ======================================
Hugging Face (``transformer.h.i.``)                   posenc (``blocks.i.``)
====================================================  ======================================
``word_embeddings``, ``word_embeddings_layernorm``    ``embed.embedding``, ``embed_norm``
``input_layernorm``, ``post_attention_layernorm``     ``attn_norm``, ``mlp_norm``
``self_attention.query_key_value [3 H Dh, D]``        ``attn.{q,k,v}`` (rows per head: q, k, v)
``self_attention.dense``                              ``attn.o``, ``attn.o_bias``
``mlp.dense_h_to_4h``, ``mlp.dense_4h_to_h``          ``mlp.wi``, ``mlp.wo``
``ln_f``                                              ``final_norm``
====================================================  ======================================

BLOOM adds ``m_h * j`` to the logit of key ``j`` where posenc's ALiBi adds ``-m_h (i - j)``: the
two differ by ``m_h * i``, the same for every key of query ``i``, which softmax removes.
"""

from __future__ import annotations

from typing import Any

from posenc.hf.family import (
    Family,
    Rule,
    Spec,
    common_misfits,
    copy,
    dense,
    embeddings,
    fused_per_head,
    heads_out,
    hf_tied,
    layernorm,
    prefix_of,
    register,
    untied,
    zero_attention_biases,
)
from posenc.hf.fields import HFConfig
from posenc.layers.config import ModelConfig

# BLOOM trained at 2048 tokens; its configs do not always say so (seq_length when they do).
_TRAIN_LEN = 2048


@register
class Bloom(Family):
    name = "bloom"
    model_types = ("bloom",)
    export_type = "bloom"
    export_architecture = "BloomForCausalLM"

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        d = hf.take("hidden_size", None) or hf.take("n_embed")
        hf.ignore("hidden_size", "n_embed")
        h = hf.take("n_head")
        hf.expect("apply_residual_connection_post_layernorm", (False,), False)
        hf.expect("slow_but_exact", (False,), False)
        hf.expect("n_inner", (None,), None)
        # Megatron-DeepSpeed's training switches (fusions, fp32 softmax, an unused ALiBi
        # offset) and the tensor-parallel rank: transformers computes the same model.
        hf.ignore("pretraining_tp", "masked_softmax_fusion", "bias_dropout_fusion")
        hf.ignore("skip_bias_add", "skip_bias_add_qkv", "attention_softmax_in_fp32")
        hf.ignore("offset_alibi", "unk_token_id")
        model = ModelConfig(
            vocab_size=hf.take("vocab_size"),
            num_layers=hf.take("n_layer"),
            model_dim=d,
            num_heads=h,
            mlp_dim=4 * d,
            norm="layernorm",
            dtype="float32",
            tie_embeddings=not untied(hf, names, "lm_head.weight", default=True),
            qkv_bias=True,
            out_bias=True,
            mlp="gelu",
            norm_eps=float(hf.take("layer_norm_epsilon")),
            scale_embeddings=False,
            embed_norm=True,
        )
        prefix = prefix_of(names, "word_embeddings.weight", "transformer.")
        train_len = hf.take("seq_length", _TRAIN_LEN)
        return Spec(model, "lm", "alibi", {}, train_len, {"prefix": prefix})

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, dh, f = m.model_dim, m.num_heads, m.dims.head_dim, m.mlp_dim
        t = spec.extra.get("prefix", "transformer.")
        rules = embeddings(spec, t + "word_embeddings.weight", "lm_head.weight")
        rules += layernorm(t + "word_embeddings_layernorm", ("embed_norm",), d)
        for i in range(m.num_layers):
            hf, at = f"{t}h.{i}.", ("blocks", i)
            attn = hf + "self_attention."
            rules += layernorm(hf + "input_layernorm", (*at, "attn_norm"), d)
            rules += layernorm(hf + "post_attention_layernorm", (*at, "mlp_norm"), d)
            qkv = tuple((*at, "attn", n) for n in ("q", "k", "v"))
            biases = tuple((*at, "attn", f"{n}_bias") for n in ("q", "k", "v"))
            rules += [
                fused_per_head(attn + "query_key_value.weight", qkv, d, h, dh, bias=False),
                heads_out(attn + "dense.weight", (*at, "attn", "o"), h, dh, d),
            ]
            # A BLOOM checkpoint always has both biases; a posenc-trained model may have neither
            # (export_rules writes zeros).
            if m.qkv_bias:
                rules.append(
                    fused_per_head(attn + "query_key_value.bias", biases, d, h, dh, bias=True)
                )
            if m.out_bias:
                rules.append(copy(attn + "dense.bias", (*at, "attn", "o_bias"), (d,)))
            rules += dense(hf + "mlp.dense_h_to_4h", (*at, "mlp", "wi"), d, f)
            rules += dense(hf + "mlp.dense_4h_to_h", (*at, "mlp", "wo"), f, d)
        return rules + layernorm(t + "ln_f", ("final_norm",), d)

    def export_rules(self, spec: Spec) -> list[Rule]:
        """The rules of the exported model: posenc's missing attention biases as zeros."""
        attention = spec.extra.get("prefix", "transformer.") + "h.{}.self_attention."
        qkv, out = "query_key_value.bias", "dense.bias"
        return self.rules(spec) + zero_attention_biases(spec, attention, qkv, out)

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        return common_misfits(
            spec,
            self.name,
            encoding="alibi",
            norm="layernorm",
            mlp="gelu",
            mlp_dim=4 * m.model_dim,
            mlp_bias=True,
            norm_position="pre",
            residual="sequential",
            embed_norm=True,
            causal=True,
            num_kv_heads=(None, m.num_heads),
            head_dim=(None, m.model_dim // m.num_heads),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            "vocab_size": m.vocab_size,
            "hidden_size": m.model_dim,
            "n_layer": m.num_layers,
            "n_head": m.num_heads,
            "layer_norm_epsilon": m.norm_eps,
            "tie_word_embeddings": hf_tied(spec),
            "seq_length": spec.train_len,
        }
