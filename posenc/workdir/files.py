"""The file names of a work directory and the one way posenc writes and reads them.

Every write is atomic: the bytes go to a unique temporary file in the same folder, are flushed
to disk, and the file is moved into place with ``os.replace``, so a reader (or a run resumed
after ``kill -9``) sees the old file or the new one, never a part of either. Metric lines are
appended one whole line at a time; a torn last line (a process killed mid-write) is skipped on
reading and removed by :func:`rewrite_jsonl`.

JSON is written with ``allow_nan``: a perplexity that overflows is stored as ``Infinity`` (and
a loss that is not a number as ``NaN``), which Python's ``json`` reads back as ``float``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

# A run's work directory (posenc train / posenc eval).
CONFIG_FILE = "config.json"  # the resolved config the run was trained with
DATA_FILE = "data.json"  # the data source's identity (splits, hashes) when training started
INIT_FILE = "init.json"  # the run whose parameters this one started from (train.init_from)
CHECKPOINT_DIR = "checkpoints"  # orbax steps, each with a checksum file
CORRUPT_DIR = "corrupt_checkpoints"  # checkpoints that failed verification, moved aside
METRICS_FILE = "metrics.jsonl"  # one JSON line per logged training step
TENSORBOARD_DIR = "tensorboard"
EVAL_FILE = "eval.json"  # evaluation with the run's own config
EVAL_PREFIX = "eval-"  # eval-<settings>.json: evaluations under changed settings
LOCK_FILE = "posenc.lock"  # held (flock) by the process using the directory
# A sweep directory (posenc sweep) and its points.
SWEEP_FILE = "sweep.json"  # the points, their directories and statuses
POINT_FILE = "point.json"  # a point's overrides and resolved config
STATUS_FILE = "status.json"  # a point's status: running, done, failed, interrupted
LOG_FILE = "log.txt"  # a point's output when it runs in a child process
VOCAB_FILE = "vocab.model"  # a translation run's SentencePiece model (bytes need none)
PRETRAINED_FILE = "pretrained.json"  # an imported Hugging Face model's provenance (import-hf)
TOKENIZER_DIR = "tokenizer"  # an imported model's tokenizer files (data.tokenizer = hf:<it>)
# An imported model's classifier parts (BERT's token types, pooler), for --init-from.
PRETRAINED_PARTS = "pretrained_parts.safetensors"
# A translation evaluation's outputs beside its report: eval.json -> eval.hypotheses.txt.
HYPOTHESES_SUFFIX = ".hypotheses.txt"
# posenc analyze: attention by distance and attention entropy. Each output is the stem and a
# suffix below (attention.json, attention.md, ...); under changed evaluation settings the stem is
# attention-<settings>, shortened as evaluation reports' names are.
ANALYSIS_STEM = "attention"
ANALYSIS_SUFFIXES = {
    "json": ".json",  # everything, per length, layer and head (distances bucketed)
    "table": ".md",  # the tables: entropy by length, weight and logit by distance
    "csv": ".csv",  # weight and logit per length, layer, head and distance bucket
    "entropy_csv": "_entropy.csv",  # row entropy per length, layer and head
    "plot": ".png",  # weight against distance, one panel per layer
    "entropy_plot": "_entropy.png",  # normalised entropy against length, one line per layer
}
# posenc retrieval: passkey and needle-in-a-haystack accuracy by length and depth, named as the
# analysis's outputs are (retrieval-<settings>.* under changed evaluation settings).
RETRIEVAL_STEM = "retrieval"
RETRIEVAL_SUFFIXES = {
    "json": ".json",  # the record: scores per task, length and depth; effective length
    "trials": ".jsonl",  # one line per trial: prompt, answer, output, score
    "table": ".md",  # accuracy by depth x length per task, by length, effective lengths
    "heatmap": ".png",  # accuracy by length x depth, one panel per task
    "curve": "_length.png",  # accuracy against length, one line per task
}
# posenc harness (lm-evaluation-harness): its results files (``results_<time>.json``) under this
# folder, as the harness writes them for --output_path <workdir>/harness.
HARNESS_DIR = "harness"
# Every name above: what posenc keeps in a run or sweep directory, never written over by a file
# a user names (an evaluation's --output).
OWNED_NAMES = (
    CONFIG_FILE,
    DATA_FILE,
    INIT_FILE,
    CHECKPOINT_DIR,
    CORRUPT_DIR,
    METRICS_FILE,
    TENSORBOARD_DIR,
    LOCK_FILE,
    SWEEP_FILE,
    POINT_FILE,
    STATUS_FILE,
    LOG_FILE,
    VOCAB_FILE,
    PRETRAINED_FILE,
    TOKENIZER_DIR,
    HARNESS_DIR,
    *(ANALYSIS_STEM + suffix for suffix in ANALYSIS_SUFFIXES.values()),
    *(RETRIEVAL_STEM + suffix for suffix in RETRIEVAL_SUFFIXES.values()),
)


def is_run_record(name: str) -> bool:
    """Whether ``name`` (a path relative to a run directory) is a file or folder the run keeps:
    one of :data:`OWNED_NAMES` (or inside it) or an evaluation report and its outputs
    (``eval.json``, ``eval-*.json``, ``*.hypotheses.txt``)."""
    top = name.split(os.sep)[0]
    return (
        top in OWNED_NAMES
        or top == EVAL_FILE
        or (top.startswith(EVAL_PREFIX) and top.endswith(".json"))
        or top.endswith(HYPOTHESES_SUFFIX)
    )


class WorkdirError(ValueError):
    """A work directory cannot be used as asked; the message says why and what to do."""


# -- atomic writes --------------------------------------------------------------------------


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes ``data`` to ``path`` (parent folders created) so readers never see a partial file."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(
        folder, f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    )
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def to_json(obj: Any, *, indent: int | None = 1, sort_keys: bool = False) -> str:
    """JSON text of ``obj``: tuples as lists, non-finite floats as ``Infinity``/``NaN``, and
    anything else JSON cannot hold as its ``repr``."""
    return json.dumps(obj, indent=indent, sort_keys=sort_keys, default=repr)


def write_json(path: str | os.PathLike[str], obj: Any, *, sort_keys: bool = False) -> None:
    """Writes ``obj`` as indented JSON to ``path``, atomically."""
    atomic_write_bytes(path, (to_json(obj, sort_keys=sort_keys) + "\n").encode())


def read_json(path: str | os.PathLike[str], default: Any = None) -> Any:
    """The JSON value stored at ``path``, or ``default`` when the file does not exist.

    Raises:
      WorkdirError: the file exists but is not valid JSON (naming the file).
    """
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return default
    except json.JSONDecodeError as e:
        raise WorkdirError(
            f"{os.fspath(path)} is not valid JSON ({e}); restore or delete it"
        ) from None


def append_jsonl(file: Any, obj: Mapping[str, Any]) -> None:
    """Appends ``obj`` as one line to an open text file and flushes it."""
    file.write(json.dumps(obj, sort_keys=True) + "\n")
    file.flush()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, in order; blank and torn lines are skipped."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for text in f:
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            if isinstance(line, dict):
                out.append(line)
    return out


def rewrite_jsonl(path: str | os.PathLike[str], keep: Callable[[dict[str, Any]], bool]) -> None:
    """Keeps only the lines of a JSONL file for which ``keep`` is true (and drops torn lines),
    rewriting the file atomically; does nothing when nothing would change."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        raw = [text for text in f.read().split("\n") if text.strip()]
    kept = []
    for text in raw:
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and keep(line):
            kept.append(text)
    if len(kept) != len(raw):
        atomic_write_bytes(path, "".join(text + "\n" for text in kept).encode())


