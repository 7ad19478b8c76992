"""A run config's model: ``build(config)`` picks the assembly, binds the encoder, draws the
parameters from the seed."""

from __future__ import annotations

import dataclasses

import ml_collections
from flax import nnx

from posenc import encodings
from posenc.layers.config import ModelConfig
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
    """The (unbound) encoder named by ``config.encoding``."""
    return encodings.get(config.encoding.name, **config.encoding.hparams.to_dict())


def build(
    config: ml_collections.ConfigDict, seed: int | None = None
) -> Transformer | EncoderDecoder | Classifier:
    """The model a run config describes, with parameters initialised from ``seed`` (default
    ``config.seed``)."""
    seed = config.seed if seed is None else seed
    name = assembly(config)
    # The classifier's head is the one part an assembly adds beyond the shared ModelConfig.
    extra = (head_config(config),) if name == "classifier" else ()
    return ASSEMBLIES[name](
        model_config(config), make_encoding(config), *extra, rngs=nnx.Rngs(seed)
    )
