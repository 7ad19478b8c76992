"""Gemma 2 and Gemma 3 (text): local sliding-window layers and global ones, RMSNorm before and
after each sublayer with scales stored as ``w`` of ``1 + w``, embeddings times ``sqrt(D)``,
GeGLU (tanh GELU), logits scaled by ``query_pre_attn_scalar ** -0.5``; Gemma 2 soft-caps the
attention logits (``attn_logit_softcapping``) and the output logits
(``final_logit_softcapping``); Gemma 3 norms queries and keys per head before RoPE and gives
its local layers their own RoPE base (``rope_local_base_freq``, or ``rope_parameters`` nested by
layer type), a ``rope_scaling`` scaling its global layers alone.

=====================================================  ======================================
Hugging Face (``model.layers.i.``)                      posenc (``blocks.i.``)
=====================================================  ======================================
``model.embed_tokens.weight [V, D]``                   ``embed.embedding`` (scaled by
                                                       ``sqrt(D)`` in both)
``input_layernorm.weight``                             ``attn_norm.scale``
``self_attn.{q,k,v}_proj.weight``, ``o_proj``          ``attn.{q,k,v,o}`` (as Llama's)
``self_attn.{q,k}_norm.weight [Dh]`` (Gemma 3)         ``attn_params.{q,k}_norm``
``post_attention_layernorm.weight``                    ``attn_out_norm.scale``
``pre_feedforward_layernorm.weight``                   ``mlp_norm.scale``
``mlp.{gate,up,down}_proj.weight``                     ``mlp.{wg,wi,wo}.kernel``
``post_feedforward_layernorm.weight``                  ``mlp_out_norm.scale``
``model.norm.weight``                                  ``final_norm.scale``
``lm_head.weight`` (untied only)                       ``unembed.kernel``
=====================================================  ======================================

Every norm weight is the same array on both sides: posenc's ``model.norm_unit_offset`` computes
``1 + w`` as transformers does (in float32), so export writes the weights back bit for bit.

Layers are posenc layer kinds named after ``layer_types`` (:mod:`posenc.hf.layer_types`):
``sliding_attention`` with ``window="sliding:W"`` (transformers' sliding mask lets query ``i``
see keys ``i - W < j <= i``, posenc's ``sliding:W`` exactly) and ``full_attention``. Gemma 3's
global layers name their own RoPE (``encoding="rope"`` with their hyperparameters), the local
layers use the model's (``encoding.hparams``), so ``posenc eval`` scales either alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from posenc.hf.family import (
    Family,
    Rule,
    Spec,
    common_misfits,
    copy,
    linear,
    llama_attention_mlp,
    nullable,
    read_model,
    read_sizes,
    register,
    write_sizes,
)
from posenc.hf.fields import HFConfig
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

# transformers' tanh GELUs (ACT2FN), Gemma's gated activation: posenc's "geglu".
_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")
# Each block's norms: Hugging Face name -> posenc module.
_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "attn_out_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp_out_norm",
}


@register
class Gemma2(Family):
    name = "gemma2"
    model_types = ("gemma2",)
    export_type = "gemma2"
    export_architecture = "Gemma2ForCausalLM"
    # Gemma 3 norms queries and keys per head; Gemma 2 does not.
    qk_norm = False

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        sizes = read_sizes(hf)
        # Absent fields take the config class's defaults (Gemma2Config's, Gemma3TextConfig's).
        dh = hf.count("head_dim", 256)
        hf.expect("hidden_activation", _TANH_GELUS, "gelu_pytorch_tanh")
        hf.expect("use_bidirectional_attention", (None, False), None)
        max_len = hf.count("max_position_embeddings", self._max_len)
        types = self._types(hf, sizes["num_layers"])
        scalar = hf.take("query_pre_attn_scalar", 256)
        if isinstance(scalar, bool) or not isinstance(scalar, int | float) or scalar <= 0:
            raise ValueError(
                f"{hf.source}: config.json query_pre_attn_scalar={scalar!r} must be a number > 0"
            )
        ropes = self._ropes(hf, dh, max_len, types)
        options = self._options(hf)
        bias = hf.expect("attention_bias", (False, True), False)
        model = read_model(
            hf,
            names,
            sizes,
            head_dim=dh,
            norm="rmsnorm",
            norm_position="sandwich",
            norm_unit_offset=True,
            num_kv_heads=hf.count("num_key_value_heads", 4),
            qkv_bias=bias,
            out_bias=bias,
            mlp="geglu",
            mlp_bias=False,
            norm_eps=float(hf.take("rms_norm_eps", 1e-6)),
            logit_scale=float(scalar) ** -0.5,
            **options,
        )
        # transformers scales the embeddings by sqrt(D) itself, in float32 as posenc does.
        model = dataclasses.replace(model, scale_embeddings=True)
        # Gemma 3: the global layers' own RoPE (null sliding_window: refused, as transformers
        # refuses local layers without one).
        hparams, train_len, layers = local_global(
            hf, types, ropes, default_window=4096, global_rope=self.qk_norm
        )
        return Spec(model, "lm", "rope", hparams, train_len, layers=layers)

    # The config class's max_position_embeddings.
    _max_len = 8192

    def _types(self, hf: HFConfig, num_layers: int) -> tuple[str, ...]:
        """Gemma 2's layer_types: default local on even layers, global on odd ones."""
        default = [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)]
        return read_layer_types(hf, num_layers, default, allowed=(SLIDING, FULL))

    def _ropes(self, hf: HFConfig, dh: int, max_len: int, types) -> dict:
        """Gemma 2: one RoPE for every layer."""
        one = read_rope(hf, dh, max_len)
        return dict.fromkeys(types, one)

    def _options(self, hf: HFConfig) -> dict[str, Any]:
        """Gemma 2's soft caps (a ``null`` turns one off)."""
        attn = nullable(hf, "attn_logit_softcapping", 50.0)
        final = nullable(hf, "final_logit_softcapping", 30.0)
        return {"softcap": _cap(hf, "attn_logit_softcapping", attn)} | {
            "output_softcap": _cap(hf, "final_logit_softcapping", final)
        }

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
            if self.qk_norm:
                rules += [
                    copy(f"{hf}self_attn.{n}_norm.weight", (*at, "attn_params", f"{n}_norm"), (dh,))
                    for n in ("q", "k")
                ]
        return rules + [copy("model.norm.weight", ("final_norm", "scale"), (d,))]

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        out = common_misfits(
            spec,
            self.name,
            layers=True,
            encoding="rope",
            norm="rmsnorm",
            norm_position="sandwich",
            norm_unit_offset=True,
            scale_embeddings=True,
            mlp="geglu",
            mlp_bias=False,
            residual="sequential",
            embed_norm=False,
            causal=True,
            head_transform=None,
            output_bias=False,
            # Any soft caps and logit scale (Gemma 3 does not soft-cap attention).
            softcap=0.0 if self.qk_norm else m.softcap,
            output_softcap=m.output_softcap,
            logit_scale=m.logit_scale,
            qk_norm="rms" if self.qk_norm else "none",
            qk_norm_placement="before_rotate",
        )
        if m.qkv_bias != m.out_bias:
            out.append("model.qkv_bias and model.out_bias differ (Gemma's attention_bias is both)")
        out += _rope_misfits(spec.hparams, "encoding.hparams")
        out += self._kind_misfits(spec)
        return out

    def _kind_misfits(self, spec: Spec) -> list[str]:
        """The layer kinds Gemma holds: ``sliding_attention`` with the window alone, and
        ``full_attention`` with nothing (Gemma 2) or its own RoPE (Gemma 3)."""
        out = []
        if not spec.pattern:
            return out
        for name, fields in spec.kinds.items():
            where = f"layers.kinds.{name}"
            if name == SLIDING:
                window = str(fields.get("window", ""))
                if set(fields) != {"window"} or not window.startswith("sliding:"):
                    out.append(f"{where}={fields!r} (needs exactly a window 'sliding:W')")
            elif name == FULL:
                allowed = {"encoding", "hparams"} if self.qk_norm else set()
                if set(fields) - allowed or fields.get("encoding", "rope") != "rope":
                    out.append(f"{where}={fields!r} (needs {'its RoPE' if allowed else 'nothing'})")
                out += _rope_misfits(fields.get("hparams", {}), f"{where}.hparams")
            else:
                out.append(f"{where} (Gemma's layers are {SLIDING!r} or {FULL!r})")
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        types = [FULL] * m.num_layers
        if spec.pattern:
            types = list(write_layer_types(spec.pattern, m.num_layers)["layer_types"])
        kinds = spec.kinds
        window = kinds.get(SLIDING, {}).get("window", "sliding:4096")
        out = {
            **write_sizes(m),
            "num_key_value_heads": m.kv_heads,
            "head_dim": m.dims.head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "rms_norm_eps": m.norm_eps,
            "tie_word_embeddings": m.tie_embeddings,
            "attention_bias": m.qkv_bias,
            "query_pre_attn_scalar": _scalar(m.logit_scale, m.dims.head_dim),
            "sliding_window": int(window.partition(":")[2]),
            "layer_types": types,
        }
        rope, max_len = self._write_rope(spec)
        out["max_position_embeddings"] = max_len or spec.train_len
        out.update(rope)
        out.update(self._write_options(spec))
        return out

    def _write_rope(self, spec: Spec) -> tuple[dict[str, Any], int | None]:
        return write_rope(spec.hparams, spec.model.dims.head_dim, fraction_key=None)

    def _write_options(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            "attn_logit_softcapping": m.softcap or None,
            "final_logit_softcapping": m.output_softcap or None,
        }


