"""The evaluated runs of a sweep, grouped into the columns and cells of the papers' tables.

Every evaluation of every run counts: a work directory's ``eval.json`` and each
``eval-<changes>.json`` written by ``posenc eval`` under changed settings (RoPE scaled with
YaRN, a sliding window, the test split, ...). An evaluation's identity is its run's config (less
the seed and what cannot change the numbers) with the evaluation's recorded ``changes`` applied,
so runs of several seeds evaluated under the same changes share one column, named by the
changes (``rope (yarn x8)``), beside the column of their own evaluations (``rope``).

Evaluations of one run with the same identity (``eval.json`` at 64 ... 1024 and
``eval-lengths-...json`` at 4096, say, or a long length scored on another attention path) are
merged, length by length, when they scored the same checkpoint step; a report of an older step
is left out and named in the report's notes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from posenc.runs.drope import dropped_from
from posenc.workdir import (
    CONFIG_FILE,
    EVAL_FILE,
    INIT_FILE,
    PRETRAINED_FILE,
    SWEEP_FILE,
    RunDir,
    flatten,
    read_json,
    upgrade,
)

# The per-length metrics of the common tables; a run has those of its kind
# (:attr:`posenc.kinds.base.RunKind.report_metrics`).
METRICS = ("perplexity", "bits_per_byte", "loss", "accuracy")
# Config fields that do not change what a run's numbers mean (left out of column identity).
_IGNORED = (
    "seed",
    "train.seq_len",
    "train.progress",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "eval.lengths",
    "eval.multiples",
    "eval.batch_tokens",
    "data.data_dir",
    "distributed.",
    "mesh.",
    "model.remat",
    "model.loss_chunk",
)
# Evaluation changes that choose how attention is computed, not what: an evaluation on another
# path (blocked attention for a long window, say) scores the same model, in the same column.
_PATH_FIELDS = ("model.attention_impl", "model.attention_block_size")


@dataclasses.dataclass
class Run:
    """One evaluation of one work directory (or several of its reports, merged).

    Attributes:
      dir: the work directory.
      eval: the report (its ``results`` merged over ``files``).
      identity: flattened config fields that define the column: the run's config, less the
        seed and what cannot change the numbers, with ``changes`` applied.
      files: the evaluation reports the results come from (``eval.json`` first).
      changes: the evaluation's changed settings that define its column (``{}``: the run's own).
      superseded: reports left out because they scored an older checkpoint step.
      sources: the report each length's result comes from.
    """

    dir: str
    eval: dict[str, Any]
    identity: dict[str, Any]
    files: tuple[str, ...] = (EVAL_FILE,)
    changes: dict[str, Any] = dataclasses.field(default_factory=dict)
    superseded: tuple[str, ...] = ()
    sources: dict[int, str] = dataclasses.field(default_factory=dict)

    @property
    def encoding(self) -> str:
        return self.eval["encoding"]

    @property
    def train_len(self) -> int:
        return int(self.eval["train_seq_len"])

    @property
    def seed(self) -> int:
        return self.eval["seed"]

    @property
    def finished(self) -> bool:
        """False only for a run scored before its training finished (older reports: True)."""
        return self.eval.get("finished") is not False

    def result(self, length: int) -> dict[str, Any] | None:
        for r in self.eval["results"]:
            if r["length"] == length:
                return r
        return None

    @property
    def imported(self) -> dict[str, Any] | None:
        """The provenance of a model posenc did not train (``pretrained.json``, written by
        ``posenc import-hf``: ``family``, ``source``, ...), None for a run posenc trained."""
        return read_json(os.path.join(self.dir, PRETRAINED_FILE))

    @property
    def tokens(self) -> str:
        """What the run's tokens are: ``"bytes"``, or a pretrained tokenizer's model type
        (``"BPE"``, ``"WordPiece"``, ``"Unigram"``, ...; from its ``tokenizer.json``, else
        ``"pretrained tokenizer"``)."""
        spec = self.eval.get("data", {}).get("tokenizer") or "bytes"
        if not spec.startswith("hf:"):
            return spec
        folder = os.path.join(self.dir, spec.removeprefix("hf:"))  # relative: to the run
        try:
            with open(os.path.join(folder, "tokenizer.json")) as f:
                kind = json.load(f)["model"]["type"]
        except (OSError, ValueError, KeyError, TypeError):  # moved, unreadable: say less
            return "pretrained tokenizer"
        return str(kind)


@dataclasses.dataclass
class Column:
    """The runs (one per seed) of one configuration at one training length."""

    label: str
    runs: list[Run]

    @property
    def unfinished(self) -> list[Run]:
        return [r for r in self.runs if not r.finished]


@dataclasses.dataclass
class Cell:
    """One table entry: values over seeds, or an error."""

    values: list[float]
    error: str | None = None

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return math.fsum(self.values) / len(self.values) if self.values and not self.error else None

    @property
    def spread(self) -> float | None:
        """Sample standard deviation over seeds (None for one seed, or an infinite value)."""
        if self.error or len(self.values) < 2 or not all(map(math.isfinite, self.values)):
            return None
        return statistics.stdev(self.values)


def _ignored(field: str) -> bool:
    return any(field == p or (p.endswith(".") and field.startswith(p)) for p in _IGNORED)


def _identity(run_dir: str, report: dict[str, Any]) -> dict[str, Any]:
    """Config fields defining a run apart from seed and training length."""
    fields = read_json(os.path.join(run_dir, CONFIG_FILE))
    if fields is not None:
        flat = flatten(upgrade(fields))  # fields added since the run read as it ran
    else:  # an eval.json on its own
        model = {k: v for k, v in report["model"].items() if k != "num_params"}
        flat = flatten(
            {
                "encoding": {"name": report["encoding"], "hparams": report["encoding_hparams"]},
                "model": model,
                "train": {"steps": report["train_steps"]},
                "data": {"source": report["data"]["source"]},
            }
        )
    if flat.get("train.init_from"):
        flat["train.init_from"] = _init_from(run_dir, flat["train.init_from"])
    if flat.get("train.drop_positions"):  # DroPE: which encoder was dropped (init.json)
        record = read_json(os.path.join(run_dir, INIT_FILE))
        flat["train.drop_positions"] = dropped_from(record) or "its encoder"
    flat["eval.mode"] = report["mode"]
    flat["eval.stride"] = report.get("stride")
    flat["eval.split"] = report["data"].get("split")
    flat["eval.positions"] = report.get("positions", "contiguous")
    flat["eval.mem_len"] = report.get("mem_len", 0)
    flat.update(variant_changes(report))
    return {k: v for k, v in flat.items() if not _ignored(k)}


def _init_from(run_dir: str, path: str) -> str:
    """What a run started from, without the path (runs fine-tuned from different seeds of one
    configuration share a column): its encoder and step (``init.json``), else the path."""
    record = read_json(os.path.join(run_dir, INIT_FILE))
    if record is None:
        return path
    return f"{record['encoding']['name']} run, step {record['step']}"


def variant_changes(report: dict[str, Any]) -> dict[str, Any]:
    """The changes an evaluation report records that make it a column of its own: all but
    the lengths, the batch size and the attention path."""
    changes = report.get("changes") or {}
    return {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in changes.items()
        if not _ignored(k) and k not in _PATH_FIELDS
    }


def _run_dirs(sweep_dir: str) -> list[str]:
    """The work directories under ``sweep_dir``: the points of ``sweep.json``, or the directory
    itself if it is an evaluated run, or its evaluated subdirectories in name order."""
    sweep = read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if sweep is not None:
        return [os.path.join(sweep_dir, p["dir"]) for p in sweep["points"]]
    if not os.path.isdir(sweep_dir):
        return []
    if next(RunDir(sweep_dir).eval_files(), None) is not None:
        return [sweep_dir]
    subdirs = sorted(os.path.join(sweep_dir, n) for n in os.listdir(sweep_dir))
    return [d for d in subdirs if os.path.isdir(d) and next(RunDir(d).eval_files(), None)]


def _merge(run_dir: str, reports: list[tuple[str, dict[str, Any]]], identity) -> Run:
    """One run from its reports of one identity: those of the newest checkpoint step, their
    results merged length by length (a later report's result replaces an earlier one's)."""
    steps = [r.get("checkpoint_step") for _, r in reports]
    newest = max((s for s in steps if s is not None), default=None)
    # A report that does not record its step (written by an older posenc) is kept.
    current = [s in (None, newest) for s in steps]
    kept = [report for report, ok in zip(reports, current, strict=True) if ok]
    superseded = tuple(n for (n, _), ok in zip(reports, current, strict=True) if not ok)
    by_length: dict[int, dict[str, Any]] = {}
    sources: dict[int, str] = {}
    for name, report in sorted(kept, key=lambda item: item[1].get("time", 0)):
        for result in report["results"]:
            by_length[result["length"]] = result
            sources[result["length"]] = name
    primary = kept[0][1]  # eval.json when it is among them: eval_files() lists it first
    merged = {**primary, "results": [by_length[n] for n in sorted(by_length)]}
    files = tuple(name for name, _ in kept)
    changes = variant_changes(primary)
    return Run(run_dir, merged, identity, files, changes, superseded, sources)


def find_runs(sweep_dir: str) -> list[Run]:
    """Every evaluation of every run under ``sweep_dir`` (see the module docstring), in sweep
    order (``sweep.json``) or name order; in a run, ``eval.json``'s first."""
    runs = []
    for d in _run_dirs(sweep_dir):
        groups: dict[str, tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]] = {}
        run = RunDir(d)
        for name in run.eval_files():
            report = run.read_eval(name)
            if report is None or "results" not in report:
                continue
            identity = _identity(d, report)
            groups.setdefault(_freeze(identity), (identity, []))[1].append((name, report))
        runs += [_merge(d, reports, identity) for identity, reports in groups.values()]
    return runs


