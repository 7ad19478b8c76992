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
import math
import os
import re
import traceback
import types
from collections.abc import Iterable
from typing import Any

import ml_collections

from posenc import data as data_lib
from posenc import encodings
from posenc.attention import linear as linear_attention
from posenc.attention.core import IMPLEMENTATIONS
from posenc.data import synthetic
from posenc.data.classify_batching import VOCAB_SIZE as CLASSIFY_VOCAB_SIZE
from posenc.data.task_source import task_name
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
    masked_lm,
    objective,
    open_source,
)
from posenc.kinds.common import require_choice as _require_choice
from posenc.kinds.common import require_int as _require_int
from posenc.kinds.common import validate_batch_split as _validate_batch_split
from posenc.kinds.common import validate_optim as _validate_optim
from posenc.layers.config import DTYPES
from posenc.layers.norms import NORMS
from posenc.models.build import assembly, head_config, make_encoding, model_config
from posenc.models.encdec import bind_sides
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
    "masked_lm",
    "objective",
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
    if prefix in _OPEN_FIELDS:
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
    "train.progress",
)
# Of those, the fields that do not change the numbers an evaluation reports.
_EVAL_NEUTRAL = ("data.data_dir", "distributed.", "mesh.", "model.remat", "train.progress")


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

    Returns:
      ``{dotted field: requested value}`` for every changed field that can change the reported
      numbers (empty: the run's own settings).

    Raises:
      ValueError: a changed field that would change what was trained (another encoder, model
        shape, data set, training length, ...), naming it and what may change instead.
    """
    _default_original_max_len(trained, requested)
    safe = getattr(encodings.get_class(trained.encoding.name), "eval_safe_hparams", ())
    allowed = EVAL_MAY_CHANGE + tuple(f"encoding.hparams.{h}" for h in safe)
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
        raise ValueError(
            f"evaluation cannot change {what}: that changes what was trained. An evaluation may "
            "change the eval section, model.attention_impl (not to or from a linear path), "
            "model.attention_block_size, "
            f"data.data_dir and the encoder's evaluation settings ({hparams}); train another "
            "run for the rest"
        )
    flat_after = flatten(after)
    return {f: flat_after.get(f) for f in changed if not matches(f, _EVAL_NEUTRAL)}


def _default_original_max_len(
    trained: ml_collections.ConfigDict, requested: ml_collections.ConfigDict
) -> None:
    """Sets ``encoding.hparams.original_max_len`` of ``requested`` to the training length where
    its scaling needs one and none is given (:func:`evaluation_changes`)."""
    from posenc.encodings.rope import NEEDS_ORIGINAL

    hparams = requested.encoding.hparams
    if (
        requested.encoding.name == trained.encoding.name
        and "original_max_len" in encodings.hparam_names(requested.encoding.name)
        and hparams.get("scaling") in NEEDS_ORIGINAL
        and hparams.get("original_max_len") is None
    ):
        with hparams.unlocked():  # an open section: the field may not be there yet
            hparams.original_max_len = int(trained.train.seq_len)


def _validate_objective(config: ml_collections.ConfigDict) -> None:
    """``train.objective`` with ``model.causal`` and ``model.vocab_size``."""
    goal, m = objective(config), config.model
    _require_choice("train.objective", goal, data_lib.OBJECTIVES)
    causal = m.get("causal", True)
    if goal == "masked_lm" and causal:
        raise ValueError(
            "train.objective='masked_lm' needs model.causal=False: a masked LM reads the tokens "
            "on both sides of the masked ones"
        )
    bytes_ = config.data.get("tokenizer", "bytes") == "bytes"
    if goal == "masked_lm" and bytes_ and m.vocab_size <= data_lib.MASK_ID:
        raise ValueError(
            f"model.vocab_size={m.vocab_size} has no id for the mask token of "
            f"train.objective='masked_lm' (id {data_lib.MASK_ID}); use model.vocab_size >= "
            f"{data_lib.MASK_ID + 1}"
        )
    if goal == "causal_lm" and not causal:
        raise ValueError(
            "model.causal=False with train.objective='causal_lm': a bidirectional model sees the "
            "token it is asked to predict; use train.objective=masked_lm or model.causal=True"
        )


def _validate_positions(
    config: ml_collections.ConfigDict, encoding: encodings.Encoding, lengths: bool = True
) -> None:
    """``train.positions``, ``train.max_position`` and ``eval.positions`` (against the window
    lengths too, unless ``lengths`` is False)."""
    t = config.train
    _require_choice("train.positions", t.positions, data_lib.POSITION_MODES)
    _require_choice("eval.positions", config.eval.positions, EVAL_POSITIONS)
    if "randomized" not in (t.positions, eval_positions(config)) or not lengths:
        return
    _require_int("train.max_position", t.max_position, 1)
    if t.positions == "randomized" and t.max_position < t.seq_len:
        raise ValueError(
            f"train.max_position={t.max_position} must be >= train.seq_len={t.seq_len}: a "
            "window draws that many distinct positions"
        )
    encoding.check_length(t.max_position)  # a learned table must cover every drawn position
    if eval_positions(config) == "randomized":
        too_long = [n for n in eval_lengths(config) if n > t.max_position]
        if too_long:
            raise ValueError(
                f"eval.lengths {too_long} exceed train.max_position={t.max_position}, the range "
                "randomized evaluation positions are drawn from; use shorter lengths or "
                "eval.positions=contiguous"
            )


def _validate_memory(config: ml_collections.ConfigDict) -> None:
    """``model.mem_len`` and ``eval.mem_len`` with what Transformer-XL memory cannot combine with:
    a bidirectional model, randomized positions, linear attention, sliding evaluation."""
    m = config.model
    mem_len = m.get("mem_len", 0)
    _require_int("model.mem_len", mem_len, 0)
    _require_choice("train.order", config.train.get("order", "auto"), TRAIN_ORDERS)
    if mem_len and config.train.get("order") == "random":
        raise ValueError(
            f"train.order='random' with model.mem_len={mem_len}: the memory would hold the states "
            "of an unrelated window; use train.order=auto or consecutive"
        )
    if config.eval.get("mem_len") is not None:
        _require_int("eval.mem_len", config.eval.mem_len, 0)
    if not mem_len and not eval_mem_len(config):
        return
    field = "model.mem_len" if mem_len else "eval.mem_len"
    conflicts = {
        "model.causal=False": not m.get("causal", True),
        "train.positions='randomized'": config.train.positions == "randomized",
        "eval.positions='randomized'": eval_positions(config) == "randomized",
        f"model.attention_impl={m.attention_impl!r}": m.attention_impl in linear_attention.PATHS,
        "eval.mode='sliding'": config.eval.mode == "sliding",
        f"encoding.name={config.encoding.name!r} (its embed_tokens reads neighbouring tokens, "
        "which the memory does not keep)": "embed_tokens" in make_encoding(config).hooks,
        f"data.source={config.data.source!r} (an algorithmic task: examples, not a stream)": bool(
            task_name(config.data.source)
        ),
    }
    bad = [name for name, conflict in conflicts.items() if conflict]
    if bad:
        raise ValueError(
            f"{field} > 0 (Transformer-XL memory) cannot run with {bad[0]}: memory needs a causal "
            "softmax-attention model over contiguous positions and non-overlapping windows; set "
            f"{field}=0 or change that field"
        )


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
    """
    if assembly(config) == "encoder_decoder":
        _validate_translation(config, num_devices, process_count)
        return
    if assembly(config) == "classifier":
        _validate_classifier(config)
        _validate_batch_split(config.train.batch_size, num_devices, process_count)
        return
    m = config.model
    _require_choice("model.norm", m.norm, NORMS)
    _require_choice("model.dtype", m.dtype, DTYPES)
    _require_choice("model.attention_impl", m.attention_impl, IMPLEMENTATIONS)
    encoding = make_encoding(config)  # unknown names and hyperparameters raise here
    model_cfg = model_config(config)  # shapes and rates are checked by ModelConfig
    # Encoders phrase these as encoding.<name>; the field is encoding.hparams.<name>.
    with encodings.registry.fields_as_set(config.encoding.name):
        encoding.bind(model_cfg.dims)  # encoder/shape combinations (e.g. RoPE, odd head dim)
        encoding.check_causal(model_cfg.causal)  # causal-only encoders, T5's bidirectional buckets

    t = config.train
    _require_int("train.seq_len", t.seq_len, 2)
    _require_int("train.batch_size", t.batch_size)
    _require_int("train.steps", t.steps, 1)  # 0 would train nothing and write nothing
    _require_int("train.log_every", t.log_every)
    _require_int("train.checkpoint_every", t.checkpoint_every)
    _require_int("train.keep_checkpoints", t.keep_checkpoints)
    _validate_objective(config)
    task = task_name(config.data.source)
    if not task:  # a task's lengths are input lengths: _validate_task, at the end
        encoding.check_length(t.seq_len)
    _validate_positions(config, encoding, lengths=not task)
    _validate_memory(config)
    _validate_batch_split(t.batch_size, num_devices, process_count)

    _validate_optim(config.optim)

    e = config.eval
    _require_choice("eval.mode", e.mode, EVAL_MODES)
    _require_choice("eval.split", e.split, EVAL_SPLITS)
    # eval_lengths() converts with int(): check first, so "abc" or 16.5 is named, not truncated.
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in e.lengths):
        raise ValueError(f"eval.lengths must be integers, got {e.lengths!r}")
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in e.multiples):
        raise ValueError(f"eval.multiples must be numbers, got {e.multiples!r}")
    lengths = eval_lengths(config)
    if not lengths:
        raise ValueError("eval.lengths and eval.multiples are both empty; give at least one")
    for length in lengths:
        if length < 1:
            raise ValueError(f"eval.lengths must all be >= 1, got {length} in {list(lengths)}")
    if task and e.mode == "sliding":  # before the stride, which would be the wrong complaint
        raise ValueError(
            f"eval.mode='sliding' with data.source={config.data.source!r}: sliding evaluation "
            "does not apply to algorithmic-task runs, which are scored on whole examples per "
            "input length; leave eval.mode at 'nonoverlapping'"
        )
    if e.mode == "sliding":
        _require_int("eval.stride", e.stride)
        if any(e.stride > length for length in lengths):
            raise ValueError(
                f"eval.stride={e.stride} must not exceed any of eval.lengths {list(lengths)}"
            )
    _require_int("eval.batch_tokens", e.batch_tokens)
    _require_int("eval.max_tokens", e.max_tokens, 0)
    if not isinstance(config.data.source, str) or not config.data.source:
        raise ValueError(
            "data.source must be 'pystdlib', 'textdir:<path>', 'tfds:<name>' or 'synthetic:<task>'"
        )
    _validate_tokenizer(config, task)
    if task:
        _validate_task(config)