@register
class Gemma3(Gemma2):
    name = "gemma3"
    model_types = ("gemma3_text",)
    export_type = "gemma3_text"
    export_architecture = "Gemma3ForCausalLM"
    qk_norm = True
    _max_len = 131_072

    def _types(self, hf: HFConfig, num_layers: int) -> tuple[str, ...]:
        """Gemma 3's layer_types: default five local layers, then a global one
        (``sliding_window_pattern``, 6, in older files)."""
        n = hf.count("sliding_window_pattern", 6)
        default = [SLIDING if (i + 1) % n else FULL for i in range(num_layers)]
        return read_layer_types(hf, num_layers, default, allowed=(SLIDING, FULL))

    def _ropes(self, hf: HFConfig, dh: int, max_len: int, types) -> dict:
        return read_rope_global_local(
            hf,
            dh,
            max_len,
            types,
            global_base=1_000_000.0,
            local_base=10_000.0,
            local_key="rope_local_base_freq",
        )

    def _options(self, hf: HFConfig) -> dict[str, Any]:
        """Gemma 3's per-head QK-norm; the attention is not soft-capped (Gemma3Attention never
        passes ``attn_logit_softcapping`` to attention), the output logits are when
        ``final_logit_softcapping`` is set."""
        hf.ignore("attn_logit_softcapping")
        final = nullable(hf, "final_logit_softcapping", None)
        return {
            "qk_norm": "rms",
            "qk_norm_placement": "before_rotate",
            "output_softcap": _cap(hf, "final_logit_softcapping", final),
        }

    def _write_rope(self, spec: Spec) -> tuple[dict[str, Any], int | None]:
        dh = spec.model.dims.head_dim
        local, _ = rope_entry(spec.hparams, dh)
        full_hparams = spec.kinds.get(FULL, {}).get("hparams", spec.hparams)
        full, max_len = rope_entry(full_hparams, dh)
        return {"rope_parameters": {SLIDING: local, FULL: full}}, max_len

    def _write_options(self, spec: Spec) -> dict[str, Any]:
        return {"final_logit_softcapping": spec.model.output_softcap or None}


def _cap(hf: HFConfig, key: str, value: Any) -> float:
    """A soft cap as posenc's option: ``null`` -> 0 (off), else a number > 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{hf.source}: config.json {key}={value!r} must be null or a number > 0")
    if not math.isfinite(value):
        raise ValueError(f"{hf.source}: config.json {key}={value!r} must be finite")
    return float(value)


def _scalar(logit_scale: float, head_dim: int) -> int | float:
    """``query_pre_attn_scalar`` of a logit scale (``scalar ** -0.5``): an integer where it is
    one to float rounding, so that reading it back gives the same scale."""
    if not logit_scale:
        return head_dim
    scalar = 1.0 / logit_scale**2
    near = round(scalar)
    return near if near > 0 and float(near) ** -0.5 == logit_scale else scalar


def _rope_misfits(hparams: dict[str, Any], where: str) -> list[str]:
    """A RoPE transformers' Gemma and OLMo rotate: half layout, every channel."""
    if hparams.get("layout", "half") != "half" or hparams.get("fraction", 1.0) != 1.0:
        return [f"{where}: RoPE with layout 'interleaved' or fraction < 1"]
    return []
