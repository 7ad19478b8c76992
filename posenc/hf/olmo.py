"""OLMo 2 and OLMo 3: Llama's projections and SwiGLU without an input norm: each sublayer's
output is normed before the residual add (``x + norm(f(x))``, posenc's
``norm_position="post_branch"``), queries and keys normed over the whole projection (all heads
of a token together: ``qk_norm="rms_all_heads"``) before RoPE; OLMo 3 adds sliding-window
layers (``layer_types``, ``sliding_window``) whose RoPE is never scaled, a ``rope_scaling``
(YaRN in the published models) scaling its full-attention layers alone.

=====================================================  ======================================
Hugging Face (``model.layers.i.``)                      posenc (``blocks.i.``)
=====================================================  ======================================
``model.embed_tokens.weight [V, D]``                   ``embed.embedding``
``self_attn.{q,k,v}_proj.weight``, ``o_proj``          ``attn.{q,k,v,o}`` (as Llama's)
``self_attn.q_norm.weight [H Dh]``                     ``attn_params.q_norm``
``self_attn.k_norm.weight [KV Dh]``                    ``attn_params.k_norm``
``post_attention_layernorm.weight``                    ``attn_out_norm.scale``
``mlp.{gate,up,down}_proj.weight``                     ``mlp.{wg,wi,wo}.kernel``
``post_feedforward_layernorm.weight``                  ``mlp_out_norm.scale``
``model.norm.weight``                                  ``final_norm.scale``
``lm_head.weight`` (untied, the default)               ``unembed.kernel``
=====================================================  ======================================

OLMo 3's layers are posenc layer kinds named after ``layer_types`` (:mod:`posenc.hf.layer_types`):
``sliding_attention`` with ``window="sliding:W"`` and the model's RoPE (``encoding.hparams``),
``full_attention`` with its own (``encoding="rope"`` and its hyperparameters), so ``posenc eval``
scales the global layers alone, as OLMo 3 is released.
"""

from __future__ import annotations

from typing import Any

from posenc.hf.family import (
    Family,
    Rule,
    Spec,
    common_misfits,
    copy,
    linear,
    llama_attention_mlp,
    read_model,
    read_sizes,
    register,
    write_sizes,
)
from posenc.hf.fields import HFConfig
from posenc.hf.gemma import _rope_misfits
from posenc.hf.layer_types import (
    FULL,
    SLIDING,
    local_global,
    read_layer_types,
    read_rope_global_local,
    rope_entry,
    write_layer_types,
)
from posenc.hf.rope import read_rope, write_rope

_NORMS = {"post_attention_layernorm": "attn_out_norm", "post_feedforward_layernorm": "mlp_out_norm"}


