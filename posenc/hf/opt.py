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
    Family,
    Rule,
    Spec,
    activation,
    common_misfits,
    copy,
    dense,
    embeddings,
    head_bias,
    heads_in,
    heads_out,
    hf_tied,
    layernorm,
    prefix_of,
    register,
    untied,
)
from posenc.hf.fields import HFConfig
from posenc.layers.config import ModelConfig

# OPTLearnedPositionalEmbedding reads row position + 2.
_OFFSET = 2
_ACT_NAMES = {"relu": "relu", "gelu_exact": "gelu", "gelu": "gelu_new"}


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
        d, h = hf.take("hidden_size"), hf.take("num_attention_heads")
        hf.expect("word_embed_proj_dim", (d,), d)
        hf.expect("layer_norm_elementwise_affine", (True,), True)
        hf.expect("_remove_final_layer_norm", (False,), False)
        bias = hf.expect("enable_bias", (True,), True)
        pre = hf.expect("do_layer_norm_before", (True, False), True)
        hf.ignore("dropout", "layerdrop", "init_std")
        max_len = hf.take("max_position_embeddings")
        model = ModelConfig(
            vocab_size=hf.take("vocab_size"),
            num_layers=hf.take("num_hidden_layers"),
            model_dim=d,
            num_heads=h,
            mlp_dim=hf.take("ffn_dim"),
            norm="layernorm",
            dtype="float32",
            tie_embeddings=not untied(hf, names, "lm_head.weight", default=True),
            qkv_bias=bias,
            out_bias=bias,
            mlp=activation(hf, "activation_function", "relu"),
            mlp_bias=bias,
            norm_position="pre" if pre else "post",
            norm_eps=1e-5,  # nn.LayerNorm's default: OPT's config states none
            scale_embeddings=False,
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
            for n in ("q", "k", "v"):
                rules.append(heads_in(attn + f"{n}_proj.weight", (*at, "attn", n), d, h, dh))
                rules.append(head_bias(attn + f"{n}_proj.bias", (*at, "attn", f"{n}_bias"), h, dh))
            rules.append(heads_out(attn + "out_proj.weight", (*at, "attn", "o"), h, dh, d))
            rules.append(copy(attn + "out_proj.bias", (*at, "attn", "o_bias"), (d,)))
            rules += layernorm(hf + "self_attn_layer_norm", (*at, "attn_norm"), d)
            rules += dense(hf + "fc1", (*at, "mlp", "wi"), d, f)
            rules += dense(hf + "fc2", (*at, "mlp", "wo"), f, d)
            rules += layernorm(hf + "final_layer_norm", (*at, "mlp_norm"), d)
        if m.norm_position == "pre":
            rules += layernorm(t + "final_layer_norm", ("final_norm",), d)
        return rules

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        return common_misfits(
            spec,
            self.name,
            encoding="learned",
            norm="layernorm",
            mlp=tuple(_ACT_NAMES),
            mlp_bias=True,
            qkv_bias=True,
            out_bias=True,
            residual="sequential",
            embed_norm=False,
            causal=True,
            norm_eps=1e-5,
            num_kv_heads=(None, m.num_heads),
            head_dim=(None, m.model_dim // m.num_heads),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        return {
            "vocab_size": m.vocab_size,
            "hidden_size": m.model_dim,
            "word_embed_proj_dim": m.model_dim,
            "num_hidden_layers": m.num_layers,
            "num_attention_heads": m.num_heads,
            "ffn_dim": m.mlp_dim,
            "max_position_embeddings": spec.hparams["max_len"],
            "activation_function": _ACT_NAMES[m.mlp],
            "do_layer_norm_before": m.norm_position == "pre",
            "enable_bias": True,
            "tie_word_embeddings": hf_tied(spec),
        }
