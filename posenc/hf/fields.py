"""Strict reading of a Hugging Face ``config.json``: every field is mapped, at its default, or
cannot change the forward pass; a field that can and that posenc does not map is refused in one
line.

A family's converter reads fields through :class:`HFConfig` (``take``, ``expect``, ``ignore``,
``sub`` for a nested config such as Gemma 3's ``text_config``); :meth:`HFConfig.finish` then
sorts every field it did not read, other than :data:`NOT_THE_MODEL` (bookkeeping, token ids,
generation and training settings):

- a field that transformers' config class of the ``model_type`` consumes (:func:`consumed`,
  from ``consumed.json``, which ``tests/hf/make_consumed.py`` writes from transformers) is
  refused: the model may read it, and posenc does not map it (a sliding window, a per-layer
  scale), so the logits could differ; unless it states the class's own default
  (:func:`at_default`), which is the model transformers builds without it;
- any other field (``unk_token_id``, ``_model_name_or_path``, ``transformers.js_config``, a
  ``quantization_config``, whose tensors the weight checks judge) is a field no transformers
  model of that type reads: it is returned as ignored, which an import records in
  ``pretrained.json`` and reports once, and ``strict=True`` (``posenc import-hf --strict``)
  refuses.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

# Fields of any config.json that do not change the logits of a forward pass: provenance, token
# ids, generation defaults, training-only settings (dropout, initialisation) and the output
# options of transformers' model classes.
NOT_THE_MODEL = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "initializer_factor",
        "attention_dropout",
        "hidden_dropout",
        "classifier_dropout",
        "dropout_rate",
        "resid_pdrop",
        "embd_pdrop",
        "attn_pdrop",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "use_bfloat16",
        "pruned_heads",
        "chunk_size_feed_forward",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "tokenizer_class",
        "prefix",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "tf_legacy_loss",
        "n_ctx",  # GPT-2's duplicate of n_positions in old files
        # Bookkeeping that PretrainedConfig takes and drops, or uses only to pick a kernel of
        # the same function (attention, mixture-of-experts implementations) or a head's size.
        "_commit_hash",
        "name_or_path",
        "attn_implementation",
        "experts_implementation",
        "num_labels",
    }
)

# What tests/hf/make_consumed.py wrote: transformers' version and, per model_type, the keys its
# config class consumes and the model_types of its sub-configs.
CONSUMED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consumed.json")


@functools.cache
def _table() -> dict[str, Any]:
    with open(CONSUMED_FILE) as f:
        return json.load(f)


def consumed(model_type: str) -> frozenset[str] | None:
    """The ``config.json`` keys transformers' config class of ``model_type`` consumes (its
    fields, ``attribute_map`` aliases and the keys it converts); None when
    ``consumed.json`` has no entry for it (then every unread field is refused)."""
    entry = _table()["model_types"].get(model_type)
    return None if entry is None else frozenset(entry["keys"])


def at_default(model_type: str, key: str, value: Any) -> bool:
    """Whether ``value`` is the default of ``key`` in transformers' config class of
    ``model_type`` (the model it builds when a config omits the key), by JSON value and type."""
    defaults = (_table()["model_types"].get(model_type) or {}).get("defaults", {})
    if key not in defaults:
        return False
    default = defaults[key]
    return type(value) is type(default) and value == default


def config_class(model_type: str) -> str:
    """The name of transformers' config class of ``model_type``, for messages."""
    entry = _table()["model_types"].get(model_type)
    return entry["class"] if entry else f"config of model_type {model_type!r}"


def sub_config_type(model_type: str, key: str) -> str | None:
    """The ``model_type`` of sub-config ``key`` of ``model_type`` (Gemma 3's ``text_config``:
    ``gemma3_text``), as transformers' config class states it."""
    entry = _table()["model_types"].get(model_type) or {}
    return entry.get("sub_configs", {}).get(key)


def transformers_version() -> str:
    """The transformers version ``consumed.json`` was read from."""
    return _table()["transformers_version"]


_MISSING = object()