@register
class Olmo2(Family):
    name = "olmo2"
    model_types = ("olmo2",)
    export_type = "olmo2"
    export_architecture = "Olmo2ForCausalLM"
    ignored_suffixes = ("rotary_emb.inv_freq",)
    # OLMo 3's sliding-window layers.
    windows = False

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        sizes = read_sizes(hf)
        h = sizes["num_heads"]
        # Olmo2Config has no head_dim; the attention reads one the file states (getattr).
        dh = hf.count("head_dim", sizes["model_dim"] // h)
        hf.expect("hidden_act", ("silu",), "silu")
        max_len = hf.count("max_position_embeddings", 2048)
        bias = hf.expect("attention_bias", (False, True), False)
        model = read_model(
            hf,
            names,
            sizes,
            tied=False,
            head_dim=dh,
            norm="rmsnorm",
            norm_position="post_branch",
            num_kv_heads=hf.count("num_key_value_heads", h),
            qkv_bias=bias,
            out_bias=bias,
            mlp="swiglu",
            mlp_bias=False,
            norm_eps=float(hf.take("rms_norm_eps", 1e-5)),
            qk_norm="rms_all_heads",
            qk_norm_placement="before_rotate",
        )
        if not self.windows:
            hparams, train_len = read_rope(hf, dh, max_len)
            return Spec(model, "lm", "rope", hparams, train_len)
        num_layers = sizes["num_layers"]
        default = [SLIDING if (i + 1) % 4 else FULL for i in range(num_layers)]
        types = read_layer_types(hf, num_layers, default, allowed=(SLIDING, FULL))
        ropes = read_rope_global_local(
            hf, dh, max_len, types, global_base=500_000.0, local_base=500_000.0
        )
        hparams, train_len, layers = local_global(
            hf, types, ropes, default_window=4096, global_rope=True
        )
        return Spec(model, "lm", "rope", hparams, train_len, layers=layers)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, v, dh = m.model_dim, m.vocab_size, m.dims.head_dim
        rules = [copy("model.embed_tokens.weight", ("embed", "embedding"), (v, d))]
        if not m.tie_embeddings:
            rules.append(linear("lm_head.weight", ("unembed", "kernel"), d, v))
        for i in range(m.num_layers):
            hf, at = f"model.layers.{i}.", ("blocks", i)
            rules += [
                copy(f"{hf}{name}.weight", (*at, norm, "scale"), (d,))
                for name, norm in _NORMS.items()
            ]
            rules += llama_attention_mlp(hf, at, m)
            rules += [
                copy(f"{hf}self_attn.{n}_norm.weight", (*at, "attn_params", f"{n}_norm"), (w,))
                for n, w in (("q", m.num_heads * dh), ("k", m.kv_heads * dh))
            ]
        return rules + [copy("model.norm.weight", ("final_norm", "scale"), (d,))]

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        out = common_misfits(
            spec,
            self.name,
            layers=self.windows,
            encoding="rope",
            norm="rmsnorm",
            norm_position="post_branch",
            mlp="swiglu",
            mlp_bias=False,
            residual="sequential",
            embed_norm=False,
            causal=True,
            scale_embeddings=False,
            head_transform=None,
            output_bias=False,
            qk_norm="rms_all_heads",
            qk_norm_placement="before_rotate",
        )
        if m.qkv_bias != m.out_bias:
            out.append("model.qkv_bias and model.out_bias differ (OLMo's attention_bias is both)")
        out += _rope_misfits(spec.hparams, "encoding.hparams")
        for name, fields in spec.kinds.items() if spec.pattern else ():
            where = f"layers.kinds.{name}"
            if name == SLIDING:
                window = str(fields.get("window", ""))
                if set(fields) != {"window"} or not window.startswith("sliding:"):
                    out.append(f"{where}={fields!r} (needs exactly a window 'sliding:W')")
            elif name == FULL:
                if set(fields) - {"encoding", "hparams"} or fields.get("encoding") != "rope":
                    out.append(f"{where}={fields!r} (needs its own RoPE)")
                out += _rope_misfits(fields.get("hparams", {}), f"{where}.hparams")
            else:
                out.append(f"{where} (OLMo 3's layers are {SLIDING!r} or {FULL!r})")
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        dh = m.dims.head_dim
        out: dict[str, Any] = {
            **write_sizes(m),
            "num_key_value_heads": m.kv_heads,
            "head_dim": dh,
            "hidden_act": "silu",
            "rms_norm_eps": m.norm_eps,
            "tie_word_embeddings": m.tie_embeddings,
            "attention_bias": m.qkv_bias,
        }
        if not self.windows:
            rope, max_len = write_rope(spec.hparams, dh, fraction_key=None)
            return {**out, **rope, "max_position_embeddings": max_len or spec.train_len}
        types = [FULL] * m.num_layers
        if spec.pattern:
            types = list(write_layer_types(spec.pattern, m.num_layers)["layer_types"])
        kinds = spec.kinds
        window = kinds.get(SLIDING, {}).get("window", "sliding:4096")
        local, _ = rope_entry(spec.hparams, dh)
        full, max_len = rope_entry(kinds.get(FULL, {}).get("hparams", spec.hparams), dh)
        return {
            **out,
            "sliding_window": int(window.partition(":")[2]),
            "layer_types": types,
            "rope_parameters": {SLIDING: local, FULL: full},
            "max_position_embeddings": max_len or spec.train_len,
        }


@register
class Olmo3(Olmo2):
    name = "olmo3"
    model_types = ("olmo3",)
    export_type = "olmo3"
    export_architecture = "Olmo3ForCausalLM"
    windows = True