def _validate_tokenizer(config: ml_collections.ConfigDict, task: str | None) -> None:
    """``data.tokenizer``: its form, and a pretrained tokenizer only where text is tokenised
    (not an algorithmic task), with a mask token for masked LM."""
    from posenc.data.hf_tokenizer import check_spec

    tokenizer = config.data.get("tokenizer", "bytes")
    check_spec(tokenizer)
    if tokenizer == "bytes":
        return
    if task:
        raise ValueError(
            f"data.tokenizer={tokenizer!r} with data.source={config.data.source!r}: algorithmic "
            "tasks generate token ids, not text; use data.tokenizer='bytes'"
        )
    masked_lm(config)  # a masked LM needs the tokenizer's mask token


def _validate_task(config: ml_collections.ConfigDict) -> None:
    """Checks a task run's config (``data.source=synthetic:<task>``); raises a one-line
    ``ValueError`` naming the field.

    A task run is a causal LM (greedy generation needs one); ``train.seq_len`` is the longest
    training length and every ``eval.lengths`` entry a length the task can produce; an encoder
    with a position table must cover the longest row it is trained on, and randomized positions
    must have a range that covers the longest row evaluated.
    """
    task = task_name(config.data.source)
    spec = f"data.source={config.data.source!r}"
    if task not in synthetic.TASKS:
        raise ValueError(f"{spec}: unknown task {task!r}; tasks: {', '.join(synthetic.TASKS)}")
    if objective(config) != "causal_lm":
        raise ValueError(
            f"train.objective={objective(config)!r} does not apply to {spec}: a task is trained "
            "on its target tokens as a causal LM; use train.objective=causal_lm"
        )
    try:  # training draws the lengths in [1, train.seq_len] the task can produce
        synthetic.train_lengths(task, 1, config.train.seq_len)
    except ValueError as e:
        raise ValueError(f"train.seq_len={config.train.seq_len}: {e}") from None
    for length in eval_lengths(config):
        try:
            synthetic.check_length(task, length)
        except ValueError as e:
            raise ValueError(f"eval.lengths: {e}") from None
    width = synthetic.train_width(task, config.train.seq_len)
    make_encoding(config).check_length(width)  # a learned table covers every training row
    if "randomized" in (config.train.positions, config.eval.positions):
        longest = max(
            [width] + [synthetic.row_width(task, length) for length in eval_lengths(config)]
        )
        if config.train.max_position < longest:
            raise ValueError(
                f"train.max_position={config.train.max_position} is below {longest}, the tokens "
                f"of the longest example (input, SEP and target) of {spec}; randomized "
                f"positions draw that many distinct positions: use train.max_position >= {longest}"
            )
    examples = config.eval.get("examples", 256)
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"eval.examples must be an integer >= 1, got {examples!r}")


