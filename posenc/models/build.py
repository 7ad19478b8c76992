"""A run config's model: ``build(config)`` picks the assembly, binds the encoder, draws the
parameters from the seed."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from flax import nnx

from posenc import encodings
from posenc.layers.config import ModelConfig
from posenc.layers.pattern import OPTION_FIELDS, LayerKind, check_pattern
from posenc.layers.pool import HeadConfig
from posenc.models.classifier import Classifier
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer

# `model.assembly`: which class a config builds.
ASSEMBLIES = {"lm": Transformer, "encoder_decoder": EncoderDecoder, "classifier": Classifier}
# Fields of `config.model` that describe the classifier's head (HeadConfig), not the shared parts.
HEAD_FIELDS = tuple(f.name for f in dataclasses.fields(HeadConfig))
# Fields of `config.model` that choose the assembly or describe an assembly's own parts.
_NOT_PARTS = ("assembly", *HEAD_FIELDS)


def assembly(config: ml_collections.ConfigDict) -> str:
    """``config.model.assembly`` (``"lm"`` when the config has no such field), checked."""
    name = config.model.get("assembly", "lm")
    if name not in ASSEMBLIES:
        raise ValueError(f"model.assembly must be one of {list(ASSEMBLIES)}, got {name!r}")
    return name


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The :class:`~posenc.layers.config.ModelConfig` of a run config."""
    fields = {k: v for k, v in config.model.to_dict().items() if k not in _NOT_PARTS}
    return ModelConfig(**fields)


def head_config(config: ml_collections.ConfigDict) -> HeadConfig:
    """The classifier head's :class:`~posenc.layers.pool.HeadConfig` (``model.num_labels``,
    ``model.pool``, ``model.num_segments``, ``model.pooler``; defaults where absent)."""
    return HeadConfig(**{k: v for k, v in config.model.to_dict().items() if k in HEAD_FIELDS})


def make_encoding(config: ml_collections.ConfigDict) -> encodings.Encoding:
    """The (unbound) encoder named by ``config.encoding`` (:func:`fill_train_len` applied)."""
    hparams = fill_train_len(config.encoding.name, config.encoding.hparams.to_dict(), config)
    return encodings.get(config.encoding.name, **hparams)


def fill_train_len(
    name: str, hparams: Mapping[str, Any], config: ml_collections.ConfigDict
) -> dict[str, Any]:
    """``hparams`` with ``train_len`` set to the run's ``train.seq_len`` where encoder ``name``
    has a ``train_len`` hyperparameter (the training length that defines it: HoPE's rotated
    pairs, FoPE's clipped frequencies) and the config leaves it unset (or None); otherwise as
    given."""
    out = dict(hparams)
    if (
        name in encodings.names()
        and "train_len" in encodings.hparam_names(name)
        and out.get("train_len") is None
    ):
        train = config.get("train")
        seq_len = train.get("seq_len") if train is not None else None
        if seq_len is not None:
            out["train_len"] = int(seq_len)
    return out


def layer_kinds(
    config: ml_collections.ConfigDict, model: ModelConfig | None = None
) -> tuple[LayerKind, ...]:
    """The layer kinds of ``config.layers`` in pattern order (:func:`kinds_of`)."""
    section = config.get("layers")
    pattern = tuple(section.get("pattern", ())) if section is not None else ()
    kinds = section.kinds.to_dict() if section is not None and "kinds" in section else {}
    if not pattern and not kinds:
        return ()
    for fields in kinds.values():
        if fields.get("encoding") is not None:
            hparams = fields.get("hparams") or {}
            fields["hparams"] = fill_train_len(fields["encoding"], hparams, config)
    model = model_config(config) if model is None else model
    return kinds_of(pattern, kinds, model, assembly(config))


def kinds_of(
    pattern: Sequence[str], kinds: Mapping[str, Mapping[str, Any]], model: ModelConfig, name: str
) -> tuple[LayerKind, ...]:
    """The layer kinds of a pattern and its kinds' fields (a run config's ``config.layers``, or
    an imported model's) in pattern order, one entry per pattern slot (empty without a pattern),
    each with its encoder (None: the model's) and its options (the model's, with the kind's
    overrides); one-line errors naming ``layers.<field>`` (:mod:`posenc.layers.pattern`): also
    for a pattern in an encoder-decoder (assembly ``name``) and for a kind whose encoder adds an
    input embedding (that belongs to the whole model)."""
    pattern = tuple(pattern)
    if not pattern and not kinds:
        return ()
    if name == "encoder_decoder":
        raise ValueError(
            "layers.pattern applies to the decoder-only and classifier assemblies, not to "
            "model.assembly='encoder_decoder'; leave layers.pattern and layers.kinds empty"
        )
    check_pattern(pattern, kinds, model.num_layers)
    built = {}
    for kind, fields in kinds.items():
        overrides = {k: fields[k] for k in OPTION_FIELDS if k in fields}
        options = model.attention_options(**overrides, prefix=f"layers.kinds.{kind}")
        encoding = None
        if fields.get("encoding") is not None:
            try:
                encoding = encodings.get(fields["encoding"], **dict(fields.get("hparams") or {}))
            except (KeyError, ValueError, TypeError) as error:
                raise ValueError(f"layers.kinds.{kind}: {error}") from None
            if {"embed", "embed_tokens"} & set(encoding.hooks):
                raise ValueError(
                    f"layers.kinds.{kind}.encoding={encoding.name!r} adds an input embedding, "
                    "which belongs to the whole model, not to a layer: set it as encoding.name "
                    "and give the kind an encoder that acts in attention (or none)"
                )
        elif fields.get("hparams"):
            raise ValueError(
                f"layers.kinds.{kind}.hparams is set without layers.kinds.{kind}.encoding; name "
                "the kind's encoder (the model's takes encoding.hparams)"
            )
        built[kind] = LayerKind(kind, encoding, options)
    return tuple(built[kind] for kind in pattern)


def build(
    config: ml_collections.ConfigDict, seed: int | None = None
) -> Transformer | EncoderDecoder | Classifier:
    """The model a run config describes, with parameters initialised from ``seed`` (default
    ``config.seed``)."""
    seed = config.seed if seed is None else seed
    name = assembly(config)
    # The classifier's head is the one part an assembly adds beyond the shared ModelConfig.
    extra = (head_config(config),) if name == "classifier" else ()
    model = model_config(config)
    layers = layer_kinds(config, model)
    kwargs = {"layers": layers} if layers else {}  # an encoder-decoder's are refused above
    return ASSEMBLIES[name](model, make_encoding(config), *extra, rngs=nnx.Rngs(seed), **kwargs)
