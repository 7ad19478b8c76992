"""Positional encoders behind one contract (see :mod:`posenc.encodings.base`) and their registry.

Each encoder module registers its class with the :func:`register` decorator; the registry
(:mod:`posenc.encodings.registry`) finds the modules of this package and the encoders of
installed plugins (entry-point group ``posenc.encodings``) the first time it is queried.

>>> from posenc import encodings
>>> rope = encodings.get("rope", base=500_000.0)
>>> encodings.names()[:4]  # sorted: every module of this package, plus any plugin's
('alibi', 'cape', 'conv', 'cope')
"""

from __future__ import annotations

from posenc.encodings.alibi import ALiBi, alibi_slopes
from posenc.encodings.base import HOOKS, Dims, Encoding, Params
from posenc.encodings.learned import Learned
from posenc.encodings.nope import NoPE
from posenc.encodings.registry import get, get_class, hparam_names, names, register
from posenc.encodings.relative import rel_shift, rel_unshift
from posenc.encodings.rope import RoPE, apply_rope
from posenc.encodings.shaw import Shaw, clipped_relative_index
from posenc.encodings.sinusoidal import Sinusoidal, sinusoidal_table
from posenc.encodings.t5 import T5Bias, relative_position_bucket
from posenc.encodings.xl import TransformerXL
from posenc.encodings.xpos import XPos, apply_xpos

__all__ = [
    "HOOKS",
    "ALiBi",
    "Dims",
    "Encoding",
    "Learned",
    "NoPE",
    "Params",
    "RoPE",
    "Shaw",
    "Sinusoidal",
    "T5Bias",
    "TransformerXL",
    "XPos",
    "alibi_slopes",
    "apply_rope",
    "apply_xpos",
    "clipped_relative_index",
    "get",
    "get_class",
    "hparam_names",
    "names",
    "register",
    "rel_shift",
    "rel_unshift",
    "relative_position_bucket",
    "sinusoidal_table",
]
