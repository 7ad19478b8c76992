"""Qwen3 (0.6B to 32B dense): Llama's parts (:mod:`posenc.hf.llama`) with an RMSNorm over each
head's channels on the queries and on the keys before RoPE (one learned scale of ``head_dim`` for
all query heads and one for all key heads, the model's ``rms_norm_eps``): posenc's attention
option ``qk_norm="rms"``, ``qk_norm_placement="before_rotate"``. ``head_dim`` is stated (128 when
absent, as transformers' ``Qwen3Config``); ``attention_bias`` puts biases on all four attention
projections, and the MLP has none.

=====================================================  ======================================
Hugging Face (``model.layers.i.self_attn.``)           posenc (``blocks.i.``)
=====================================================  ======================================
``q_norm.weight [Dh]``                                 ``attn_params.q_norm``
``k_norm.weight [Dh]``                                 ``attn_params.k_norm``
=====================================================  ======================================

Every other tensor is named as Llama's. Sliding-window layers (``use_sliding_window``,
``max_window_layers``, ``layer_types``) are read as Qwen2's
(:func:`posenc.hf.llama.qwen_windows`).
"""

from __future__ import annotations

from typing import Any

from posenc.hf.family import Rule, Spec, copy, register
from posenc.hf.fields import HFConfig
from posenc.hf.llama import Llama, write_qwen_windows
from posenc.hf.per_layer import windows_of


@register
class Qwen3(Llama):
    name = "qwen3"
    model_types = ("qwen3",)
    export_type = "qwen3"
    export_architecture = "Qwen3ForCausalLM"

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        hf.take("model_type")
        return self.read_as(hf, names, "qwen3")

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        dh = m.dims.head_dim
        rules = super().rules(spec)
        for i in range(m.num_layers):
            attn = f"model.layers.{i}.self_attn."
            rules += [
                copy(attn + f"{n}_norm.weight", ("blocks", i, "attn_params", f"{n}_norm"), (dh,))
                for n in ("q", "k")
            ]
        return rules

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        out = self.misfits(
            spec, layer_windows=True, qk_norm="rms", qk_norm_placement="before_rotate"
        )
        if m.qkv_bias != m.out_bias or m.mlp_bias:
            out.append(
                f"model.qkv_bias={m.qkv_bias}, out_bias={m.out_bias}, mlp_bias={m.mlp_bias} "
                "(Qwen3 has biases on all four attention projections or on none, and none in "
                "its MLP)"
            )
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        return {
            **self.write_common(spec),
            "attention_bias": spec.model.qkv_bias,
            **write_qwen_windows(*windows_of(spec)),
        }