class HFConfig:
    """A ``config.json`` read field by field (module docstring).

    Args:
      fields: the parsed JSON object.
      family: the importing family's name, for messages.
      source: where the fields came from (a path), for messages.
      strict: refuse the fields :meth:`finish` would report as ignored.
      model_type: whose transformers config class decides what is consumed; default the
        fields' own ``model_type``.
    """

    def __init__(
        self,
        fields: Mapping[str, Any],
        family: str,
        source: str,
        *,
        strict: bool = False,
        model_type: str | None = None,
    ):
        self.fields = dict(fields)
        self.family = family
        self.source = source
        self.strict = strict
        self.model_type = model_type or self.fields.get("model_type")
        self._read: set[str] = set()
        self._subs: list[tuple[str, HFConfig]] = []

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def take(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key`` (``default`` when absent; required when no default is given)."""
        self._read.add(key)
        if key in self.fields and self.fields[key] is not None:
            return self.fields[key]
        if default is _MISSING:
            raise ValueError(
                f"{self.source}: config.json has no {key!r}, which {self.family} needs"
            )
        return default

    def count(self, key: str, default: Any = _MISSING) -> int:
        """The value of ``key``, refused (one line) unless it is a positive integer (a size or a
        length: ``max_position_embeddings: 0`` would import a run of length 0)."""
        value = self.take(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{self.source}: config.json {key}={value!r} must be a positive integer"
            )
        return value

    def expect(self, key: str, allowed: Iterable[Any], default: Any = _MISSING) -> Any:
        """The value of ``key``, refused (one line) unless it is one of ``allowed``."""
        value = self.take(key, default)
        allowed = tuple(allowed)
        if value not in allowed:
            shown = ", ".join(repr(a) for a in allowed)
            raise ValueError(
                f"{self.source}: config.json {key}={value!r} is not supported by posenc's "
                f"{self.family} import (supported: {shown})"
            )
        return value

    def ignore(self, *keys: str) -> None:
        """Marks fields as read that this family knows do not change the forward pass."""
        self._read.update(keys)

    def sub(self, key: str, model_type: str | None = None) -> HFConfig:
        """The nested config object ``key`` (Gemma 3's ``text_config``), read field by field as
        this one is; :meth:`finish` finishes it too, naming its fields ``key.field``. Its
        ``model_type`` is its own, else ``model_type``, else the one transformers' config class
        gives that sub-config."""
        value = self.take(key)
        if not isinstance(value, Mapping):
            raise ValueError(
                f"{self.source}: config.json {key} must be an object, not {type(value).__name__}"
            )
        kind = value.get("model_type") or model_type or sub_config_type(self.model_type, key)
        child = HFConfig(value, self.family, self.source, model_type=kind)  # strict: ours
        self._subs.append((key, child))
        return child

    def finish(self) -> dict[str, Any]:
        """Sorts the fields that were not read (module docstring): refuses, in one line, those
        transformers' config class consumes (all of them when ``consumed.json`` lacks the
        type), and with ``strict`` every one; returns the others, ignored, by name (a nested
        config's as ``key.field``)."""
        ignored = {}
        for key, child in self._subs:
            try:
                ignored.update({f"{key}.{k}": v for k, v in child.finish().items()})
            except _Unmapped as e:
                raise _Unmapped(str(e).replace(" field ", f" field {key}.", 1)) from None
        left = sorted(k for k in self.fields if k not in self._read and k not in NOT_THE_MODEL)
        known = consumed(self.model_type)
        # A consumed field at its transformers default is the model the family was checked
        # against (an old file's "is_encoder_decoder": false): accepted as read.
        left = [k for k in left if not at_default(self.model_type, k, self.fields[k])]
        unmapped = [k for k in left if known is None or k in known]
        if unmapped:
            key = unmapped[0]
            more = ", ".join(unmapped[1:])
            more = f" (and {len(unmapped) - 1} more: {more})" if more else ""
            why = (
                f"transformers' {config_class(self.model_type)} reads it"
                if known is not None
                else f"posenc/hf/consumed.json has no model_type {self.model_type!r} to tell"
            )
            raise _Unmapped(
                f"{self.source}: config.json field {key}={self.fields[key]!r} is not supported by "
                f"posenc's {self.family} import: {why}, so it may change the model, and posenc "
                f"does not map it{more}"
            )
        ignored.update({k: self.fields[k] for k in left})
        if self.strict and ignored:
            raise ValueError(
                f"{self.source}: config.json fields {', '.join(ignored)} are read by no "
                f"transformers model of type {self.model_type!r} and would be ignored; strict "
                "import refuses them (without --strict they are recorded in pretrained.json)"
            )
        return ignored


class _Unmapped(ValueError):
    """A field a model reads that posenc does not map (:meth:`HFConfig.finish`)."""


class IgnoredFieldsWarning(UserWarning):
    """An imported config held fields no transformers model of its type reads."""


def ignored_line(source: str, ignored: Mapping[str, Any]) -> str:
    """The one line that reports a config's ignored fields."""
    return (
        f"{source}: ignored {len(ignored)} config.json field{'s' * (len(ignored) != 1)} no "
        f"transformers model of this type reads: {', '.join(ignored)} (import-hf records them "
        "in pretrained.json; --strict refuses them)"
    )
