"""posenc's assemblies: the decoder-only LM (causal or bidirectional), the encoder-decoder, and
Transformer-XL segment memory as functions over the LM's parts; ``build(config)`` makes the one
a run config describes. The parts are in :mod:`posenc.layers`."""

from posenc.layers.config import ModelConfig
from posenc.models.build import (
    ASSEMBLIES,
    assembly,
    build,
    head_config,
    make_encoding,
    model_config,
)
from posenc.models.classifier import Classifier
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer

__all__ = [
    "ASSEMBLIES",
    "Classifier",
    "EncoderDecoder",
    "ModelConfig",
    "Transformer",
    "assembly",
    "build",
    "head_config",
    "make_encoding",
    "model_config",
]