# -- configs --------------------------------------------------------------------------------


def _tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


# Config fields added after posenc 0.1, with the value that means what runs recorded before
# them did; a recorded config without one is read as having that value.
ADDED_FIELDS = {
    "train.positions": "contiguous",
    "train.max_position": 2048,
    "eval.positions": "as_trained",
    "train.init_from": None,
    "train.drop_positions": False,
    "model.causal": True,
    "train.objective": "causal_lm",
    "model.performer_features": 256,
    "eval.examples": 256,
    "eval.generate": True,
    "model.mem_len": 0,
    "eval.mem_len": None,
    "eval.memory_budget": None,
    "train.order": "auto",
    "data.tokenizer": "bytes",
    # The architecture options of posenc.layers.config.ModelConfig, at posenc's defaults.
    "model.num_kv_heads": None,
    "model.qkv_bias": False,
    "model.out_bias": False,
    "model.mlp": "gelu",
    "model.mlp_bias": True,
    "model.norm_position": "pre",
    "model.residual": "sequential",
    "model.norm_eps": 1e-6,
    "model.scale_embeddings": True,
    "model.norm_unit_offset": False,
    "model.output_softcap": 0.0,
    "model.embed_norm": False,
    "model.head_transform": None,
    "model.output_bias": False,
    "model.remat": "none",
    # Runs before it formed all logits at once; chunks give the same losses (float rounding).
    "model.loss_chunk": None,
    # The attention options (posenc.attention.options) and the layer pattern, off.
    "model.window": "full",
    "model.sinks": False,
    "model.qk_norm": "none",
    "model.qk_norm_placement": "before_rotate",
    "model.softcap": 0.0,
    "model.logit_scale": 0.0,
    "model.temperature_floor": 0,
    "model.temperature_scale": 0.1,
    "model.ssmax": False,
    "layers.pattern": (),
    "layers.kinds": {},
    # issue 32 (pretrained families): the output logits' factor, none.
    "model.output_logit_scale": 1.0,
}


