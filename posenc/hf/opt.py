"""OPT: learned absolute positions (posenc's ``learned`` encoder; OPT's table starts at row 2,
``OPTLearnedPositionalEmbedding``'s offset), LayerNorm before (or, with
``do_layer_norm_before=false``, after) each sublayer, a ReLU MLP, biases everywhere, tied
embeddings.

=====================================================  ======================================
Hugging Face (``model.decoder.``)                       posenc
=====================================================  ======================================
``embed_tokens``                                       ``embed.embedding``
``embed_positions [2 + max_len, D]``                   the learned table (rows 2 on)
``layers.i.self_attn.{q,k,v,out}_proj``                ``blocks.i.attn.{q,k,v,o}``, biases
``layers.i.self_attn_layer_norm``                      ``blocks.i.attn_norm``
``layers.i.fc1``, ``fc2``                              ``blocks.i.mlp.wi``, ``wo``
``layers.i.final_layer_norm``                          ``blocks.i.mlp_norm``
``final_layer_norm`` (pre-norm models)                 ``final_norm``
=====================================================  ======================================

OPT's positions count the attended tokens (``cumsum(attention_mask) - 1``), which is
``0 .. T - 1`` for inputs without padding. OPT-350m's ``word_embed_proj_dim`` projections
(embeddings narrower than the model) are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.hf.family import (
    ACT_NAMES,
    SIZES,
    Family,
    Rule,
    Spec,
    activation,
    common_misfits,
    dense_mlp,
    embeddings,
    hf_tied,
    layernorm,
    plain_heads,
    prefix_of,
    read_model,
    read_sizes,
    register,
    separate_attention,
    write_sizes,
)
from posenc.hf.fields import HFConfig

# OPTLearnedPositionalEmbedding reads row position + 2.
_OFFSET = 2
# transformers' names of the sizes, but OPT's ffn_dim for the MLP's width.
_SIZES = {key: field for key, field in SIZES.items() if field != "mlp_dim"} | {"ffn_dim": "mlp_dim"}


def _positions(hf: str, rows: int, d: int) -> Rule:
    """``embed_positions [2 + rows, D]`` <-> the learned table ``[rows, D]`` (rows 0 and 1 are
    never read; written as zeros)."""
    return Rule(
        hf,
        (_OFFSET + rows, d),
        (("shared_pos_params", "table"),),
        lambda w: (w[_OFFSET:],),
        lambda table: np.concatenate([np.zeros((_OFFSET, d), table.dtype), table]),
    )


@register
class OPT(Family):
    name = "opt"
    model_types = ("opt",)
    export_type = "opt"
    export_architecture = "OPTForCausalLM"

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        sizes = read_sizes(hf, _SIZES)
        d = sizes["model_dim"]
        hf.expect("word_embed_proj_dim", (d,), d)
        hf.expect("layer_norm_elementwise_affine", (True,), True)
        hf.expect("_remove_final_layer_norm", (False,), False)
        bias = hf.expect("enable_bias", (True,), True)
        pre = hf.expect("do_layer_norm_before", (True, False), True)
        hf.ignore("dropout", "layerdrop", "init_std")
        max_len = hf.count("max_position_embeddings")
        model = read_model(
            hf,
            names,
            sizes,
            norm="layernorm",
            qkv_bias=bias,
            out_bias=bias,
            mlp=activation(hf, "activation_function", "relu"),
            mlp_bias=bias,
            norm_position="pre" if pre else "post",
            norm_eps=1e-5,  # nn.LayerNorm's default: OPT's config states none
        )
        prefix = prefix_of(names, "decoder.embed_tokens.weight", "model.")
        return Spec(model, "lm", "learned", {"max_len": max_len}, max_len, {"prefix": prefix})

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, dh, f = m.model_dim, m.num_heads, m.dims.head_dim, m.mlp_dim
        t = spec.extra.get("prefix", "model.") + "decoder."
        rules = embeddings(spec, t + "embed_tokens.weight", "lm_head.weight")
        rules.append(_positions(t + "embed_positions.weight", spec.hparams["max_len"], d))
        for i in range(m.num_layers):
            hf, at = f"{t}layers.{i}.", ("blocks", i)
            attn = hf + "self_attn."
            qkvo = tuple(attn + f"{n}_proj" for n in ("q", "k", "v", "out"))
            rules += separate_attention(qkvo, (*at, "attn"), d, h, dh)
            rules += layernorm(hf + "self_attn_layer_norm", (*at, "attn_norm"), d)
            rules += dense_mlp(hf + "fc1", hf + "fc2", at, d, f)
            rules += layernorm(hf + "final_layer_norm", (*at, "mlp_norm"), d)
        if m.norm_position == "pre":
            rules += layernorm(t + "final_layer_norm", ("final_norm",), d)
        return rules

    def fits(self, spec: Spec) -> list[str]:
        return common_misfits(
            spec,
            self.name,
            encoding="learned",
            norm="layernorm",
            mlp=tuple(ACT_NAMES),
            mlp_bias=True,
            qkv_bias=True,
            out_bias=True,
            residual="sequential",
            embed_norm=False,
            causal=True,
            norm_eps=1e-5,
            **plain_heads(spec.model),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            **write_sizes(m, _SIZES),
            "word_embed_proj_dim": m.model_dim,
            "max_position_embeddings": spec.hparams["max_len"],
            "activation_function": ACT_NAMES[m.mlp],
            "do_layer_norm_before": m.norm_position == "pre",
            "enable_bias": True,
            "tie_word_embeddings": hf_tied(spec),
        }
