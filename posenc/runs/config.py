"""Loading, overriding and validating ``ml_collections`` configs.

A config is named by a file and an optional variant, big_vision style:
``configs/base.py:tiny`` calls ``get_config("tiny")`` in ``configs/base.py``. Overrides are dotted
assignments, ``encoding.name=alibi`` or ``eval.lengths=64,128,512``; values are read as Python
literals when they parse as one and as strings otherwise.

:func:`validate` checks every field a run depends on *before* anything is compiled and raises a
``ValueError`` that names the field and the allowed values.
"""

from __future__ import annotations

import importlib.util
import os
import re
import traceback
import types
from collections.abc import Iterable
from typing import Any

import ml_collections

from posenc import encodings, kinds
from posenc.attention import linear as linear_attention
from posenc.kinds.common import (
    EVAL_MODES,
    EVAL_POSITIONS,
    EVAL_SPLITS,
    TRAIN_ORDERS,
    check_eval_lengths,
    check_source,
    consecutive_segments,
    eval_lengths,
    eval_mem_len,
    eval_positions,
    open_source,
)
from posenc.workdir import diff_fields, flatten, matches, parse_value

__all__ = [
    "EVAL_MAY_CHANGE",
    "EVAL_MODES",
    "EVAL_POSITIONS",
    "EVAL_SPLITS",
    "TRAIN_ORDERS",
    "apply_overrides",
    "call_config_file",
    "check_eval_lengths",
    "check_source",
    "consecutive_segments",
    "eval_lengths",
    "eval_mem_len",
    "eval_positions",
    "evaluation_changes",
    "load_config",
    "load_module",
    "open_source",
    "parse_value",
    "set_field",
    "validate",
]

# Sub-dicts whose keys are free-form (checked by the consumer, not by ConfigDict's schema).
_OPEN_FIELDS = ("encoding.hparams",)