def _freeze(identity: dict[str, Any]) -> str:
    return json.dumps(sorted(identity.items()), default=repr)


def group_runs(runs: Sequence[Run]) -> dict[int, list[Column]]:
    """Columns per training length: evaluations equal but for the seed share a column."""
    tables: dict[int, dict[str, list[Run]]] = {}
    for run in runs:
        tables.setdefault(run.train_len, {}).setdefault(_freeze(run.identity), []).append(run)
    out = {}
    for train_len in sorted(tables):
        groups = list(tables[train_len].values())
        columns = []
        for group in groups:
            seeds = [r.seed for r in group]
            if len(set(seeds)) != len(seeds):
                raise ValueError(
                    f"runs {[r.dir for r in group]} have the same configuration and seed; "
                    "report them from separate directories"
                )
            same_name = [g[0] for g in groups if g[0].encoding == group[0].encoding]
            label = _label(group[0], same_name)
            if any(not r.finished for r in group):
                label += " †"
            columns.append(Column(label, sorted(group, key=lambda r: r.seed)))
        out[train_len] = columns
    return out


def pattern_text(identity: dict[str, Any]) -> str:
    """A run's pattern of layer kinds (:mod:`posenc.layers.pattern`) as a label says it, runs of
    one kind counted: ``3 x [rope, sliding:32] + [nope]``, each kind its encoder (the run's when
    it names none) with its hyperparameters and the attention options it sets; ``""`` without a
    pattern."""
    pattern = identity.get("layers.pattern") or ()
    if not pattern:
        return ""
    prefix = "layers.kinds."

    def kind_text(name: str) -> str:
        fields = {
            k.removeprefix(f"{prefix}{name}."): v
            for k, v in identity.items()
            if k.startswith(f"{prefix}{name}.")
        }
        parts = [str(fields.pop("encoding", None) or identity.get("encoding.name"))]
        parts += [
            f"{k.removeprefix('hparams.')}={v}" for k, v in sorted(fields.items()) if "hparams" in k
        ]
        window = fields.pop("window", None)
        parts += [str(window)] if window else []
        parts += [f"{k}={v}" for k, v in sorted(fields.items()) if "hparams" not in k]
        return f"[{', '.join(parts)}]"

    runs: list[list[Any]] = []
    for name in pattern:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return " + ".join(f"{n} x {kind_text(k)}" if n > 1 else kind_text(k) for k, n in runs)


