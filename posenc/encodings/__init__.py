"""Positional encoders behind one contract (see :mod:`posenc.encodings.base`) and their registry.

>>> from posenc import encodings
>>> rope = encodings.get("rope", base=500_000.0)
>>> encodings.names()
('alibi', 'learned', 'nope', 'rope', 'shaw', 'sinusoidal', 't5', 'xl')
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posenc.encodings.alibi import ALiBi, alibi_slopes
from posenc.encodings.base import HOOKS, Dims, Encoding, Params
from posenc.encodings.learned import Learned
from posenc.encodings.nope import NoPE
from posenc.encodings.relative import rel_shift, rel_unshift
from posenc.encodings.rope import RoPE, apply_rope
from posenc.encodings.shaw import Shaw, clipped_relative_index
from posenc.encodings.sinusoidal import Sinusoidal, sinusoidal_table
from posenc.encodings.t5 import T5Bias, relative_position_bucket
from posenc.encodings.xl import TransformerXL

_REGISTRY: dict[str, type[Encoding]] = {}


def register(cls: type[Encoding]) -> type[Encoding]:
    """Adds an encoder class to the registry under ``cls.name`` (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"encoding name {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (Sinusoidal, Learned, Shaw, TransformerXL, T5Bias, RoPE, ALiBi, NoPE):
    register(_cls)


def names() -> tuple[str, ...]:
    """The registered encoder names, sorted."""
    return tuple(sorted(_REGISTRY))


def get_class(name: str) -> type[Encoding]:
    """The encoder class registered as ``name``; a ``ValueError`` lists the known names."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown encoding.name {name!r}; known encodings: {', '.join(names())}")
    return _REGISTRY[name]


def hparam_names(name: str) -> tuple[str, ...]:
    """The hyperparameters encoder ``name`` accepts."""
    return tuple(f.name for f in dataclasses.fields(get_class(name)) if f.name != "dims")


def get(name: str, **hparams: Any) -> Encoding:
    """Creates the (unbound) encoder registered as ``name`` with the given hyperparameters.

    Raises:
      ValueError: for an unknown name (listing the known ones), an unknown hyperparameter
        (listing the accepted ones), or an invalid value (naming the field).
    """
    cls = get_class(name)
    allowed = hparam_names(name)
    unknown = sorted(set(hparams) - set(allowed))
    if unknown:
        raise ValueError(
            f"encoding {name!r} has no hyperparameter(s) {unknown}; "
            f"it accepts: {', '.join(allowed) or '(none)'}"
        )
    return cls(**hparams)


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
    "alibi_slopes",
    "apply_rope",
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