def _validate_translation(
    config: ml_collections.ConfigDict, num_devices: int | None, process_count: int
) -> None:
    """Checks a translation run's config (``model.assembly="encoder_decoder"``,
    ``configs/translation.py``): the encoder in both directions, the parallel data, token
    batches, label smoothing and decoding; one line naming the first bad field."""
    from posenc.data.pair_batching import TOKENS_FIELD
    from posenc.data.vocab import HF_PREFIX, MODEL_TYPES, VOCAB_KINDS

    bind_sides(model_config(config), make_encoding(config))
    m, d, t, e = config.model, config.data, config.train, config.eval
    if m.get("mem_len", 0):
        raise ValueError("model.mem_len must be 0 for model.assembly='encoder_decoder'")
    for field, value in (("train.positions", t.positions), ("eval.positions", e.positions)):
        if value == "randomized":
            raise ValueError(
                f"{field}='randomized' applies to decoder-only runs; a translation run reads "
                "contiguous positions"
            )
    vocab = d.get("vocab")
    if not (isinstance(vocab, str) and vocab.startswith(HF_PREFIX) and vocab[len(HF_PREFIX) :]):
        _require_choice("data.vocab", vocab, VOCAB_KINDS)
    _require_choice("data.spm_model_type", d.get("spm_model_type"), MODEL_TYPES)
    _require_int("data.vocab_size", d.get("vocab_size"))
    for field in ("max_src_len", "max_tgt_len"):
        if d.get(field) is not None:
            _require_int(f"data.{field}", d.get(field))
    for field, step in (
        ("data.bucket_step", d.get("bucket_step", 1.1)),
        ("eval.bucket_step", e.get("bucket_step", 1.1)),
    ):
        if not isinstance(step, int | float) or isinstance(step, bool) or not 1 < step <= 4:
            raise ValueError(f"{field} must be a number in (1, 4], got {step!r}")
    for field in ("steps", "log_every", "checkpoint_every", "keep_checkpoints"):
        _require_int(f"train.{field}", t[field], 0 if field == "steps" else 1)
    _require_int(TOKENS_FIELD, t.get("tokens_per_batch"))
    smoothing = t.get("label_smoothing", 0.0)
    if not isinstance(smoothing, int | float) or not 0 <= smoothing < 1:
        raise ValueError(f"train.label_smoothing must be in [0, 1), got {smoothing!r}")
    _validate_optim(config.optim)
    _require_choice("eval.split", e.split, EVAL_SPLITS)
    _require_int("eval.beam_size", e.get("beam_size"))
    alpha = e.get("alpha")
    # Finite: an infinite length penalty gives NaN scores, and eval.json records it.
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not 0 <= alpha < math.inf:
        raise ValueError(f"eval.alpha must be a finite number >= 0, got {alpha!r}")
    _require_int("eval.max_len_offset", e.get("max_len_offset"))
    _require_int("eval.tokens_per_batch", e.get("tokens_per_batch"))
    _require_int("eval.max_sentences", e.get("max_sentences", 0), 0)
    # Rows per batch are a multiple of the devices (at least one each) by construction.
    del num_devices, process_count


