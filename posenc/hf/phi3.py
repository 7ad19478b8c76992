"""Phi-3 (mini, small, medium; 4k and 128k): Llama's parts with the query, key and value rows
fused in one ``qkv_proj`` and the SwiGLU gate and up rows in one ``gate_up_proj``; RoPE with
LongRoPE's per-pair short and long factors in the 128k models (``rope_scaling`` of type
``longrope``, or its old names ``su`` and ``yarn``, as transformers reads them).

=====================================================  ======================================
Hugging Face (``model.layers.i.``)                      posenc (``blocks.i.``)
=====================================================  ======================================
``self_attn.qkv_proj [(H + 2 KV) Dh, D]``              ``attn.q``, ``attn.k``, ``attn.v``
``mlp.gate_up_proj [2 F, D]``                          ``mlp.wg`` (first half), ``mlp.wi``
=====================================================  ======================================

The other tensors are named as Llama's (:mod:`posenc.hf.llama`). ``sliding_window`` (2047 in the
4k models, 262144 in the 128k ones) is the attention window ``"sliding:W"``, as Mistral's
(:func:`posenc.hf.per_layer.read_window`). Export writes Llama's layout (:mod:`posenc.hf.llama`
holds the same model: Mistral's config where there is a window).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from posenc.hf.family import Rule, Spec, register
from posenc.hf.fields import HFConfig
from posenc.hf.llama import Llama
from posenc.hf.per_layer import read_window, window_kind


def _rows(hf: str, parts: tuple[tuple[tuple, int, int], ...], d: int) -> Rule:
    """A weight ``[sum(rows), D]`` fused along its rows: ``parts`` = ``(path, heads, width)``
    each (a ``[D, heads, width]`` projection, or ``heads = 0`` for a ``[D, width]`` kernel)."""
    sizes = [max(h, 1) * w for _, h, w in parts]

    def load(w):
        out = []
        for block, (_, h, width) in zip(np.split(w, np.cumsum(sizes)[:-1]), parts, strict=True):
            out.append(block.T.reshape(d, h, width) if h else block.T)
        return tuple(out)

    def save(*arrays):
        return np.concatenate([a.reshape(d, -1).T for a in arrays])

    return Rule(hf, (sum(sizes), d), tuple(p for p, _, _ in parts), load, save)


@register
class Phi3(Llama):
    name = "phi3"
    model_types = ("phi3",)

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        layers = [window_kind(read_window(hf, None))] * hf.count("num_hidden_layers")
        hf.take("model_type")
        return dataclasses.replace(self.read_as(hf, names, "llama", layers), extra={})

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, kv, dh, f = m.model_dim, m.num_heads, m.kv_heads, m.dims.head_dim, m.mlp_dim
        fused = {}
        for i in range(m.num_layers):
            hf, at = f"model.layers.{i}.", ("blocks", i)
            qkv = tuple(
                ((*at, "attn", n), heads, dh) for n, heads in (("q", h), ("k", kv), ("v", kv))
            )
            gate_up = (((*at, "mlp", "wg", "kernel"), 0, f), ((*at, "mlp", "wi", "kernel"), 0, f))
            fused[hf + "self_attn.q_proj.weight"] = _rows(hf + "self_attn.qkv_proj.weight", qkv, d)
            fused[hf + "mlp.gate_proj.weight"] = _rows(hf + "mlp.gate_up_proj.weight", gate_up, d)
        drop = {"self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight"}
        out = []
        for rule in super().rules(spec):
            if rule.hf in fused:
                out.append(fused[rule.hf])
            elif not rule.hf.endswith(tuple(drop)):
                out.append(rule)
        return out

    def export_rules(self, spec: Spec) -> list[Rule]:
        """Llama's tensors (unfused): the export is a Llama folder."""
        return Llama.rules(self, spec)
