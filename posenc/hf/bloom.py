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
    embeddings,
    hf_tied,
    layernorm,
    megatron_layer,
    plain_heads,
    prefix_of,
    read_model,
    read_sizes,
    register,
    write_sizes,
    zero_attention_biases,
)
from posenc.hf.fields import HFConfig

# BLOOM trained at 2048 tokens; its configs do not always say so (seq_length when they do).
_TRAIN_LEN = 2048
# config.json key -> ModelConfig field; the width is hidden_size or, in older files, n_embed,
# and the MLP is always 4 D wide.
_SIZES = {"vocab_size": "vocab_size", "n_layer": "num_layers", "n_head": "num_heads"}


@register
class Bloom(Family):
    name = "bloom"
    model_types = ("bloom",)
    export_type = "bloom"
    export_architecture = "BloomForCausalLM"

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        d = hf.take("hidden_size", None) or hf.take("n_embed")
        hf.ignore("hidden_size", "n_embed")
        sizes = read_sizes(hf, _SIZES)
        hf.expect("apply_residual_connection_post_layernorm", (False,), False)
        hf.expect("slow_but_exact", (False,), False)
        hf.expect("n_inner", (None,), None)
        # The tensor-parallel rank of BloomConfig: transformers computes the same model.
        # (Megatron-DeepSpeed's training switches the Hub files hold, masked_softmax_fusion and
        # the like, BloomConfig does not consume: they are ignored by the general rule.)
        hf.ignore("pretraining_tp")
        model = read_model(
            hf,
            names,
            sizes,
            model_dim=d,
            mlp_dim=4 * d,
            norm="layernorm",
            qkv_bias=True,
            out_bias=True,
            mlp="gelu",
            norm_eps=float(hf.take("layer_norm_epsilon")),
            embed_norm=True,
        )
        prefix = prefix_of(names, "word_embeddings.weight", "transformer.")
        train_len = hf.count("seq_length", _TRAIN_LEN)
        return Spec(model, "lm", "alibi", {}, train_len, {"prefix": prefix})

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        t = spec.extra.get("prefix", "transformer.")
        rules = embeddings(spec, t + "word_embeddings.weight", "lm_head.weight")
        rules += layernorm(t + "word_embeddings_layernorm", ("embed_norm",), m.model_dim)
        for i in range(m.num_layers):
            rules += megatron_layer(f"{t}h.{i}.", "self_attention.", ("blocks", i), m)
        return rules + layernorm(t + "ln_f", ("final_norm",), m.model_dim)

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
            **plain_heads(m),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            **write_sizes(m, _SIZES),
            "hidden_size": m.model_dim,
            "layer_norm_epsilon": m.norm_eps,
            "tie_word_embeddings": hf_tied(spec),
            "seq_length": spec.train_len,
        }
