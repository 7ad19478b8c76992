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

from posenc.hf.family import nullable
from posenc.hf.fields import HFConfig
from posenc.hf.rope import read_rope, write_rope

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


SLIDING, FULL = "sliding_attention", "full_attention"


def read_rope_global_local(
    hf: HFConfig,
    head_dim: int,
    max_len: int,
    types: Sequence[str],
    *,
    global_base: float,
    local_base: float,
    local_key: str | None = None,
) -> dict[str, tuple[dict[str, Any], int]]:
    """Each layer type's ``(rope hyperparameters, training length)`` as transformers 5 reads the
    rotary fields of a model with local and global layers (Gemma 3's and OLMo 3's
    ``convert_rope_params_to_dict``): ``rope_parameters`` nested by layer type where given, each
    entry's base defaulting to ``rope_theta`` (else ``global_base``) for the full-attention
    layers and to ``local_key`` (Gemma 3's ``rope_local_base_freq``; else ``local_base``) for
    the sliding ones; a ``rope_scaling`` scales the full-attention layers alone.

    OLMo 3 has no ``local_key``: transformers hands the one ``rope_theta`` to the full-attention
    layers and gives the sliding ones the class default, ``local_base`` (the published configs
    set both to it). ``tests/hf/test_gemma_olmo.py`` records transformers' own reading."""
    nested = hf.take("rope_parameters", None)
    scaling = hf.take("rope_scaling", None)
    if nested is not None and not (
        isinstance(nested, dict) and all(isinstance(v, dict) for v in nested.values())
    ):
        raise ValueError(
            f"{hf.source}: config.json rope_parameters={nested!r} must be nested by layer type "
            f"({{{SLIDING!r}: {{...}}, {FULL!r}: {{...}}}}) for posenc's {hf.family} import"
        )
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(
            f"{hf.source}: config.json rope_scaling must be an object (rope_type, factor, ...), "
            f"got {type(scaling).__name__} {scaling!r}"
        )
    params = {t: dict(v) for t, v in (nested or {}).items()}
    extra = sorted(set(params) - {SLIDING, FULL})
    if extra:
        raise ValueError(
            f"{hf.source}: config.json rope_parameters has an entry for layer type {extra[0]!r}; "
            f"posenc's {hf.family} import reads {SLIDING!r} and {FULL!r}"
        )
    full = params.setdefault(FULL, {"rope_type": "default"})
    full.update(scaling or {})
    theta = hf.take("rope_theta", None)
    full.setdefault("rope_theta", global_base if theta is None else theta)
    local = hf.take(local_key, None) if local_key else None
    params.setdefault(SLIDING, {"rope_type": "default"}).setdefault(
        "rope_theta", local_base if local is None else local
    )
    return {t: read_rope(hf, head_dim, max_len, params=params[t]) for t in dict.fromkeys(types)}


def rope_entry(hparams: dict[str, Any], head_dim: int) -> tuple[dict[str, Any], int | None]:
    """One layer type's entry of a ``rope_parameters`` nested by layer type, of posenc ``rope``
    hyperparameters (:func:`posenc.hf.rope.write_rope`), and the ``max_position_embeddings`` a
    dynamic scaling needs (None: any)."""
    flat, dynamic_len = write_rope(hparams, head_dim, fraction_key=None)
    entry = dict(flat.get("rope_scaling") or {"rope_type": "default"})
    entry["rope_theta"] = flat["rope_theta"]
    return entry, dynamic_len


def local_global(
    hf: HFConfig,
    types: Sequence[str],
    ropes: dict[str, tuple[dict[str, Any], int]],
    *,
    default_window: int,
    global_rope: bool,
) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """``(the model's RoPE hyperparameters, training length, Spec.layers)`` of a model of
    ``sliding_attention`` and ``full_attention`` layers (Gemma, OLMo 3): the local kind sees the
    config's ``sliding_window`` (``default_window`` when absent; a ``null`` or non-positive one
    is refused while local layers exist, as transformers refuses it) on the model's RoPE (the
    local layers'); the global kind has its own RoPE (``ropes[FULL]``) when ``global_rope``,
    else the model's. The training length is the shortest of the layer types'."""
    window = nullable(hf, "sliding_window", default_window)
    if SLIDING in types and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(
            f"{hf.source}: config.json sliding_window={window!r} must be a positive integer "
            "(the config has sliding_attention layers)"
        )
    local = ropes.get(SLIDING, ropes.get(FULL))
    kinds: dict[str, dict[str, Any]] = {SLIDING: {"window": f"sliding:{window}"}, FULL: {}}
    if global_rope:
        kinds[FULL] = {"encoding": "rope", "hparams": dict(ropes.get(FULL, local)[0])}
    pattern = pattern_of(types)
    layers = {"pattern": pattern, "kinds": {k: kinds[k] for k in dict.fromkeys(pattern)}}
    return local[0], min(length for _, length in ropes.values()), layers