def _label(run: Run, same_name: list[Run]) -> str:
    """The encoder name, plus the trained fields that differ between its columns (if several),
    plus what the evaluation changed (``rope (yarn x8)``); a run with a pattern of layer kinds
    names its pattern (:func:`pattern_text`) in place of its ``layers.*`` fields."""
    parts = []
    dropped = run.identity.get("train.drop_positions")
    if dropped:  # DroPE-continued (posenc.runs.drope): "nope (DroPE from rope)"
        parts.append(f"DroPE from {dropped}")
    if len({_freeze(r.identity) for r in same_name}) > 1:
        evaluated = {k for r in same_name for k in r.changes}  # named by the changes instead
        identities = [r.identity for r in same_name]
        keys = sorted({k for ident in identities for k in ident} - evaluated)
        differ = [k for k in keys if len({repr(ident.get(k)) for ident in identities}) > 1]
        if any(k.startswith("layers.") for k in differ):
            differ = [k for k in differ if not k.startswith("layers.")]
            pattern = pattern_text(run.identity)
            if pattern:
                parts.append(pattern)
        if "train.positions" in differ and run.identity.get("eval.positions") == run.identity.get(
            "train.positions"
        ):
            differ.remove("eval.positions")  # evaluated as trained: one word says both
        if dropped and "train.drop_positions" in differ:
            differ.remove("train.drop_positions")  # said by "DroPE from ..."
        if differ:
            parts.append(", ".join(f"{_short(k)}={run.identity.get(k)}" for k in differ))
    if run.changes:
        parts.append(describe_changes(run.encoding, run.changes, run.train_len))
    return f"{run.encoding} ({'; '.join(parts)})" if parts else run.encoding


