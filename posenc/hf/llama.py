"""Llama (Llama 2, 3, 3.1, 3.2), Mistral and Qwen2 / Qwen2.5: RoPE (any ``rope_scaling``),
grouped-query attention, SwiGLU, RMSNorm, no embedding scale; Qwen2's biases on the query, key
and value projections, Llama's optional ``attention_bias`` and ``mlp_bias``; tied or untied
embeddings.

===================================================  ======================================
Hugging Face                                         posenc
===================================================  ======================================
``model.embed_tokens.weight [V, D]``                 ``embed.embedding``
``model.layers.i.input_layernorm.weight``            ``blocks.i.attn_norm.scale``
``...self_attn.{q,k,v}_proj.weight [H Dh, D]``       ``blocks.i.attn.{q,k,v} [D, H, Dh]``
``...self_attn.o_proj.weight [D, H Dh]``             ``blocks.i.attn.o [H, Dh, D]``
``model.layers.i.post_attention_layernorm.weight``   ``blocks.i.mlp_norm.scale``
``...mlp.{gate,up,down}_proj.weight``                ``blocks.i.mlp.{wg,wi,wo}.kernel``
``model.norm.weight``                                ``final_norm.scale``
``lm_head.weight [V, D]``                            ``unembed.kernel [D, V]`` (untied)
===================================================  ======================================

Mistral's sliding-window attention is refused (posenc attends to the whole window), as is
Qwen2's ``use_sliding_window``.
"""

from __future__ import annotations

from typing import Any

from posenc.hf.family import (
    Family,
    Rule,
    Spec,
    common_misfits,
    copy,
    embeddings,
    head_bias,
    heads_in,
    heads_out,
    hf_tied,
    linear,
    read_model,
    read_sizes,
    register,
    write_sizes,
)
from posenc.hf.fields import HFConfig
from posenc.hf.rope import read_rope, write_rope


@register
class Llama(Family):
    name = "llama"
    model_types = ("llama", "mistral", "qwen2")
    export_type = "llama"
    export_architecture = "LlamaForCausalLM"
    ignored_suffixes = ("rotary_emb.inv_freq",)

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        return self.read_as(hf, names, hf.take("model_type"))

    def read_as(self, hf: HFConfig, names: set[str], kind: str) -> Spec:
        """:meth:`read` with the fields of ``model_type`` ``kind`` (a family built on Llama's
        fields, e.g. Phi-3, reads them as ``"llama"``)."""
        sizes = read_sizes(hf)
        h = sizes["num_heads"]
        dh = hf.take("head_dim", sizes["model_dim"] // h)
        hf.expect("hidden_act", ("silu",), "silu")
        hf.ignore("pretraining_tp")  # a split of the same matmuls (transformers 4), or unused
        if kind == "qwen2":
            qkv_bias, out_bias = True, False
            hf.expect("use_sliding_window", (False,), False)
            hf.ignore("sliding_window", "max_window_layers")  # unused without the above
            layers = hf.take("layer_types", None)
            if layers and set(layers) != {"full_attention"}:
                raise ValueError(f"{hf.source}: layer_types {sorted(set(layers))} is refused")
        else:
            qkv_bias = out_bias = hf.expect("attention_bias", (False, True), False)
            if kind == "mistral":
                hf.expect("sliding_window", (None,), None)
        max_len = hf.count("max_position_embeddings")
        hparams, train_len = read_rope(hf, dh, max_len)
        model = read_model(
            hf,
            names,
            sizes,
            tied=False,
            head_dim=dh,
            norm="rmsnorm",
            num_kv_heads=hf.take("num_key_value_heads", h),
            qkv_bias=qkv_bias,
            out_bias=out_bias,
            mlp="swiglu",
            mlp_bias=hf.expect("mlp_bias", (False, True), False),
            norm_eps=float(hf.take("rms_norm_eps")),
        )
        return Spec(model, "lm", "rope", hparams, train_len, {"model_type": kind})

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, kv, dh, f = m.model_dim, m.num_heads, m.kv_heads, m.dims.head_dim, m.mlp_dim
        rules = embeddings(spec, "model.embed_tokens.weight", "lm_head.weight")
        for i in range(m.num_layers):
            hf, at = f"model.layers.{i}.", ("blocks", i)
            attn, mlp = hf + "self_attn.", hf + "mlp."
            rules += [
                copy(hf + "input_layernorm.weight", (*at, "attn_norm", "scale"), (d,)),
                heads_in(attn + "q_proj.weight", (*at, "attn", "q"), d, h, dh),
                heads_in(attn + "k_proj.weight", (*at, "attn", "k"), d, kv, dh),
                heads_in(attn + "v_proj.weight", (*at, "attn", "v"), d, kv, dh),
                heads_out(attn + "o_proj.weight", (*at, "attn", "o"), h, dh, d),
                copy(hf + "post_attention_layernorm.weight", (*at, "mlp_norm", "scale"), (d,)),
                linear(mlp + "gate_proj.weight", (*at, "mlp", "wg", "kernel"), d, f),
                linear(mlp + "up_proj.weight", (*at, "mlp", "wi", "kernel"), d, f),
                linear(mlp + "down_proj.weight", (*at, "mlp", "wo", "kernel"), f, d),
            ]
            if m.qkv_bias:
                rules += [
                    head_bias(attn + f"{n}_proj.bias", (*at, "attn", f"{n}_bias"), heads, dh)
                    for n, heads in (("q", h), ("k", kv), ("v", kv))
                ]
            if m.out_bias:
                rules.append(copy(attn + "o_proj.bias", (*at, "attn", "o_bias"), (d,)))
            if m.mlp_bias:
                rules += [
                    copy(mlp + f"{n}_proj.bias", (*at, "mlp", w, "bias"), (size,))
                    for n, w, size in (("gate", "wg", f), ("up", "wi", f), ("down", "wo", d))
                ]
        return rules + [copy("model.norm.weight", ("final_norm", "scale"), (d,))]

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        out = common_misfits(
            spec,
            self.name,
            encoding="rope",
            norm="rmsnorm",
            mlp="swiglu",
            norm_position="pre",
            residual="sequential",
            embed_norm=False,
            causal=True,
        )
        if m.out_bias and not m.qkv_bias:
            out.append("model.out_bias without model.qkv_bias (Llama sets both, Qwen2 the first)")
        if m.qkv_bias and not m.out_bias and m.mlp_bias:
            out.append("model.mlp_bias with model.qkv_bias alone (Qwen2 has no MLP biases)")
        h = spec.hparams
        if h.get("layout", "half") != "half" or h.get("fraction", 1.0) != 1.0:
            out.append("RoPE with layout 'interleaved' or fraction < 1")
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        """Llama's config; Qwen2's (its own model_type) for biases on q, k, v alone."""
        m = spec.model
        rope, dynamic_len = write_rope(spec.hparams, m.dims.head_dim, fraction_key=None)
        if m.qkv_bias and not m.out_bias:
            kind = {
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                "use_sliding_window": False,
            }
        else:
            kind = {"attention_bias": m.qkv_bias, "mlp_bias": m.mlp_bias}
        return {
            **write_sizes(m),
            "num_key_value_heads": m.kv_heads,
            "head_dim": m.dims.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": dynamic_len or spec.train_len,
            "rms_norm_eps": m.norm_eps,
            "tie_word_embeddings": hf_tied(spec),
            **kind,
            **rope,
        }
