"""Per-layer differences as data: a repeating pattern of layer kinds (Gemma's
``attention_types``, transformers' ``layer_types``), each kind with its own registered positional
encoder and hyperparameters and its own attention options (window, sinks, QK-norm, ...).

A run config says it in its ``layers`` section (``configs/base.py``)::

    config.layers.pattern = ("local", "local", "local", "global")
    config.layers.kinds.local = dict(window="sliding:4096")
    config.layers.kinds["global"] = dict(encoding="nope")

Layer ``i`` is of kind ``pattern[i % len(pattern)]``: the pattern repeats from the first layer
and the last repetition may be cut short (Gemma 3's 26 layers are four repetitions of five local
and one global layer, then two local ones). A kind that names no encoder uses the model's
(``config.encoding``); every option a kind does not set is the model's (``config.model``). An
empty pattern, the default, is one kind: every layer with the model's encoder and options, the
model posenc has always built. Published patterns as presets: ``configs/architectures.py``.

An encoder that adds an input embedding (learned, sinusoidal, CAPE, ...) belongs to the whole
model, not to a layer: it can be ``config.encoding`` (its term is added at the input, and layers
that name no other encoder get its attention hooks, which it has none of), never a kind's.
Encoder parameters stay with their layers: per layer for ``param_scope="layer"`` encoders, one
set per kind for ``"shared"`` ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from posenc.attention.options import OPTION_FIELDS, AttentionOptions
from posenc.encodings.base import Encoding

# What a kind may set besides the attention options.
KIND_FIELDS = ("encoding", "hparams", *OPTION_FIELDS)


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """One kind of layer: its name in the pattern, its (unbound) encoder, None for the model's,
    and its attention options."""

    name: str
    encoding: Encoding | None
    options: AttentionOptions

    def describe(self) -> str:
        """``"<name>: <encoder>, <window>, <other options>"`` for reports and errors."""
        parts = [self.encoding.name if self.encoding is not None else "model's encoder"]
        defaults = AttentionOptions()
        for field in OPTION_FIELDS:
            value = getattr(self.options, field)
            if value != getattr(defaults, field):
                parts.append(str(value) if field == "window" else f"{field}={value}")
        return f"{self.name}: {', '.join(parts)}"


def check_pattern(pattern: Sequence[str], kinds: Mapping[str, Any], num_layers: int) -> None:
    """One-line errors for a pattern that names an undefined kind, a kind the pattern never
    uses, a kind with an unknown field, or a pattern longer than the model."""
    if isinstance(pattern, str) or not all(isinstance(p, str) and p for p in pattern):
        raise ValueError(
            f"layers.pattern must be a tuple of kind names (e.g. ('local', 'global')), got "
            f"{pattern!r}"
        )
    unknown = [p for p in pattern if p not in kinds]
    if unknown:
        raise ValueError(
            f"layers.pattern names kind {unknown[0]!r}, which layers.kinds does not define "
            f"(it defines {sorted(kinds)})"
        )
    unused = sorted(set(kinds) - set(pattern))
    if pattern and unused:
        raise ValueError(
            f"layers.kinds.{unused[0]} is not in layers.pattern {tuple(pattern)}; use it or "
            "remove it"
        )
    if len(pattern) > num_layers:
        raise ValueError(
            f"layers.pattern has {len(pattern)} kinds, more than model.num_layers="
            f"{num_layers}; layer i is of kind pattern[i % len(pattern)]"
        )
    for name, fields in kinds.items():
        extra = sorted(set(fields) - set(KIND_FIELDS))
        if extra:
            raise ValueError(
                f"layers.kinds.{name}.{extra[0]} is not a layer-kind field; a kind sets "
                f"{list(KIND_FIELDS)}"
            )


def layer_of(pattern: Sequence[Any], i: int) -> Any:
    """The kind of layer ``i``: the pattern repeated from the first layer."""
    return pattern[i % len(pattern)]
