"""The parts every posenc model is assembled from, each family-agnostic: attention
(self and cross), MLP kinds, norms, token embedding, the block, caches, and the config that
describes them. The assemblies are in :mod:`posenc.models`."""

from posenc.layers.attention import CrossAttention, SelfAttention
from posenc.layers.block import Block
from posenc.layers.cache import CrossCache, LayerCache
from posenc.layers.config import DTYPES, NORM_POSITIONS, RESIDUALS, ModelConfig
from posenc.layers.embed import TokenEmbedding
from posenc.layers.mlp import MLP_KINDS, Mlp
from posenc.layers.norms import NORMS, make_norm
from posenc.layers.params import AXES, EncoderParam

__all__ = [
    "AXES",
    "DTYPES",
    "MLP_KINDS",
    "NORMS",
    "NORM_POSITIONS",
    "RESIDUALS",
    "Block",
    "CrossAttention",
    "CrossCache",
    "EncoderParam",
    "LayerCache",
    "Mlp",
    "ModelConfig",
    "SelfAttention",
    "TokenEmbedding",
    "make_norm",
]