def _validate_classifier(config: ml_collections.ConfigDict) -> None:
    """Checks a classification run's config (``model.assembly="classifier"``,
    ``configs/classify.py``); one line naming the first bad field."""
    m, t, e = config.model, config.train, config.eval
    if t.get("objective") != "classification":
        raise ValueError(
            f"train.objective={t.get('objective')!r} with model.assembly='classifier': a "
            "classifier trains on labels; use train.objective=classification"
        )
    head_config(config)  # num_labels, pool, num_segments, pooler
    model_cfg = model_config(config)  # shapes and rates
    if model_cfg.causal:
        raise ValueError(
            "model.causal must be False for model.assembly='classifier': every token reads both "
            "sides, as in the masked-LM model it is fine-tuned from"
        )
    if model_cfg.mem_len:
        raise ValueError("model.mem_len must be 0 for model.assembly='classifier'")
    tokenizer = config.data.get("tokenizer", "bytes")
    if tokenizer != "bytes":  # a pretrained model's own: rows framed by its special tokens
        from posenc.data.hf_tokenizer import check_spec, make_tokenizer

        check_spec(tokenizer)
        size = make_tokenizer(tokenizer).vocab_size
        if m.vocab_size < size:
            raise ValueError(
                f"model.vocab_size={m.vocab_size} is smaller than the {size} ids of "
                f"data.tokenizer={tokenizer!r}; use model.vocab_size >= {size}"
            )
    elif m.vocab_size < CLASSIFY_VOCAB_SIZE:
        raise ValueError(
            f"model.vocab_size={m.vocab_size} has no id for [CLS] (id {CLASSIFY_VOCAB_SIZE - 1}, "
            "after the bytes, the separator and the mask token); use model.vocab_size >= "
            f"{CLASSIFY_VOCAB_SIZE}"
        )
    encoding = make_encoding(config)
    encoding.bind(model_cfg.dims)
    encoding.check_causal(False)
    for field in ("steps", "log_every", "checkpoint_every", "keep_checkpoints", "batch_size"):
        _require_int(f"train.{field}", t[field])
    _require_int("train.seq_len", t.seq_len, 4)
    encoding.check_length(t.seq_len)
    for field, value in (("train.positions", t.positions), ("eval.positions", e.positions)):
        if value == "randomized":
            raise ValueError(
                f"{field}='randomized' applies to decoder-only runs; a classifier reads "
                "contiguous positions"
            )
    _validate_optim(config.optim)
    if e.split not in ("validation", "test"):
        raise ValueError(f"eval.split must be one of ['validation', 'test'], got {e.split!r}")
    lengths = eval_lengths(config)
    if not lengths or any(not isinstance(n, int) or n < 4 for n in lengths):
        raise ValueError(f"eval.lengths must be integers >= 4, got {list(lengths)}")
    _require_int("eval.batch_tokens", e.batch_tokens)
