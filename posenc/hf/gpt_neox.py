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
    Family,
    Rule,
    Spec,
    activation,
    common_misfits,
    copy,
    dense,
    embeddings,
    fused_per_head,
    heads_out,
    hf_tied,
    layernorm,
    register,
    untied,
    zero_attention_biases,
)
from posenc.hf.fields import HFConfig
from posenc.hf.rope import read_rope, write_rope
from posenc.layers.config import ModelConfig

_ACT_NAMES = {"gelu_exact": "gelu", "gelu": "gelu_new", "relu": "relu"}


@register
class GPTNeoX(Family):
    name = "gpt_neox"
    model_types = ("gpt_neox",)
    export_type = "gpt_neox"
    export_architecture = "GPTNeoXForCausalLM"
    ignored_suffixes = ("attention.bias", "attention.masked_bias", "rotary_emb.inv_freq")

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        d, h = hf.take("hidden_size"), hf.take("num_attention_heads")
        max_len = hf.take("max_position_embeddings")
        hparams, train_len = read_rope(
            hf,
            d // h,
            max_len,
            theta_key="rotary_emb_base",
            fraction_key="rotary_pct",
            fraction_default=0.25,
        )
        bias = hf.expect("attention_bias", (True, False), True)
        parallel = hf.expect("use_parallel_residual", (True, False), True)
        hf.expect("is_decoder", (False, True), False)  # transformers' flag for cross-attention
        model = ModelConfig(
            vocab_size=hf.take("vocab_size"),
            num_layers=hf.take("num_hidden_layers"),
            model_dim=d,
            num_heads=h,
            mlp_dim=hf.take("intermediate_size"),
            norm="layernorm",
            dtype="float32",
            tie_embeddings=not untied(hf, names, "embed_out.weight", default=False),
            qkv_bias=bias,
            out_bias=bias,
            mlp=activation(hf, "hidden_act", "gelu"),
            mlp_bias=True,
            residual="parallel" if parallel else "sequential",
            norm_eps=float(hf.take("layer_norm_eps")),
            scale_embeddings=False,
        )
        return Spec(model, "lm", "rope", hparams, train_len)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, dh, f = m.model_dim, m.num_heads, m.dims.head_dim, m.mlp_dim
        rules = embeddings(spec, "gpt_neox.embed_in.weight", "embed_out.weight")
        for i in range(m.num_layers):
            hf, at = f"gpt_neox.layers.{i}.", ("blocks", i)
            qkv = tuple((*at, "attn", n) for n in ("q", "k", "v"))
            rules += layernorm(hf + "input_layernorm", (*at, "attn_norm"), d)
            rules += layernorm(hf + "post_attention_layernorm", (*at, "mlp_norm"), d)
            rules.append(
                fused_per_head(hf + "attention.query_key_value.weight", qkv, d, h, dh, bias=False)
            )
            rules.append(heads_out(hf + "attention.dense.weight", (*at, "attn", "o"), h, dh, d))
            if m.qkv_bias:
                biases = tuple((*at, "attn", f"{n}_bias") for n in ("q", "k", "v"))
                name = hf + "attention.query_key_value.bias"
                rules.append(fused_per_head(name, biases, d, h, dh, bias=True))
            if m.out_bias:
                rules.append(copy(hf + "attention.dense.bias", (*at, "attn", "o_bias"), (d,)))
            rules += dense(hf + "mlp.dense_h_to_4h", (*at, "mlp", "wi"), d, f)
            rules += dense(hf + "mlp.dense_4h_to_h", (*at, "mlp", "wo"), f, d)
        return rules + layernorm("gpt_neox.final_layer_norm", ("final_norm",), d)

    def fits(self, spec: Spec) -> list[str]:
        return common_misfits(
            spec,
            self.name,
            encoding="rope",
            norm="layernorm",
            mlp=tuple(_ACT_NAMES),
            mlp_bias=True,
            norm_position="pre",
            embed_norm=False,
            causal=True,
            num_kv_heads=(None, spec.model.num_heads),
            head_dim=(None, spec.model.model_dim // spec.model.num_heads),
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
            "vocab_size": m.vocab_size,
            "hidden_size": m.model_dim,
            "intermediate_size": m.mlp_dim,
            "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_heads,
            "hidden_act": _ACT_NAMES[m.mlp],
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
