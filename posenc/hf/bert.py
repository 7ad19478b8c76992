"""BERT and RoBERTa masked LMs: learned absolute positions (posenc's ``learned`` encoder; RoBERTa's
table offset by its padding id), post-norm blocks, a LayerNorm on the embeddings, bidirectional
attention, biases everywhere, exact-GELU MLP, and the masked-LM head (a dense layer, GELU and a
LayerNorm before the tied output projection, plus a bias on the logits).

=========================================================  ====================================
Hugging Face (``bert.`` or ``roberta.``)                    posenc
=========================================================  ====================================
``embeddings.word_embeddings``                             ``embed.embedding``
``embeddings.position_embeddings`` + ``token_type[0]``     the learned table (rows from offset)
``embeddings.LayerNorm``                                   ``embed_norm``
``encoder.layer.i.attention.self.{query,key,value}``       ``blocks.i.attn.{q,k,v}``, biases
``encoder.layer.i.attention.output.dense``, ``LayerNorm``  ``attn.o``, ``o_bias``, ``attn_norm``
``encoder.layer.i.intermediate.dense``, ``output.dense``   ``mlp.wi``, ``mlp.wo``
``encoder.layer.i.output.LayerNorm``                       ``mlp_norm``
``cls.predictions.transform`` / ``lm_head.{dense,ln}``     ``head_transform``
``cls.predictions.bias`` / ``lm_head.bias``                ``output_bias``
=========================================================  ====================================

Positions: BERT reads row ``t`` of its table at position ``t``; RoBERTa row ``t + pad + 1``
(``create_position_ids_from_input_ids``, for inputs without padding), so posenc's table is the
rows from that offset on. Every token has token type 0, so that row is a constant added to every
embedding: it is folded into posenc's table on import. The token-type table itself is kept in
``spec.extra`` (``pretrained.json`` of an imported run), and export writes it back and takes row
0 out of the positions again, so an exported sentence-pair BERT adds what the original adds for
token type 1 too. Pooler and next-sentence weights are not part of the masked LM and
are left out, as transformers' ``BertForMaskedLM`` leaves them; the token-type table and the
pooler start a classifier fine-tuned from the import (:meth:`Bert.head_rules`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from posenc.hf.family import (
    ACT_NAMES,
    Family,
    Rule,
    Spec,
    activation,
    common_misfits,
    copy,
    dense,
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
    zero_tensor,
)
from posenc.hf.fields import HFConfig

# spec.extra's copy of the checkpoint's token-type table (Bert.keep).
_KEPT = "token_type_table"
# model_type -> (checkpoint prefix, head prefix, architecture); RoBERTa's table is offset.
_KINDS = {
    "bert": ("bert.", "cls.predictions.", "BertForMaskedLM"),
    "roberta": ("roberta.", "lm_head.", "RobertaForMaskedLM"),
}


def _position_table(hf: str, tt: str, offset: int, rows: int, types: int, d: int) -> Rule:
    """``position_embeddings [offset + rows, D]`` and ``token_type_embeddings [types, D]`` <->
    the learned table ``[rows, D]`` = positions from ``offset`` on plus token type 0."""
    return Rule(
        hf,
        (offset + rows, d),
        (("shared_pos_params", "table"),),
        lambda pos, types_: (pos[offset:] + types_[0],),
        lambda table: _padded(table, offset),
        also=((tt, (types, d)),),
    )


def _padded(table, offset: int):
    return np.concatenate([np.zeros((offset, table.shape[1]), table.dtype), table])


@register
class Bert(Family):
    name = "bert"
    model_types = tuple(_KINDS)
    export_type = "bert"
    export_architecture = "BertForMaskedLM"
    ignored_suffixes = (
        "embeddings.position_ids",
        "pooler.dense.weight",
        "pooler.dense.bias",
        "seq_relationship.weight",
        "seq_relationship.bias",
        "predictions.decoder.bias",  # the same tensor as cls.predictions.bias
        "lm_head.decoder.bias",
    )

    def read(self, hf: HFConfig, names: set[str]) -> Spec:
        kind = hf.take("model_type")
        prefix, head, _ = _KINDS[kind]
        sizes = read_sizes(hf)
        hf.expect("position_embedding_type", ("absolute",), "absolute")
        hf.expect("is_decoder", (False,), False)
        hf.expect("add_cross_attention", (False,), False)
        hf.ignore("hidden_dropout_prob", "attention_probs_dropout_prob")
        offset = hf.take("pad_token_id") + 1 if kind == "roberta" else 0
        max_len = hf.count("max_position_embeddings") - offset
        if max_len < 1:
            raise ValueError(
                f"{hf.source}: config.json max_position_embeddings leaves no position after "
                f"RoBERTa's offset of {offset} (pad_token_id + 1)"
            )
        act = activation(hf, "hidden_act", "gelu")
        model = read_model(
            hf,
            names,
            sizes,
            head=head + "decoder.weight",
            norm="layernorm",
            causal=False,
            qkv_bias=True,
            out_bias=True,
            mlp=act,
            norm_position="post",
            norm_eps=float(hf.take("layer_norm_eps")),
            embed_norm=True,
            head_transform=act,
            output_bias=True,
        )
        extra = {
            "model_type": kind,
            "prefix": prefix_of(names, "embeddings.word_embeddings.weight", prefix),
            "offset": offset,
            "type_vocab_size": hf.take("type_vocab_size", 2),
        }
        return Spec(model, "lm", "learned", {"max_len": max_len}, max_len, extra)

    def _names(self, spec: Spec) -> tuple[str, str, str, int]:
        kind = spec.extra.get("model_type", "bert")
        prefix, head, _ = _KINDS[kind]
        return spec.extra.get("prefix", prefix), head, kind, spec.extra.get("offset", 0)

    def rules(self, spec: Spec) -> list[Rule]:
        m = spec.model
        d, h, dh, f = m.model_dim, m.num_heads, m.dims.head_dim, m.mlp_dim
        t, head, _, offset = self._names(spec)
        emb = t + "embeddings."
        types = spec.extra.get("type_vocab_size", 2)
        rules = embeddings(spec, emb + "word_embeddings.weight", head + "decoder.weight")
        rules.append(
            _position_table(
                emb + "position_embeddings.weight",
                emb + "token_type_embeddings.weight",
                offset,
                spec.hparams["max_len"],
                types,
                d,
            )
        )
        rules += layernorm(emb + "LayerNorm", ("embed_norm",), d)
        for i in range(m.num_layers):
            hf, at = f"{t}encoder.layer.{i}.", ("blocks", i)
            attn = hf + "attention."
            qkvo = (
                attn + "self.query",
                attn + "self.key",
                attn + "self.value",
                attn + "output.dense",
            )
            rules += separate_attention(qkvo, (*at, "attn"), d, h, dh)
            rules += layernorm(attn + "output.LayerNorm", (*at, "attn_norm"), d)
            rules += dense_mlp(hf + "intermediate.dense", hf + "output.dense", at, d, f)
            rules += layernorm(hf + "output.LayerNorm", (*at, "mlp_norm"), d)
        transform = head + ("transform." if head.startswith("cls") else "")
        norm = "LayerNorm" if head.startswith("cls") else "layer_norm"
        rules += dense(transform + "dense", ("head_transform", "dense"), d, d)
        rules += layernorm(transform + norm, ("head_transform", "norm"), d)
        return rules + [copy(head + "bias", ("output_bias",), (m.vocab_size,))]

    def head_rules(self, spec: Spec, names: set[str]) -> list[Rule]:
        """A classifier's segment embedding from the token-type table (row ``s`` minus row 0,
        which the position table holds), so segment ``s`` adds what token type ``s`` adds in
        BERT; and BERT's pooler (dense + tanh on ``[CLS]``) where the checkpoint has one
        (``BertForPreTraining``'s files; a masked-LM-only file has none). The output layer is
        always new, as in BERT's fine-tuning (Devlin et al. 2019, Sec. 4.1)."""
        t, _, _, _ = self._names(spec)
        d, types = spec.model.model_dim, spec.extra.get("type_vocab_size", 2)
        rules = [
            Rule(
                t + "embeddings.token_type_embeddings.weight",
                (types, d),
                (("segment_embed", "embedding"),),
                lambda table: (table - table[:1],),
                lambda table: table,
            )
        ]
        if t + "pooler.dense.weight" in names:
            rules += dense(t + "pooler.dense", ("head", "pooler"), d, d)
        return rules

    def keep(self, spec: Spec, read, names: set[str]) -> Spec:
        """The checkpoint's token-type table, float32 as nested lists in ``spec.extra``
        (``token_type_table``; ``type_vocab_size x D`` numbers, exact in JSON): only its row 0
        is in posenc's model, so export needs the table to write token type 1 back."""
        t, _, _, _ = self._names(spec)
        name = t + "embeddings.token_type_embeddings.weight"
        if name not in names:
            return spec
        table = np.asarray(read(name), np.float32)
        return dataclasses.replace(spec, extra={**spec.extra, _KEPT: table.tolist()})

    def from_parts(self, extra: dict[str, Any], parts: dict[str, np.ndarray]) -> dict[str, Any]:
        """A run imported before the table was kept: its classifier part ``segment_embed``
        holds every row minus row 0 (:meth:`head_rules`). Written as the token-type table (row 0
        zeros, so the positions keep row 0), position plus type s is the original's for every
        type."""
        segments = parts.get("segment_embed.embedding")
        if _KEPT in extra or segments is None:
            return extra
        return {**extra, _KEPT: np.asarray(segments, np.float32).tolist()}

    def export_rules(self, spec: Spec) -> list[Rule]:
        """The rules of the exported model: the imported token-type table as it was, its row 0
        taken out of the position table again (equal to float32 rounding); a model without
        one (posenc-trained, or imported before the table was kept) writes zeros, row 0 staying
        in the positions (token type 1 then adds what type 0 adds)."""
        t, _, _, offset = self._names(spec)
        name = t + "embeddings.token_type_embeddings.weight"
        shape = (spec.extra.get("type_vocab_size", 2), spec.model.model_dim)
        kept = spec.extra.get(_KEPT)
        if kept is None:
            return self.rules(spec) + [zero_tensor(name, shape)]
        types = np.asarray(kept, np.float32)
        if types.shape != shape:
            raise ValueError(
                f"the recorded {_KEPT} has shape {types.shape}, the model's config says {shape}"
            )
        rules = []
        for rule in self.rules(spec):
            if rule.also and rule.also[0][0] == name:  # the positions, with type row 0 in them
                rule = dataclasses.replace(
                    rule, save=lambda table: _padded(table - types[0], offset)
                )
            rules.append(rule)
        return rules + [Rule(name, shape, (), lambda a: (), lambda: types)]

    def fits(self, spec: Spec) -> list[str]:
        m = spec.model
        return common_misfits(
            spec,
            self.name,
            encoding="learned",
            norm="layernorm",
            mlp=tuple(ACT_NAMES),
            mlp_bias=True,
            qkv_bias=True,
            out_bias=True,
            norm_position="post",
            residual="sequential",
            embed_norm=True,
            causal=False,
            head_transform=m.mlp,
            output_bias=True,
            **plain_heads(m),
        )

    def write(self, spec: Spec) -> dict[str, Any]:
        m = spec.model
        _, _, kind, offset = self._names(spec)
        out = {
            "model_type": kind,
            "architectures": [_KINDS[kind][2]],
            **write_sizes(m),
            "hidden_act": ACT_NAMES[m.mlp],
            "max_position_embeddings": spec.hparams["max_len"] + offset,
            "type_vocab_size": spec.extra.get("type_vocab_size", 2),
            "layer_norm_eps": m.norm_eps,
            "position_embedding_type": "absolute",
            "tie_word_embeddings": hf_tied(spec),
        }
        if kind == "roberta":
            out["pad_token_id"] = offset - 1
        return out