def load_module(path: str) -> types.ModuleType:
    """Imports a config file (``configs/*.py``) as a module without touching ``sys.modules``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config: no config file {path!r}")
    module_spec = importlib.util.spec_from_file_location(f"_posenc_config_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load_config(spec: str) -> ml_collections.ConfigDict:
    """Loads ``path/to/config.py[:variant]`` by calling its ``get_config([variant])``, or a
    run's recorded ``config.json`` (e.g. an imported model's, to fine-tune it)."""
    if spec.endswith(".json"):
        from posenc.workdir import config_from_dict, read_json, resolve_tokenizer_folders

        fields = read_json(spec)
        if fields is None:
            raise FileNotFoundError(f"--config: no config file {spec!r}")
        # An imported run's hf:tokenizer is relative to its directory.
        folder = os.path.dirname(os.path.abspath(spec))
        return config_from_dict(resolve_tokenizer_folders(fields, folder))
    path, _, variant = spec.partition(":")
    module = load_module(path)
    if not hasattr(module, "get_config"):
        raise ValueError(f"--config: {path} has no get_config() function")
    args = (variant,) if variant else ()
    config = call_config_file(path, module.get_config, *args)
    config.lock()
    return config


def call_config_file(path: str, function: Any, *args: Any) -> Any:
    """Calls a function of a config file (``get_config``, ``get_sweep``), turning what
    ``ml_collections`` raises for a mistake in it (a misspelt field, a value of the wrong type)
    into a one-line ``ValueError`` naming the file, the line and the field."""
    try:
        return function(*args)
    except (AttributeError, KeyError, TypeError) as e:
        raise ValueError(_config_file_error(path, function.__name__, e)) from None


def _config_file_error(path: str, name: str, error: Exception) -> str:
    text = str(error).replace("\\n", "\n")
    if match := re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text):
        what = f"no config field {match.group(2)!r} (did you mean {match.group(1)!r}?)"
    elif match := re.search(r'Key "([^"]+)" does not exist', text):
        what = f"no config field {match.group(1)!r}"
    else:
        what = f"{type(error).__name__}: {text.strip(chr(39) + chr(34)).splitlines()[0]}"
    where = os.path.realpath(path)
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if os.path.realpath(f.filename) == where
    ]
    if not frames:
        return f"--config {path}: {name}() failed: {what}"
    return f"--config {path}, line {frames[-1].lineno} ({(frames[-1].line or '').strip()}): {what}"


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: Iterable[str]
) -> ml_collections.ConfigDict:
    """Applies ``"a.b.c=value"`` overrides in order (to a copy) and returns it.

    Raises:
      ValueError: for a malformed override or a field the config does not have (listing the
        fields that exist at that level).
    """
    config = ml_collections.ConfigDict(config.to_dict(), type_safe=True)
    config.lock()
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip().removeprefix("--config.").removeprefix("config.")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form field.path=value")
        set_field(config, key, parse_value(text))
    return config


def set_field(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
    """Sets the dotted field ``key``; a scalar given for a tuple field becomes a 1-tuple."""
    *parents, leaf = key.split(".")
    node = config
    for i, name in enumerate(parents):
        if name not in node:
            raise ValueError(_unknown_field(".".join(parents[: i + 1]), node))
        node = node[name]
        if not isinstance(node, ml_collections.ConfigDict):
            raise ValueError(
                f"config field {'.'.join(parents[: i + 1])} is a value, not a group of fields; "
                f"cannot set {key!r}"
            )
    prefix = ".".join(parents)
    if prefix in _OPEN_FIELDS or _kind_hparams(parents):
        with node.unlocked():
            node[leaf] = value
        return
    if leaf not in node:
        raise ValueError(_unknown_field(key, node))
    current = node[leaf]
    if isinstance(current, tuple):
        value = tuple(value) if isinstance(value, list | tuple) else (value,)
    try:
        node[leaf] = value
    except TypeError as e:
        raise ValueError(f"config field {key}: {e}") from None


def _kind_hparams(parents: list[str]) -> bool:
    """Whether ``parents`` is a layer kind's hyperparameters (``layers.kinds.<kind>.hparams``),
    an open section like ``encoding.hparams``."""
    return len(parents) == 4 and parents[:2] == ["layers", "kinds"] and parents[3] == "hparams"


def _unknown_field(key: str, node: ml_collections.ConfigDict) -> str:
    return f"unknown config field {key!r}; fields here: {', '.join(sorted(node.keys()))}"


# Fields an evaluation may change: they cannot change what was trained. Besides these, the
# hyperparameters an encoder lists in ``eval_safe_hparams`` (e.g. Transformer-XL's clamp_len).
EVAL_MAY_CHANGE = (
    "eval.",
    "model.attention_impl",
    "model.attention_block_size",
    "data.data_dir",
    "distributed.",
    "mesh.",
    "model.remat",
    "model.loss_chunk",
    "train.progress",
)
# Of those, the fields that do not change the numbers an evaluation reports.
_EVAL_NEUTRAL = (
    "data.data_dir",
    "distributed.",
    "mesh.",
    "model.remat",
    "model.loss_chunk",
    "train.progress",
)


def evaluation_changes(
    trained: ml_collections.ConfigDict, requested: ml_collections.ConfigDict
) -> dict[str, Any]:
    """The settings an evaluation changes from the config a run was trained with.

    Args:
      trained: the run's config (``config.json``).
      requested: the config to evaluate with.

    The training length is known, so a RoPE scaling that needs it (YaRN, dynamic NTK, Llama 3,
    LongRoPE) and is not given ``encoding.hparams.original_max_len`` gets the run's
    ``train.seq_len`` (an imported model's training length) in ``requested``, and it is among
    the changes.

    Besides :data:`EVAL_MAY_CHANGE` and the encoder's ``eval_safe_hparams``, an evaluation may
    change the fields the run's kind lists (:attr:`posenc.kinds.RunKind.eval_may_change`).

    Returns:
      ``{dotted field: requested value}`` for every changed field that can change the reported
      numbers (empty: the run's own settings).

    Raises:
      ValueError: a changed field that would change what was trained (another encoder, model
        shape, data set, training length, ...), naming it and what may change instead.
    """
    _default_original_max_len(trained, requested)
    safe = getattr(encodings.get_class(trained.encoding.name), "eval_safe_hparams", ())
    allowed = (
        EVAL_MAY_CHANGE
        + tuple(kinds.kind_of(trained).eval_may_change)
        + tuple(f"encoding.hparams.{h}" for h in safe)
        + _kind_eval_safe(trained)
    )
    before, after = trained.to_dict(), requested.to_dict()
    changed = diff_fields(before, after)
    refused = [field for field in changed if not matches(field, allowed)]
    impls = {trained.model.attention_impl, requested.model.attention_impl}
    if len(impls) > 1 and impls & set(linear_attention.PATHS):
        refused.append("model.attention_impl")  # linear attention is another model, not a path
    if refused:
        flat_before, flat_after = flatten(before), flatten(after)
        what = ", ".join(f"{f} {flat_before.get(f)!r} -> {flat_after.get(f)!r}" for f in refused)
        hparams = ", ".join(f"encoding.hparams.{h}" for h in safe) or "none"
        if _kind_eval_safe(trained):
            hparams += ", and the same of each layer kind's encoder (layers.kinds.<kind>.hparams)"
        raise ValueError(
            f"evaluation cannot change {what}: that changes what was trained. An evaluation may "
            "change the eval section, model.attention_impl (not to or from a linear path), "
            "model.attention_block_size, model.loss_chunk, "
            f"data.data_dir and the encoder's evaluation settings ({hparams}); train another "
            "run for the rest"
        )
    flat_after = flatten(after)
    return {f: flat_after.get(f) for f in changed if not matches(f, _EVAL_NEUTRAL)}


def _kinds(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """``config.layers.kinds`` as a dict of ConfigDicts (empty without a layers section)."""
    section = config.get("layers")
    kinds_ = section.get("kinds") if section is not None else None
    return dict(kinds_.items()) if kinds_ is not None else {}


def _kind_eval_safe(trained: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The fields an evaluation may change in the layer kinds that name their own encoder:
    that encoder's ``eval_safe_hparams`` (a RoPE kind's scaling), under
    ``layers.kinds.<kind>.hparams``."""
    out: list[str] = []
    for name, fields in _kinds(trained).items():
        encoder = fields.get("encoding")
        if encoder:
            safe = getattr(encodings.get_class(encoder), "eval_safe_hparams", ())
            out += [f"layers.kinds.{name}.hparams.{h}" for h in safe]
    return tuple(out)


def _default_original_max_len(
    trained: ml_collections.ConfigDict, requested: ml_collections.ConfigDict
) -> None:
    """Sets ``original_max_len`` of ``requested``'s encoder, and of each layer kind's own, to
    the training length where its scaling needs one and none is given
    (:func:`evaluation_changes`)."""
    from posenc.encodings.rope import NEEDS_ORIGINAL

    pairs = [(trained.encoding.name, requested.encoding.name, requested.encoding.get("hparams"))]
    trained_kinds = _kinds(trained)
    for name, fields in _kinds(requested).items():
        before = trained_kinds.get(name)
        pairs.append(
            (
                before.get("encoding") if before is not None else None,
                fields.get("encoding"),
                fields.get("hparams"),
            )
        )
    for before, now, hparams in pairs:
        if (
            now
            and now == before
            and hparams is not None
            and "original_max_len" in encodings.hparam_names(now)
            and hparams.get("scaling") in NEEDS_ORIGINAL
            and hparams.get("original_max_len") is None
        ):
            with hparams.unlocked():  # an open section: the field may not be there yet
                hparams.original_max_len = int(trained.train.seq_len)


def validate(
    config: ml_collections.ConfigDict,
    *,
    num_devices: int | None = None,
    process_count: int = 1,
) -> None:
    """Checks a run config; raises ``ValueError`` naming the first bad field.

    Args:
      config: the run config.
      num_devices: devices the batch's rows are split over (``mesh.data x mesh.fsdp``; None:
        skip the divisibility check).
      process_count: processes the batch is split over.

    The common part (``model.assembly``, which chooses the kind) is checked by
    :func:`posenc.kinds.kind_of`; the rest by the run's kind
    (:meth:`posenc.kinds.RunKind.validate`).
    """
    kinds.kind_of(config).validate(config, num_devices=num_devices, process_count=process_count)
