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

Mistral's ``sliding_window`` (every layer; transformers' default 4096 when the field is absent,
none when it is null) is the attention option ``window="sliding:W"``: a query sees its own key and
the ``W - 1`` before it, as transformers' mask (``kv_idx > q_idx - W``) has it. A model with such a
window exports as Mistral. Qwen2's ``use_sliding_window`` puts that window on the layers
``layer_types`` names ``"sliding_attention"`` (without it, the layers from ``max_window_layers``
on: :func:`qwen_windows`); a model whose layers differ gets a layer pattern of kinds named after
the layer types (:mod:`posenc.hf.per_layer`), exported as Qwen2's ``layer_types``.
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
from posenc.hf.per_layer import (
    fold,
    layer_fields,
    option_misfits,
    read_window,
    window_kind,
    windows_of,
)
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

    def read_as(
        self,
        hf: HFConfig,
        names: set[str],
        kind: str,
        layers: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> Spec:
        """:meth:`read` with the fields of ``model_type`` ``kind`` (a family built on Llama's
        fields, e.g. Phi-3, reads them as ``"llama"``); ``layers``: each layer's kind as
        :func:`posenc.hf.per_layer.fold` takes it, when the family reads them itself (SmolLM3's
        RoPE and NoPE layers), else the windows of Mistral, Qwen2 and Qwen3."""
        sizes = read_sizes(hf)
        h = sizes["num_heads"]
        # Qwen3's config class states 128; the others derive it from the width.
        dh = hf.count("head_dim", 128 if kind == "qwen3" else sizes["model_dim"] // h)
        hf.expect("hidden_act", ("silu",), "silu")
        hf.ignore("pretraining_tp")  # a split of the same matmuls (transformers 4), or unused
        if kind == "qwen2":
            qkv_bias, out_bias = True, False
        else:
            qkv_bias = out_bias = hf.expect("attention_bias", (False, True), False)
        n = sizes["num_layers"]
        if layers is not None:
            pass
        elif kind in ("qwen2", "qwen3"):
            layers = [window_kind(w) for w in qwen_windows(hf, n)]
        else:
            layers = [window_kind(read_window(hf, 4096) if kind == "mistral" else "full")] * n
        common, pattern = fold(layers)
        encoding = common.pop("encoding", "rope")
        max_len = hf.count("max_position_embeddings")
        hparams, train_len = read_rope(hf, dh, max_len)
        if encoding == "nope":  # every layer without RoPE (its fields read all the same)
            hparams = {}
        model = read_model(
            hf,
            names,
            sizes,
            tied=kind == "smollm3",  # SmolLM3Config ties by default, LlamaConfig does not
            head_dim=dh,
            norm="rmsnorm",
            num_kv_heads=hf.take("num_key_value_heads", h),
            qkv_bias=qkv_bias,
            out_bias=out_bias,
            mlp="swiglu",
            # Qwen3's MLP has no biases (its config no mlp_bias field).
            mlp_bias=False if kind == "qwen3" else hf.expect("mlp_bias", (False, True), False),
            norm_eps=float(hf.take("rms_norm_eps")),
            **common,
            **({"qk_norm": "rms"} if kind == "qwen3" else {}),
        )
        extra = {"model_type": kind}
        return Spec(model, "lm", encoding, hparams, train_len, extra, layers=pattern)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d = m.model_dim
        rules = embeddings(spec, "model.embed_tokens.weight", "lm_head.weight")
        for i in range(m.num_layers):
            hf, at = f"model.layers.{i}.", ("blocks", i)
            rules += [
                copy(hf + "input_layernorm.weight", (*at, "attn_norm", "scale"), (d,)),
                copy(hf + "post_attention_layernorm.weight", (*at, "mlp_norm", "scale"), (d,)),
            ]
            rules += llama_attention_mlp(hf, at, m)
        return rules + [copy("model.norm.weight", ("final_norm", "scale"), (d,))]

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        qwen2 = m.qkv_bias and not m.out_bias
        out = self.misfits(spec, layer_windows=qwen2)
        if any(w != "full" for w in windows_of(spec)[0]) and (m.out_bias or m.mlp_bias):
            out.append(
                "a sliding window with an output or MLP bias (Mistral and Qwen2, the Llamas "
                "with a window, have neither)"
            )
        return out

    def misfits(
        self, spec: Spec, *, layer_windows: bool, nope_layers: bool = False, **options: Any
    ) -> list[str]:
        """What of ``spec`` a config of Llama's parts cannot hold: ``layer_windows``: it states
        a window per layer (Qwen2's and Qwen3's ``layer_types``), else one for every layer;
        ``nope_layers``: layers without RoPE (SmolLM3's ``no_rope_layers``); ``options``:
        attention options every layer must have (Qwen3's QK-norm)."""
        m = spec.model
        layers = layer_fields(spec)
        out = common_misfits(
            spec,
            self.name,
            encoding=spec.encoding,  # checked layer by layer below
            norm="rmsnorm",
            mlp="swiglu",
            norm_position="pre",
            residual="sequential",
            embed_norm=False,
            causal=True,
            layers=layer_windows or nope_layers,
            **{f: getattr(m, f) for f in OPTION_FIELDS},  # checked layer by layer below
        )
        allowed = ("rope", "nope") if nope_layers else ("rope",)
        for layer in layers:
            if layer["encoding"] not in allowed:
                out.append(f"encoding {layer['encoding']!r} (a {self.name} model has RoPE)")
                break
            if layer["encoding"] == "rope" and not layer["models_encoder"]:
                out.append("a RoPE of their own on some layers (the config states one)")
                break
        out += option_misfits(layers, ("window", *options))
        for field, value in options.items():
            wrong = sorted({repr(layer[field]) for layer in layers if layer[field] != value})
            if wrong:
                out.append(f"model.{field}={wrong[0]} (needs {value!r} on every layer)")
        types, size = windows_of(spec)
        if size is None and any(t != "full_attention" for t in types):
            windows = sorted({layer["window"] for layer in layers} - {"full"})
            out.append(f"model.window={windows[0]!r} (needs 'full' or one 'sliding:W')")
        elif not layer_windows and len(set(types)) > 1:
            out.append("a sliding window on some layers only (the config states one for all)")
        if m.out_bias and not m.qkv_bias:
            out.append("model.out_bias without model.qkv_bias (Llama sets both, Qwen2 the first)")
        if m.qkv_bias and not m.out_bias and m.mlp_bias:
            out.append("model.mlp_bias with model.qkv_bias alone (Qwen2 has no MLP biases)")
        h = spec.hparams
        if h.get("layout", "half") != "half" or h.get("fraction", 1.0) != 1.0:
            out.append("RoPE with layout 'interleaved' or fraction < 1")
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        """Llama's config; Qwen2's (its own model_type) for biases on q, k, v alone; Mistral's
        for a sliding window."""
        m = spec.model
        types, size = windows_of(spec)
        if m.qkv_bias and not m.out_bias:
            kind = {
                "model_type": "qwen2",
                "architectures": ["Qwen2ForCausalLM"],
                **write_qwen_windows(types, size),
            }
        elif size is not None:
            kind = {
                "model_type": "mistral",
                "architectures": ["MistralForCausalLM"],
                "sliding_window": size,
            }
        else:
            kind = {"attention_bias": m.qkv_bias, "mlp_bias": m.mlp_bias}
        return {**self.write_common(spec), **kind}

    def write_common(self, spec: Spec) -> dict[str, Any]:
        """The fields every config of Llama's parts states: sizes, heads, RoPE, norms."""
        m = spec.model
        rope, dynamic_len = write_rope(spec.hparams, m.dims.head_dim, fraction_key=None)
        return {
            **write_sizes(m),
            "num_key_value_heads": m.kv_heads,
            "head_dim": m.dims.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": dynamic_len or spec.train_len,
            "rms_norm_eps": m.norm_eps,
            "tie_word_embeddings": hf_tied(spec),
            **rope,
        }


def qwen_windows(hf: HFConfig, num_layers: int) -> tuple[str, ...]:
    """Each layer's window in a Qwen2 or Qwen3 config, as transformers reads it:
    ``sliding_window`` counts only with ``use_sliding_window``; ``layer_types`` says which layers
    slide, and without it the layers from ``max_window_layers`` (default 28) on do. A sliding
    layer without a window is refused (transformers' mask raises)."""
    use = hf.expect("use_sliding_window", (False, True), False)
    window = read_window(hf, None) if use else "full"
    hf.ignore("sliding_window")  # unused without use_sliding_window
    first = hf.take("max_window_layers", 28)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ValueError(
            f"{hf.source}: config.json max_window_layers={first!r} must be an integer >= 0"
        )
    derived = [
        "sliding_attention" if window != "full" and i >= first else "full_attention"
        for i in range(num_layers)
    ]
    types = read_layer_types(
        hf, num_layers, derived, allowed=("full_attention", "sliding_attention")
    )
    if "sliding_attention" in types and window == "full":
        raise ValueError(
            f"{hf.source}: config.json layer_types has sliding_attention layers but no window "
            "(use_sliding_window is false or sliding_window null); transformers refuses it too"
        )
    return tuple(window if t == "sliding_attention" else "full" for t in types)


def write_qwen_windows(types: list[str], size: int | None) -> dict[str, Any]:
    """:func:`qwen_windows` backwards: each layer's type and the one window (:func:`windows_of`)."""
    if size is None:
        return {"use_sliding_window": False}
    return {"use_sliding_window": True, "sliding_window": size, "layer_types": types}
