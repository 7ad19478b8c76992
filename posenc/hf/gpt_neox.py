"""GPT-NeoX and Pythia: partial rotary embedding (``rotary_pct`` -> RoPE's ``fraction``), parallel
residual (``use_parallel_residual``), LayerNorm, a fused per-head ``query_key_value``, biases,
an untied head (``embed_out``).

====================================================  ======================================
Hugging Face (``gpt_neox.layers.i.``)                 posenc (``blocks.i.``)
====================================================  ======================================
``gpt_neox.embed_in.weight``                          ``embed.embedding``
``input_layernorm``, ``post_attention_layernorm``     ``attn_norm``, ``mlp_norm``
``attention.query_key_value [3 H Dh, D]``             ``attn.{q,k,v}`` (rows per head: q, k, v)
``attention.dense``                                   ``attn.o``, ``attn.o_bias``
``mlp.dense_h_to_4h``, ``mlp.dense_4h_to_h``          ``mlp.wi``, ``mlp.wo``
``gpt_neox.final_layer_norm``, ``embed_out.weight``   ``final_norm``, ``unembed.kernel``
====================================================  ======================================

posenc's own default model (LayerNorm, tanh-GELU MLP with biases, RoPE over whole heads, pre-norm)
is a GPT-NeoX model, so posenc-trained RoPE runs export as this family.
"""

from __future__ import annotations

from typing import Any

from posenc.hf.family import (
    ACT_NAMES,
    Family,
    Rule,
    Spec,
    activation,
    common_misfits,
    embeddings,
    hf_tied,
    layernorm,
    megatron_layer,
    plain_heads,
    read_model,
    read_sizes,
    register,
    write_sizes,
    zero_attention_biases,
)
from posenc.hf.fields import HFConfig
from posenc.hf.rope import read_rope, write_rope


@register
class GPTNeoX(Family):
    name = "gpt_neox"
    model_types = ("gpt_neox",)
    export_type = "gpt_neox"
    export_architecture = "GPTNeoXForCausalLM"
    ignored_suffixes = ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq")

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        sizes = read_sizes(hf)
        max_len = hf.count("max_position_embeddings")
        hparams, train_len = read_rope(
            hf,
            sizes["model_dim"] // sizes["num_heads"],
            max_len,
            theta_key="rotary_emb_base",
            fraction_key="rotary_pct",
            fraction_default=0.25,
        )
        bias = hf.expect("attention_bias", (True, False), True)
        parallel = hf.expect("use_parallel_residual", (True, False), True)
        hf.expect("is_decoder", (False, True), False)  # transformers' flag for cross-attention
        model = read_model(
            hf,
            names,
            sizes,
            head="embed_out.weight",
            tied=False,
            norm="layernorm",
            qkv_bias=bias,
            out_bias=bias,
            mlp=activation(hf, "hidden_act", "gelu"),
            mlp_bias=True,
            residual="parallel" if parallel else "sequential",
            norm_eps=float(hf.take("layer_norm_eps")),
        )
        return Spec(model, "lm", "rope", hparams, train_len)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        rules = embeddings(spec, "gpt_neox.embed_in.weight", "embed_out.weight")
        for i in range(m.num_layers):
            rules += megatron_layer(f"gpt_neox.layers.{i}.", "attention.", ("blocks", i), m)
        return rules + layernorm("gpt_neox.final_layer_norm", ("final_norm",), m.model_dim)

    def fits(self, spec: Spec) -> list[str]:
        return common_misfits(
            spec,
            self.name,
            encoding="rope",
            norm="layernorm",
            mlp=tuple(ACT_NAMES),
            mlp_bias=True,
            norm_position="pre",
            residual=("sequential", "parallel"),
            embed_norm=False,
            causal=True,
            **plain_heads(spec.model),
        ) + (
            ["RoPE with layout 'interleaved'"]
            if spec.hparams.get("layout") == "interleaved"
            else []
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        rope, dynamic_len = write_rope(
            spec.hparams, m.dims.head_dim, theta_key="rotary_emb_base", fraction_key="rotary_pct"
        )
        return {
            **write_sizes(m),
            "hidden_act": ACT_NAMES[m.mlp],
            "max_position_embeddings": dynamic_len or spec.train_len,
            "layer_norm_eps": m.norm_eps,
            "tie_word_embeddings": hf_tied(spec),
            # One flag for the fused projection's and the output's biases: posenc's missing
            # ones are written as zeros.
            "attention_bias": m.qkv_bias or m.out_bias,
            "use_parallel_residual": m.residual == "parallel",
            **rope,
        }

    def export_rules(self, spec: Spec) -> list[Rule]:
        """The rules of the exported model: posenc's missing attention biases as zeros."""
        m = spec.model
        rules = self.rules(spec)
        if m.qkv_bias == m.out_bias:  # attention_bias says both
            return rules
        attention = "gpt_neox.layers.{}.attention."
        return rules + zero_attention_biases(spec, attention, "query_key_value.bias", "dense.bias")
