"""A run config's model: ``build(config)`` picks the assembly, binds the encoder, draws the
parameters from the seed."""

from __future__ import annotations

import ml_collections
from flax import nnx

from posenc import encodings
from posenc.layers.config import ModelConfig
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer

# `model.assembly`: which class a config builds.
ASSEMBLIES = {"lm": Transformer, "encoder_decoder": EncoderDecoder}
# Fields of `config.model` that choose the assembly rather than describe its parts.
_NOT_PARTS = ("assembly",)


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


def make_encoding(config: ml_collections.ConfigDict) -> encodings.Encoding:
    """The (unbound) encoder named by ``config.encoding``."""
    return encodings.get(config.encoding.name, **config.encoding.hparams.to_dict())


def build(
    config: ml_collections.ConfigDict, seed: int | None = None
) -> Transformer | EncoderDecoder:
    """The model a run config describes, with parameters initialised from ``seed`` (default
    ``config.seed``)."""
    seed = config.seed if seed is None else seed
    cls = ASSEMBLIES[assembly(config)]
    return cls(model_config(config), make_encoding(config), rngs=nnx.Rngs(seed))
