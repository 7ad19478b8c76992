"""Cohere2 (Command R7B): RoPE on the sliding-window layers and no positional encoding on the
full-attention ones (RNoPE-SWA), a parallel block whose attention and MLP read one norm of its
input, Cohere's LayerNorm (mean removed, a scale and no bias), grouped-query attention, SwiGLU,
tied embeddings and a factor on the output logits.

=====================================================  ======================================
Hugging Face                                           posenc
=====================================================  ======================================
``model.embed_tokens.weight [V, D]``                   ``embed.embedding``
``model.layers.i.input_layernorm.weight``              ``blocks.i.attn_norm.scale``
``...self_attn.{q,k,v}_proj.weight [H Dh, D]``         ``blocks.i.attn.{q,k,v} [D, H, Dh]``
``...self_attn.o_proj.weight [D, H Dh]``               ``blocks.i.attn.o [H, Dh, D]``
``...mlp.{gate,up,down}_proj.weight``                  ``blocks.i.mlp.{wg,wi,wo}.kernel``
``model.norm.weight``                                  ``final_norm.scale``
``lm_head.weight [V, D]``                              ``unembed.kernel [D, V]`` (untied)
=====================================================  ======================================

The options: ``norm="layernorm_nobias"``, ``residual="parallel_shared_norm"`` (``x + attn(h) +
mlp(h)``, ``h = norm(x)``), ``output_logit_scale`` = ``logit_scale``; RoPE in the interleaved
layout (``repeat_interleave`` of the frequencies: pairs ``(x_2i, x_2i+1)``). Layer ``i`` is
``layer_types[i]``, or without it sliding unless ``(i + 1) % sliding_window_pattern == 0``
(default 4, the form Hub configs written before ``layer_types`` carry). The kinds of posenc's
layer pattern are named after the types: ``"sliding_attention"`` (the model's RoPE, window
``"sliding:W"``) and ``"full_attention"`` (``encoding="nope"``). ``head_dim`` is
``hidden_size / num_attention_heads`` whatever the config says (transformers sets it so).
"""

from __future__ import annotations

from typing import Any

from posenc.attention.options import OPTION_FIELDS
from posenc.hf.family import (
    Family,
    Rule,
    Spec,
    common_misfits,
    copy,
    embeddings,
    hf_tied,
    llama_attention_mlp,
    read_model,
    read_sizes,
    register,
    write_sizes,
)
from posenc.hf.fields import HFConfig
from posenc.hf.layer_types import read_layer_types
from posenc.hf.per_layer import fold, layer_fields, option_misfits, read_window, windows_of
from posenc.hf.rope import read_rope, write_rope


