"""SmolLM3 (Hugging Face, 3B): Llama's parts (:mod:`posenc.hf.llama`) with RoPE left out of some
layers: ``no_rope_layers`` lists one entry per layer (1: RoPE, 0: none), by default every
``no_rope_layer_interval``-th layer (4: three RoPE layers, then one NoPE layer). Its optional
sliding window (``use_sliding_window`` with ``sliding_window``) is on the layers ``layer_types``
names ``"sliding_attention"``, by default the NoPE ones.

Each layer is a kind of posenc's layer pattern (:mod:`posenc.layers.pattern`): ``"rope"`` (the
model's RoPE) or ``"nope"`` (``encoding="nope"``), with ``"_sliding"`` and the window
``"sliding:W"`` where it has one; a model whose layers are all alike has no pattern. The tensors
are named as Llama's (``attention_bias`` puts biases on all four attention projections,
``mlp_bias`` on the MLP's); embeddings are tied unless ``tie_word_embeddings`` is false.
Export writes ``no_rope_layers`` and ``layer_types`` layer by layer.
"""

from __future__ import annotations

from typing import Any

from posenc.hf.family import Spec, register
from posenc.hf.fields import HFConfig
from posenc.hf.layer_types import read_layer_types
from posenc.hf.llama import Llama
from posenc.hf.per_layer import layer_fields, read_window, windows_of


@register
class SmolLM3(Llama):
    name = "smollm3"
    model_types = ("smollm3",)
    export_type = "smollm3"
    export_architecture = "SmolLM3ForCausalLM"
    null_token_ids = ("pad_token_id", "bos_token_id", "eos_token_id")

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        hf.take("model_type")
        n = hf.count("num_hidden_layers")
        rope = hf.take("no_rope_layers", None)
        if rope is None:
            interval = hf.count("no_rope_layer_interval", 4)
            rope = [int((i + 1) % interval != 0) for i in range(n)]
        else:
            hf.ignore("no_rope_layer_interval")  # transformers reads it only without the list
        if (
            not isinstance(rope, list)
            or len(rope) != n
            or any(isinstance(r, bool) or r not in (0, 1) for r in rope)
        ):
            raise ValueError(
                f"{hf.source}: config.json no_rope_layers={rope!r} must list {n} entries (one "
                "per layer), each 1 (RoPE) or 0 (none)"
            )
        use = hf.expect("use_sliding_window", (False, True), False)
        window = read_window(hf, None)
        derived = [
            "sliding_attention" if use and window != "full" and not r else "full_attention"
            for r in rope
        ]
        allowed = ("full_attention", "sliding_attention")
        types = read_layer_types(hf, n, derived, allowed=allowed)
        if "sliding_attention" in types and (window == "full" or not use):
            raise ValueError(
                f"{hf.source}: config.json layer_types has sliding_attention layers without "
                f"use_sliding_window and a sliding_window (use_sliding_window={use}, "
                f"sliding_window={hf.fields.get('sliding_window')!r}): transformers' window "
                "there depends on the attention implementation; set both or neither"
            )
        layers = []
        for r, t in zip(rope, types, strict=True):
            fields: dict[str, Any] = {} if r else {"encoding": "nope"}
            if t == "sliding_attention":
                fields["window"] = window
            layers.append(
                (("rope" if r else "nope") + ("_sliding" if "window" in fields else ""), fields)
            )
        return self.read_as(hf, names, "smollm3", layers)

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        out = self.misfits(spec, layer_windows=True, nope_layers=True)
        if m.qkv_bias != m.out_bias:
            out.append(
                f"model.qkv_bias={m.qkv_bias} with model.out_bias={m.out_bias} (SmolLM3's "
                "attention_bias sets both)"
            )
        return out

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        types, size = windows_of(spec)
        return {
            **self.write_common(spec),
            "attention_bias": m.qkv_bias,
            "mlp_bias": m.mlp_bias,
            "no_rope_layers": [int(layer["encoding"] == "rope") for layer in layer_fields(spec)],
            "use_sliding_window": size is not None,
            "sliding_window": size,
            "layer_types": types,
        }
