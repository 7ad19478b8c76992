"""The evaluated runs of a sweep, grouped into the columns and cells of the papers' tables."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from posenc.workdir import CONFIG_FILE, EVAL_FILE, SWEEP_FILE, flatten, read_json, upgrade

# accuracy: masked-LM runs only (the share of masked tokens predicted).
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
)


@dataclasses.dataclass
class Run:
    """One evaluated work directory."""

    dir: str
    eval: dict[str, Any]
    identity: dict[str, Any]  # flattened config fields that define the column

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
    flat["eval.mode"] = report["mode"]
    flat["eval.stride"] = report.get("stride")
    flat["eval.split"] = report["data"].get("split")
    flat["eval.positions"] = report.get("positions", "contiguous")
    flat["eval.mem_len"] = report.get("mem_len", 0)
    return {
        k: v
        for k, v in flat.items()
        if not any(k == p or (p.endswith(".") and k.startswith(p)) for p in _IGNORED)
    }


def find_runs(sweep_dir: str) -> list[Run]:
    """Evaluated runs under ``sweep_dir``, in sweep order (``sweep.json``) or name order."""
    sweep = read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if sweep is not None:
        dirs = [os.path.join(sweep_dir, p["dir"]) for p in sweep["points"]]
    elif os.path.exists(os.path.join(sweep_dir, EVAL_FILE)):
        dirs = [sweep_dir]
    else:
        dirs = sorted(
            os.path.dirname(p) for p in glob.glob(os.path.join(sweep_dir, "*", EVAL_FILE))
        )
    runs = []
    for d in dirs:
        report = read_json(os.path.join(d, EVAL_FILE))
        if report is not None:
            runs.append(Run(d, report, _identity(d, report)))
    return runs


def _freeze(identity: dict[str, Any]) -> str:
    return json.dumps(sorted(identity.items()), default=repr)


def group_runs(runs: Sequence[Run]) -> dict[int, list[Column]]:
    """Columns per training length: runs equal but for the seed share a column."""
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
            same_name = [g[0].identity for g in groups if g[0].encoding == group[0].encoding]
            label = _label(group[0], same_name)
            if any(not r.finished for r in group):
                label += " †"
            columns.append(Column(label, sorted(group, key=lambda r: r.seed)))
        out[train_len] = columns
    return out


def _label(run: Run, same_name: list[dict[str, Any]]) -> str:
    """The encoder name, plus the fields that differ between its columns (if several)."""
    if len(same_name) < 2:
        return run.encoding
    keys = sorted({k for ident in same_name for k in ident})
    differ = [k for k in keys if len({repr(ident.get(k)) for ident in same_name}) > 1]
    if "train.positions" in differ and run.identity.get("eval.positions") == run.identity.get(
        "train.positions"
    ):
        differ.remove("eval.positions")  # evaluated as trained: one word says both
    text = ", ".join(f"{_short(k)}={run.identity.get(k)}" for k in differ)
    return f"{run.encoding} ({text})"


def _short(field: str) -> str:
    """A config field as a column label says it: ``encoding.hparams.base`` -> ``base``,
    ``train.positions`` -> ``positions``."""
    return field.removeprefix("encoding.hparams.").removeprefix("train.")


def cell(column: Column, length: int, metric: str) -> Cell | None:
    """The entry of ``column`` at ``length`` (None: no run evaluated that length)."""
    values, error = [], None
    for run in column.runs:
        r = run.result(length)
        if r is None:
            continue
        if "error" in r:
            error = r["error"]
        elif metric in r:  # a causal-LM run has no accuracy, a masked-LM run no bits per byte
            values.append(float(r[metric]))
    if not values and error is None:
        return None
    return Cell(values, error)


def table_lengths(columns: Sequence[Column]) -> list[int]:
    return sorted({r["length"] for c in columns for run in c.runs for r in run.eval["results"]})