@register
class Cohere2(Family):
    name = "cohere2"
    model_types = ("cohere2",)
    export_type = "cohere2"
    export_architecture = "Cohere2ForCausalLM"
    ignored_suffixes = ("rotary_emb.inv_freq",)

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        hf.take("model_type")
        sizes = read_sizes(hf)
        n, h = sizes["num_layers"], sizes["num_heads"]
        hf.ignore("head_dim")  # Cohere2Config sets hidden_size // num_attention_heads
        hf.expect("hidden_act", ("silu",), "silu")
        window = read_window(hf, 4096)
        if "layer_types" in hf and hf.fields["layer_types"] is not None:
            hf.ignore("sliding_window_pattern")  # transformers reads it only without them
            derived = None
        else:
            every = hf.count("sliding_window_pattern", 4)
            derived = [
                "sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)
            ]
        allowed = ("full_attention", "sliding_attention")
        types = read_layer_types(hf, n, derived, allowed=allowed)
        if "sliding_attention" in types and window == "full":
            raise ValueError(
                f"{hf.source}: config.json has sliding_attention layers but sliding_window is "
                "null; transformers refuses it too"
            )
        layers = [
            (t, {"window": window} if t == "sliding_attention" else {"encoding": "nope"})
            for t in types
        ]
        common, pattern = fold(layers)
        encoding = common.pop("encoding", "rope")
        max_len = hf.count("max_position_embeddings")
        hparams, train_len = read_rope(hf, sizes["model_dim"] // h, max_len)
        if hparams.get("fraction", 1.0) != 1.0:
            raise ValueError(
                f"{hf.source}: config.json partial_rotary_factor={hparams['fraction']} is not "
                "supported by posenc's cohere2 import (Cohere2 rotates every channel)"
            )
        hparams = {} if encoding == "nope" else {**hparams, "layout": "interleaved"}
        bias = hf.expect("attention_bias", (False, True), False)
        model = read_model(
            hf,
            names,
            sizes,
            norm="layernorm_nobias",
            norm_eps=float(hf.take("layer_norm_eps", 1e-5)),
            residual="parallel_shared_norm",
            num_kv_heads=hf.take("num_key_value_heads", h),
            qkv_bias=bias,
            out_bias=bias,
            mlp="swiglu",
            mlp_bias=False,
            output_logit_scale=float(hf.take("logit_scale", 0.0625)),
            **common,
        )
        return Spec(model, "lm", encoding, hparams, train_len, layers=pattern)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d = m.model_dim
        rules = embeddings(spec, "model.embed_tokens.weight", "lm_head.weight")
        for i in range(m.num_layers):
            hf, at = f"model.layers.{i}.", ("blocks", i)
            rules.append(copy(hf + "input_layernorm.weight", (*at, "attn_norm", "scale"), (d,)))
            rules += llama_attention_mlp(hf, at, m)
        return rules + [copy("model.norm.weight", ("final_norm", "scale"), (d,))]

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        layers = layer_fields(spec)
        out = common_misfits(
            spec,
            self.name,
            encoding=spec.encoding,  # checked layer by layer below
            norm="layernorm_nobias",
            mlp="swiglu",
            mlp_bias=False,
            norm_position="pre",
            residual="parallel_shared_norm",
            embed_norm=False,
            causal=True,
            head_dim=(None, m.model_dim // m.num_heads),
            output_logit_scale=m.output_logit_scale,
            layers=True,
            **{f: getattr(m, f) for f in OPTION_FIELDS},  # checked layer by layer below
        )
        types, size = windows_of(spec)
        for layer, t in zip(layers, types, strict=True):
            rope = layer["encoding"] == "rope" and layer["models_encoder"]
            if (t == "sliding_attention") != rope or layer["encoding"] not in ("rope", "nope"):
                out.append(
                    f"a layer with encoding {layer['encoding']!r} and window "
                    f"{layer['window']!r} (Cohere2 has the model's RoPE on its sliding-window "
                    "layers, no positions on its full ones)"
                )
                break
        if size is None and "sliding_attention" in types:
            windows = sorted({layer["window"] for layer in layers} - {"full"})
            out.append(f"model.window={windows[0]!r} (needs 'full' or one 'sliding:W')")
        out += option_misfits(layers, ("window",))
        if m.qkv_bias != m.out_bias:
            out.append(
                f"model.qkv_bias={m.qkv_bias} with model.out_bias={m.out_bias} (Cohere2's "
                "attention_bias sets both)"
            )
        h = spec.hparams
        if "sliding_attention" in types and (
            h.get("layout") != "interleaved" or h.get("fraction", 1.0) != 1.0
        ):
            out.append("RoPE with layout 'half' or fraction < 1 (Cohere2 interleaves all)")
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        types, size = windows_of(spec)
        rope, dynamic_len = write_rope(spec.hparams, m.dims.head_dim, fraction_key=None)
        return {
            **write_sizes(m),
            "num_key_value_heads": m.kv_heads,
            "hidden_act": "silu",
            "max_position_embeddings": dynamic_len or spec.train_len,
            "layer_norm_eps": m.norm_eps,
            "logit_scale": m.output_logit_scale,
            "tie_word_embeddings": hf_tied(spec),
            "attention_bias": m.qkv_bias,
            "sliding_window": size,
            "layer_types": types,
            **rope,
        }
