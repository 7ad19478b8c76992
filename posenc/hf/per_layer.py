"""Per-layer differences of an imported family as a :class:`~posenc.hf.family.Spec`, and back:
each layer's kind (its window, its encoder) folded into the model's options when every layer is
alike, else into a layer pattern (``Spec.layers``, :mod:`posenc.layers.pattern`); for export,
each layer's effective encoder and attention options, whatever the spec states at the model and
what in its kinds.

A family states one ``(kind name, fields)`` per layer, the fields being what a run config's
``layers.kinds.<name>`` holds (``encoding`` and ``hparams`` for a kind with an encoder of its own,
``window`` and any other attention option): :func:`fold` makes the spec's parts of them, and
:func:`layer_fields` reads any spec (an imported one or a posenc-trained run's) layer by layer.
The windows transformers' configs state (``sliding_window`` and the layer types) are read and
written here too (:func:`read_window`, :func:`window_kind`, :func:`windows_of`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posenc import encodings
from posenc.attention.options import OPTION_FIELDS, AttentionOptions, parse_window
from posenc.hf.family import Spec
from posenc.hf.fields import HFConfig
from posenc.hf.layer_types import expand, pattern_of


def fold(layers: Sequence[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model-level fields, Spec.layers)`` of each layer's ``(kind name, fields)``: every
    layer alike gives its fields for the whole model and no pattern; else the shortest
    repeating pattern of the names and each kind's fields (one set of fields per name)."""
    names = tuple(name for name, _ in layers)
    kinds: dict[str, dict[str, Any]] = {}
    for name, fields in layers:
        if kinds.setdefault(name, fields) != fields:
            raise ValueError(f"layer kind {name!r} is given two sets of fields")
    if len(kinds) == 1:
        return dict(kinds[names[0]]), {}
    return {}, {"pattern": pattern_of(names), "kinds": kinds}


def layer_fields(spec: Spec) -> list[dict[str, Any]]:
    """Each layer's effective ``encoding``, ``hparams`` and attention options (every field of
    :class:`~posenc.attention.options.AttentionOptions`): the model's, with its kind's
    overrides (a kind that names no encoder takes the model's, with the model's
    hyperparameters); ``"models_encoder"`` says whether the layer's encoder is the model's (the
    same name and hyperparameters, defaults filled in), which a config stating one RoPE needs."""
    m = spec.model
    model = {
        "encoding": spec.encoding,
        "hparams": dict(spec.hparams),
        "models_encoder": True,
        **{f: getattr(m, f) for f in OPTION_FIELDS},
    }
    if not spec.pattern:
        return [dict(model) for _ in range(m.num_layers)]
    filled = encodings.get(spec.encoding, **spec.hparams).hparams()
    out = []
    for name in expand(spec.pattern, m.num_layers):
        kind = spec.kinds[name]
        fields = {**model, **{f: kind[f] for f in OPTION_FIELDS if f in kind}}
        if kind.get("encoding") is not None:
            hparams = dict(kind.get("hparams") or {})
            same = kind["encoding"] == spec.encoding and (
                encodings.get(kind["encoding"], **hparams).hparams() == filled
            )
            fields.update(encoding=kind["encoding"], hparams=hparams, models_encoder=same)
        out.append(fields)
    return out


def option_misfits(layers: list[dict[str, Any]], allowed: Sequence[str]) -> list[str]:
    """The attention options other than ``allowed`` that some layer sets (each named once)."""
    plain = AttentionOptions()
    out = []
    for field in OPTION_FIELDS:
        if field in allowed:
            continue
        values = sorted(
            {repr(layer[field]) for layer in layers if layer[field] != getattr(plain, field)}
        )
        if values:
            out.append(f"model.{field}={values[0]} on some layers (an attention option)")
    return out


def read_window(hf: HFConfig, default: int | None) -> str:
    """The attention window of a config's ``sliding_window``: ``"sliding:W"``, or ``"full"`` when
    it is null (or absent with no ``default``: the family's own default when absent).

    transformers' sliding-window mask lets query ``i`` see key ``j`` when ``j > i - W`` (and
    ``j <= i``): the ``W`` latest keys, its own included, which is posenc's ``"sliding:W"``
    (:mod:`posenc.attention.options`)."""
    if "sliding_window" in hf and hf.fields["sliding_window"] is None:
        hf.ignore("sliding_window")
        return "full"
    if "sliding_window" not in hf and default is None:
        hf.ignore("sliding_window")
        return "full"
    return f"sliding:{hf.count('sliding_window', default)}"


def window_kind(window: str) -> tuple[str, dict[str, Any]]:
    """A layer of ``window`` as :func:`posenc.hf.per_layer.fold` takes it, named after its
    transformers layer type."""
    if window == "full":
        return "full_attention", {}
    return "sliding_attention", {"window": window}


def windows_of(spec: Spec) -> tuple[list[str], int | None]:
    """Each layer's transformers type (``"sliding_attention"`` for a sliding window, else
    ``"full_attention"``) and the one sliding window's size (None without one, or when the
    layers' windows are not one ``sliding:W``, which the families' ``fits`` name)."""
    windows = [parse_window(layer["window"]) for layer in layer_fields(spec)]
    types = ["full_attention" if w.full else "sliding_attention" for w in windows]
    sliding = {w for w in windows if not w.full}
    if len(sliding) != 1 or next(iter(sliding)).kind not in ("sliding", "banded"):
        return types, None
    return types, next(iter(sliding)).size
