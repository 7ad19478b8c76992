"""GPT-2: learned absolute positions (``wpe``, posenc's ``learned`` encoder), LayerNorm,
tanh-GELU MLP, biases everywhere, and ``Conv1D`` weights (stored ``[in, out]``, unlike
``nn.Linear``), with one fused ``c_attn [D, 3 D]`` whose columns are ``[q | k | v]``.

====================================================  ======================================
Hugging Face (``transformer.h.i.``)                   posenc (``blocks.i.``)
====================================================  ======================================
``transformer.wte.weight``, ``transformer.wpe``       ``embed.embedding``, the learned table
``ln_1``, ``ln_2``                                    ``attn_norm``, ``mlp_norm``
``attn.c_attn [D, 3 D]``                              ``attn.{q,k,v}``, their biases
``attn.c_proj [D, D]``                                ``attn.o``, ``attn.o_bias``
``mlp.c_fc``, ``mlp.c_proj``                          ``mlp.wi``, ``mlp.wo``
``transformer.ln_f``                                  ``final_norm``
====================================================  ======================================

The Hub's GPT-2 files hold the base model's names (``h.0...``, ``wte.weight``); both spellings
are read.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.hf.family import (
    ACT_NAMES,
    Family,
    Path,
    Rule,
    Spec,
    activation,
    common_misfits,
    conv1d,
    copy,
    embeddings,
    hf_tied,
    layernorm,
    plain_heads,
    prefix_of,
    read_model,
    read_sizes,
    register,
    write_sizes,
    zero_attention_biases,
)
from posenc.hf.fields import HFConfig

# config.json key -> ModelConfig field (n_inner, the MLP's width, defaults to 4 D).
_SIZES = {
    "vocab_size": "vocab_size",
    "n_embd": "model_dim",
    "n_layer": "num_layers",
    "n_head": "num_heads",
}


def _fused_columns(hf: str, paths: tuple[Path, ...], d: int, h: int, dh: int, bias: bool) -> Rule:
    """``c_attn``: ``[D, 3 D]`` (or the bias ``[3 D]``) <-> ``q, k, v [D, H, Dh]`` (``[H, Dh]``)."""
    lead = () if bias else (d,)

    def load(w):
        return tuple(p.reshape(*lead, h, dh) for p in np.split(w, 3, axis=-1))

    def save(*parts):
        return np.concatenate([p.reshape(*lead, h * dh) for p in parts], axis=-1)

    return Rule(hf, (*lead, 3 * h * dh), paths, load, save)


@register
class GPT2(Family):
    name = "gpt2"
    model_types = ("gpt2",)
    export_type = "gpt2"
    export_architecture = "GPT2LMHeadModel"
    ignored_suffixes = (".attn.bias", ".attn.masked_bias")

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        sizes = read_sizes(hf, _SIZES)
        hf.expect("scale_attn_weights", (True,), True)
        hf.expect("scale_attn_by_inverse_layer_idx", (False,), False)
        hf.expect("add_cross_attention", (False,), False)
        # Upcasting and reordering the logits' product changes rounding only; summary_*
        # describe a sequence-classification head the LM does not have.
        hf.ignore("reorder_and_upcast_attn", "summary_type", "summary_use_proj")
        hf.ignore("summary_activation", "summary_proj_to_labels", "summary_first_dropout")
        max_len = hf.count("n_positions")
        model = read_model(
            hf,
            names,
            sizes,
            mlp_dim=hf.take("n_inner", 4 * sizes["model_dim"]),
            norm="layernorm",
            qkv_bias=True,
            out_bias=True,
            mlp=activation(hf, "activation_function", "gelu_new"),
            norm_eps=float(hf.take("layer_norm_epsilon")),
        )
        prefix = prefix_of(names, "wte.weight", "transformer.")
        return Spec(model, "lm", "learned", {"max_len": max_len}, max_len, {"prefix": prefix})

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, dh, f = m.model_dim, m.num_heads, m.dims.head_dim, m.mlp_dim
        t = spec.extra.get("prefix", "transformer.")
        max_len = spec.hparams["max_len"]
        rules = embeddings(spec, t + "wte.weight", "lm_head.weight")
        rules.append(copy(t + "wpe.weight", ("shared_pos_params", "table"), (max_len, d)))
        for i in range(m.num_layers):
            hf, at = f"{t}h.{i}.", ("blocks", i)
            rules += layernorm(hf + "ln_1", (*at, "attn_norm"), d)
            rules += layernorm(hf + "ln_2", (*at, "mlp_norm"), d)
            qkv = tuple((*at, "attn", n) for n in ("q", "k", "v"))
            rules.append(_fused_columns(hf + "attn.c_attn.weight", qkv, d, h, dh, bias=False))
            rules.append(
                Rule(
                    hf + "attn.c_proj.weight",
                    (h * dh, d),
                    ((*at, "attn", "o"),),
                    lambda w, h=h, dh=dh, d=d: (w.reshape(h, dh, d),),
                    lambda o, d=d: o.reshape(-1, d),
                )
            )
            if m.qkv_bias:
                biases = tuple((*at, "attn", f"{n}_bias") for n in ("q", "k", "v"))
                rules.append(_fused_columns(hf + "attn.c_attn.bias", biases, d, h, dh, bias=True))
            if m.out_bias:
                rules.append(copy(hf + "attn.c_proj.bias", (*at, "attn", "o_bias"), (d,)))
            for name, w, n_in, n_out in (("c_fc", "wi", d, f), ("c_proj", "wo", f, d)):
                rules.append(
                    conv1d(hf + f"mlp.{name}.weight", (*at, "mlp", w, "kernel"), n_in, n_out)
                )
                rules.append(copy(hf + f"mlp.{name}.bias", (*at, "mlp", w, "bias"), (n_out,)))
        return rules + layernorm(t + "ln_f", ("final_norm",), d)

    def export_rules(self, spec: Spec) -> list[Rule]:
        """The rules of the exported model: posenc's missing attention biases as zeros."""
        attention = spec.extra.get("prefix", "transformer.") + "h.{}.attn."
        return self.rules(spec) + zero_attention_biases(
            spec, attention, "c_attn.bias", "c_proj.bias"
        )

    def fits(self, spec: Spec) -> list[str]:
        return common_misfits(
            spec,
            self.name,
            encoding="learned",
            norm="layernorm",
            mlp=tuple(ACT_NAMES),
            mlp_bias=True,
            norm_position="pre",
            residual="sequential",
            embed_norm=False,
            causal=True,
            **plain_heads(spec.model),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            **write_sizes(m, _SIZES),
            "n_inner": m.mlp_dim,
            "n_positions": spec.hparams.get("max_len", 2048),
            "activation_function": ACT_NAMES[m.mlp],
            "layer_norm_epsilon": m.norm_eps,
            "tie_word_embeddings": hf_tied(spec),
        }
