"""A Hugging Face config's per-layer attention types (``layer_types``) and rotary parameters by
layer type, read into posenc's layer pattern (:mod:`posenc.layers.pattern`), and back.

transformers names each layer's attention in ``layer_types`` (``"sliding_attention"``,
``"full_attention"``, ``"chunked_attention"``), one entry per layer, and since version 5 may give
each layer type its own rotary parameters::

    "rope_parameters": {
      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    }

posenc states the same model as a repeating pattern of layer kinds (``config.layers``); an
imported family names its kinds after the layer types, so export writes them back as they were.
The pattern is the shortest one that repeats to the config's list (:func:`pattern_of`): layer
``i`` is ``pattern[i % len(pattern)]``, as :mod:`posenc.layers.pattern` reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc.hf.fields import HFConfig
from posenc.hf.rope import read_rope

# The attention layer types posenc's model builds (transformers' names).
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def read_layer_types(
    hf: HFConfig,
    num_layers: int,
    default: Sequence[str] | None = None,
    *,
    key: str = "layer_types",
    allowed: Sequence[str] = LAYER_TYPES,
) -> tuple[str, ...]:
    """The config's per-layer types under ``key`` (``default`` when absent or null; None
    there: every layer ``"full_attention"``), refused in one line unless a list of
    ``num_layers`` known types."""
    value = hf.take(key, None)
    if value is None:
        value = ["full_attention"] * num_layers if default is None else list(default)
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"{hf.source}: config.json {key}={value!r} must be a list of strings")
    if len(value) != num_layers:
        raise ValueError(
            f"{hf.source}: config.json {key} lists {len(value)} layers, but the model has "
            f"num_hidden_layers={num_layers}; give one entry per layer"
        )
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(
            f"{hf.source}: config.json {key} entry {unknown[0]!r} is not supported by posenc's "
            f"{hf.family} import (supported: {', '.join(allowed)})"
        )
    return tuple(value)


def pattern_of(types: Sequence[str]) -> tuple[str, ...]:
    """The shortest ``pattern`` with ``types[i] == pattern[i % len(pattern)]`` for every layer
    (a list that never repeats is its own pattern)."""
    types = tuple(types)
    for n in range(1, len(types) + 1):
        if all(t == types[i % n] for i, t in enumerate(types)):
            return types[:n]
    return types


def expand(pattern: Sequence[str], num_layers: int) -> tuple[str, ...]:
    """Every layer's kind: :func:`pattern_of` backwards."""
    return tuple(pattern[i % len(pattern)] for i in range(num_layers))


def read_rope_by_type(
    hf: HFConfig, head_dim: int, max_len: int, types: Sequence[str], **rope: Any
) -> dict[str, tuple[dict[str, Any], int]]:
    """Each layer type's ``(rope hyperparameters, training length)``
    (:func:`posenc.hf.rope.read_rope`, with its keyword arguments ``rope``): a
    ``rope_parameters`` nested by layer type gives each type its own entry (a type without a
    layer, or a layer type without an entry, is refused in one line); otherwise the config's one
    rotary embedding serves every type."""
    present = tuple(dict.fromkeys(types))
    nested = hf.fields.get("rope_parameters")
    if not (
        isinstance(nested, dict) and nested and all(isinstance(v, dict) for v in nested.values())
    ):
        one = read_rope(hf, head_dim, max_len, **rope)
        return dict.fromkeys(present, one)
    hf.take("rope_parameters")
    extra = sorted(set(nested) - set(present))
    if extra:
        raise ValueError(
            f"{hf.source}: config.json rope_parameters has an entry for layer type {extra[0]!r}, "
            f"which no layer has (layer_types: {', '.join(present)})"
        )
    missing = [t for t in present if t not in nested]
    if missing:
        raise ValueError(
            f"{hf.source}: config.json rope_parameters is given by layer type but has no entry "
            f"for {missing[0]!r}; give every layer type its rotary parameters"
        )
    return {t: read_rope(hf, head_dim, max_len, params=nested[t], **rope) for t in present}


def write_layer_types(pattern: Sequence[str], num_layers: int) -> dict[str, list[str]]:
    """The ``layer_types`` field of a pattern of kinds named after transformers' layer types."""
    unknown = sorted(set(pattern) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(
            f"layers.pattern kind {unknown[0]!r} is not a transformers layer type "
            f"({', '.join(LAYER_TYPES)}); an exported model names its kinds after them"
        )
    return {"layer_types": list(expand(pattern, num_layers))}