def upgrade(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config's JSON form with the fields added since it was written
    (:data:`ADDED_FIELDS`) filled in; the input is not changed."""
    out = json.loads(json.dumps(fields, default=repr))
    for dotted, value in ADDED_FIELDS.items():
        *parents, leaf = dotted.split(".")
        node = out
        for name in parents:
            node = node.setdefault(name, {})
        node.setdefault(leaf, value)
    return out


def config_from_dict(fields: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A locked ``ConfigDict`` from a config's JSON form (upgraded by :func:`upgrade`).

    JSON turns tuples into lists; every sequence in posenc's configs is a tuple, so lists become
    tuples again (converting after building the ``ConfigDict`` would not do: a field keeps the
    type it was created with).
    """
    config = ml_collections.ConfigDict(_tuples(upgrade(fields)))
    config.lock()
    return config


def resolve_tokenizer_folders(fields: Mapping[str, Any], folder: str) -> dict[str, Any]:
    """``fields`` with a relative ``data.tokenizer`` / ``data.vocab`` of ``"hf:<folder>"``
    resolved against ``folder`` (the directory of the ``config.json`` they were read from) when
    it holds that folder: an imported run records ``hf:tokenizer``, so a moved or copied run
    reads its own tokenizer. Absolute paths (older imported runs) and relative ones that
    ``folder`` does not hold (a path the user gave, relative to where posenc runs) are kept."""
    data = fields.get("data")
    if not isinstance(data, Mapping):
        return dict(fields)
    data = dict(data)
    for key in ("tokenizer", "vocab"):
        value = data.get(key)
        if isinstance(value, str) and value.startswith("hf:") and value[3:]:
            path = value[3:]
            if not os.path.isabs(path) and os.path.isdir(os.path.join(folder, path)):
                data[key] = "hf:" + os.path.normpath(os.path.abspath(os.path.join(folder, path)))
    return {**fields, "data": data}


def config_sha256(config: ml_collections.ConfigDict) -> str:
    """sha256 of a resolved config's canonical JSON."""
    return hashlib.sha256(config.to_json(sort_keys=True).encode()).hexdigest()


def flatten(fields: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become tuples."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = tuple(value) if isinstance(value, list) else value
    return out


def diff_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The dotted names of the fields whose values differ between two config dicts."""
    fa, fb = flatten(a), flatten(b)
    return [key for key in sorted(set(fa) | set(fb)) if fa.get(key) != fb.get(key)]


# -- readable, unique names -----------------------------------------------------------------

# Longest readable part of a generated name (file systems allow 255 bytes).
_MAX_NAME = 120
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(_render(v) for v in value)
    return str(value)


def settings_hash(settings: Mapping[str, Any]) -> str:
    """sha256 of dotted settings (key order and int/float/str distinctions included)."""
    canonical = json.dumps(
        [[k, type(v).__name__, v] for k, v in sorted(settings.items())], default=repr
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def parse_value(text: str) -> Any:
    """A command-line value as a Python literal where it parses as one, else the string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def settings_name(
    settings: Mapping[str, Any],
    max_len: int = _MAX_NAME,
    hash_of: Mapping[str, Any] | None = None,
    key: Callable[[str, Any], Any] | None = None,
) -> str:
    """A readable, file-system-safe name for a set of dotted settings, stable and unique.

    Keys are sorted, so the name does not depend on the order the settings were written in::

        {"seed": 0, "encoding.name": "alibi"} -> "encoding.name-alibi__seed-0"

    Characters outside ``[A-Za-z0-9._+-]`` become ``_``; where that (or shortening a name longer
    than ``max_len``, or a string that reads back as another literal: "0" vs 0) could make two
    settings collide, a hash of the exact settings is appended.

    Args:
      settings: dotted field -> value.
      max_len: longest readable part (the hash comes on top).
      hash_of: settings that ``settings`` abbreviates (their keys shortened): the hash is then
        always appended, and is of these.
      key: ``(field, value) -> sort key`` of the parts (default the field's name); the order
        is still independent of the order the settings were written in.
    """
    if not settings:
        return "base"
    parts, lossy = [], False
    order = sorted(settings, key=None if key is None else (lambda k: key(k, settings[k])))
    for field in order:
        value = settings[field]
        text = _render(value)
        safe_key, safe_text = _SAFE.sub("_", field), _SAFE.sub("_", text)
        lossy |= safe_key != field or safe_text != text
        lossy |= isinstance(value, str) and parse_value(text) != value
        lossy |= isinstance(value, list | tuple) or "__" in safe_text + safe_key
        parts.append(f"{safe_key}-{safe_text}")
    name = "__".join(parts)
    if name.startswith((".", "-")):
        name, lossy = "_" + name, True
    if len(name) > max_len:
        name, lossy = name[:max_len], True
    if lossy or hash_of is not None:
        name += "__h" + settings_hash(settings if hash_of is None else hash_of)[:10]
    return name


# -- the names of evaluation results --------------------------------------------------------

# Longest readable part of an evaluation result's name (a hash of the settings follows).
_EVAL_NAME_LEN = 60


def _method_first(key: str, value: Any) -> tuple[int, str]:
    """Sort key of a result name's parts: string values first (they name the method: ``scaling``
    yarn, ``mode`` sliding, ``split`` test), so that cutting a long name keeps them."""
    return (0 if isinstance(value, str) else 1, key)


def results_name(changes: Mapping[str, Any], settings: Mapping[str, Any] | None = None) -> str:
    """The short, deterministic name of an evaluation's changed settings and, for a command that
    has its own (``posenc retrieval``'s lengths, tasks, haystack, ...; ``posenc analyze``'s
    lengths and tokens), those of them that differ from the command's defaults.

    ``eval.`` and ``encoding.hparams.`` are left out of the field names, the method (a string
    value) comes first, the readable part is cut at 60 characters, and a hash of the exact
    settings follows wherever the short form could be ambiguous.

    Args:
      changes: dotted config fields the evaluation changes (``{"encoding.hparams.scaling":
        "yarn", ...}``).
      settings: the command's own settings, bare names (``{"lengths": (4096,)}``).
    """
    hparams = "encoding.hparams."
    exact = {**changes, **(settings or {})}
    short = {k.removeprefix("eval.").removeprefix(hparams): v for k, v in exact.items()}
    if len(short) < len(exact):  # "eval.x" and a setting or hparam "x" would share a name
        return settings_name(exact, _EVAL_NAME_LEN, key=_method_first)
    # An encoder's hyperparameter may share its name with an eval field: hash the exact fields.
    hashed = exact if any(k.startswith(hparams) for k in changes) else None
    return settings_name(short, _EVAL_NAME_LEN, hash_of=hashed, key=_method_first)


def eval_file_name(changes: Mapping[str, Any]) -> str:
    """``eval.json`` for the run's own settings, else ``eval-<short settings>.json``.

    The name is short and deterministic (the same changes always name the same file, so an
    evaluation repeated under them replaces its report; :func:`results_name`)::

        {"eval.mode": "sliding", "eval.stride": 32}  -> eval-mode-sliding__stride-32.json
        {"encoding.hparams.scaling": "yarn", "encoding.hparams.factor": 8,
         "encoding.hparams.original_max_len": 128}
            -> eval-scaling-yarn__factor-8__original_max_len-128__h<10 hex>.json

    Readers never parse the name: every report records its ``changes`` (a report written
    under an older naming, ``eval-factor-8__...__scaling-yarn__h<hex>.json``, is read alike).
    """
    if not changes:
        return EVAL_FILE
    return f"{EVAL_PREFIX}{results_name(changes)}.json"


def _names(
    stem: str,
    suffixes: Mapping[str, str],
    changes: Mapping[str, Any],
    settings: Mapping[str, Any] | None,
) -> dict[str, str]:
    if changes or settings:
        stem += f"-{results_name(changes, settings)}"
    return {kind: stem + suffix for kind, suffix in suffixes.items()}


def analysis_names(
    changes: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The file names ``posenc analyze`` writes, by kind (:data:`ANALYSIS_SUFFIXES`):
    ``attention.json``, ``attention.md``, ... for the run's own settings at the command's
    defaults, else ``attention-<changes and settings>.*`` (:func:`results_name`; settings:
    ``lengths``, ``tokens`` where not the defaults), so an analysis never replaces another's."""
    return _names(ANALYSIS_STEM, ANALYSIS_SUFFIXES, changes, settings)


def retrieval_names(
    changes: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """The file names ``posenc retrieval`` (and ``posenc eval --tasks``) writes, by kind
    (:data:`RETRIEVAL_SUFFIXES`): ``retrieval.json``, ``retrieval.jsonl``, ... for the run's own
    settings at the command's defaults, else ``retrieval-<changes and settings>.*``
    (:func:`results_name`; settings: ``tasks``, ``lengths``, ``depths``, ``trials``, ``seed``,
    ``haystack``, ``threshold`` where not the defaults), so a retrieval at other lengths, tasks
    or haystack, or under YaRN, never replaces another's."""
    return _names(RETRIEVAL_STEM, RETRIEVAL_SUFFIXES, changes, settings)