def describe_changes(encoding: str, changes: dict[str, Any], train_len: int) -> str:
    """What an evaluation changed, as a column names it: the encoder's hyperparameters as the
    encoder describes them (:meth:`posenc.encodings.Encoding.describe_eval`, e.g. ``yarn x8``),
    then the other fields as ``field=value``."""
    prefix = "encoding.hparams."
    hparams = {k.removeprefix(prefix): v for k, v in changes.items() if k.startswith(prefix)}
    parts = []
    if hparams:
        from posenc import encodings

        try:
            describe = encodings.get_class(encoding).describe_eval
        except (KeyError, ValueError):  # an encoder this installation does not register
            describe = encodings.Encoding.describe_eval
        parts.append(describe(hparams, train_len))
    parts += [f"{_short(k)}={v}" for k, v in sorted(changes.items()) if not k.startswith(prefix)]
    return ", ".join(parts)


def _short(field: str) -> str:
    """A config field as a column label says it: ``encoding.hparams.base`` -> ``base``,
    ``train.positions`` -> ``positions``, ``eval.mode`` -> ``mode``."""
    for prefix in ("encoding.hparams.", "train.", "eval."):
        field = field.removeprefix(prefix)
    return field


def cell(column: Column, length: int, metric: str) -> Cell | None:
    """The entry of ``column`` at ``length`` (None: no run evaluated that length)."""
    values, error = [], None
    for run in column.runs:
        r = run.result(length)
        if r is None:
            continue
        if "error" in r:
            error = r["error"]
        elif r.get(metric) is not None:  # a run of one kind may lack another kind's metric,
            values.append(float(r[metric]))  # and an empty length bucket has no score
    if not values and error is None:
        return None
    return Cell(values, error)


def table_lengths(columns: Sequence[Column]) -> list[int]:
    return sorted({r["length"] for c in columns for run in c.runs for r in run.eval["results"]})
