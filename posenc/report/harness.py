"""The harness section of a report: lm-evaluation-harness results kept in the runs' directories.

``posenc harness run --model posenc --model_args workdir=<run> ...`` writes the harness's own
results file under ``<run>/harness/`` (:data:`posenc.workdir.HARNESS_DIR`; the default output
path for a posenc run). This section reads every run's results files (the folder itself and its
subdirectories, one level, as :func:`posenc.report.find_runs` looks) and tables them: one row per
run and set of evaluation changes (the ``model_args`` with a dot, such as
``encoding.hparams.scaling=yarn``, and ``max_length``: a different evaluation of the run), one
column per task and metric, the newest result of each task kept, its standard error beside it
where the harness gives one. Nothing here imports the harness.
"""

from __future__ import annotations

import math
import os
from typing import Any

from posenc.workdir import CONFIG_FILE, RunDir, flatten, read_json

_NOT_METRICS = ("alias", "samples", "name", "sample_len")


def _run_dirs(folder: str) -> list[str]:
    subdirs = sorted(
        os.path.join(folder, n)
        for n in (os.listdir(folder) if os.path.isdir(folder) else [])
        if os.path.isdir(os.path.join(folder, n))
    )
    return [folder, *subdirs]


def _changes(results: dict[str, Any]) -> dict[str, Any]:
    """The evaluation changes a results file was made with: its model arguments with a dot."""
    args = (results.get("config") or {}).get("model_args") or {}
    if isinstance(args, str):  # the Python API keeps the string it was given
        args = dict(item.split("=", 1) for item in args.split(",") if "=" in item)
    changes = {k: v for k, v in sorted(args.items()) if "." in k}
    if args.get("max_length") is not None:  # the scoring window, when not the training length
        changes["max_length"] = args["max_length"]
    return changes


def find_harness_results(folder: str) -> list[dict[str, Any]]:
    """One entry per run directory and set of evaluation changes with harness results:
    ``{"dir", "changes", "config", "tasks": {task: {metric: value}}, "files"}``, the newest
    value of each task's metric kept (results files are read oldest first)."""
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    for d in _run_dirs(folder):
        for path in RunDir(d).harness_files():
            results = read_json(path)
            if not isinstance(results, dict) or not isinstance(results.get("results"), dict):
                continue
            if (results.get("config") or {}).get("model") not in (None, "posenc"):
                continue
            changes = _changes(results)
            key = (d, repr(changes))
            entry = entries.setdefault(
                key,
                {"dir": d, "changes": changes, "tasks": {}, "files": []},
            )
            entry["files"].append(os.path.relpath(path, folder))
            for task, metrics in results["results"].items():
                entry["tasks"][task] = {
                    k: v
                    for k, v in metrics.items()
                    if k.split(",")[0] not in _NOT_METRICS and _number(v) is not None
                }
    for entry in entries.values():
        config = read_json(os.path.join(entry["dir"], CONFIG_FILE))
        entry["config"] = flatten(config) if isinstance(config, dict) else {}
    return list(entries.values())


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _label(entry: dict[str, Any], folder: str) -> str:
    from posenc.report.retrieval import evaluation_label

    config = entry["config"]
    changes = dict(entry["changes"])
    window = changes.pop("max_length", None)
    record = {
        "encoding": config.get("encoding.name", "?"),
        "changes": changes,
        "train_seq_len": config.get("train.seq_len"),
    }
    where = os.path.relpath(entry["dir"], folder)
    window = f"; max_length {window}" if window is not None else ""
    return f"{evaluation_label(record)} [train {record['train_seq_len']}{window}; {where}]"


def _cell(metrics: dict[str, Any] | None, column: str) -> str:
    if not metrics or column not in metrics:
        return "—"
    value = metrics[column]
    name, _, filt = column.partition(",")
    stderr = _number(metrics.get(f"{name}_stderr,{filt}" if filt else f"{name}_stderr"))
    text = f"{value:.4g}"
    if stderr is not None and math.isfinite(stderr):
        text += f" ± {stderr:.2g}"
    return text


def harness_section(folder: str) -> list[str]:
    """The markdown of the section (empty when no run under ``folder`` has harness results)."""
    entries = find_harness_results(folder)
    if not entries:
        return []
    columns = sorted(
        {
            (task, metric)
            for e in entries
            for task, metrics in e["tasks"].items()
            for metric in metrics
            if "_stderr" not in metric
        }
    )
    heads = [f"{task}: {metric.replace(',none', '')}" for task, metric in columns]
    md = ["## lm-evaluation-harness", ""]
    md.append(
        "Each task's metric as the harness reports it (± its standard error), the newest result "
        "per run and set of evaluation changes (`posenc harness`, results under "
        "`<run>/harness/`)."
    )
    md += ["", "| run | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for entry in sorted(entries, key=lambda e: _label(e, folder)):
        cells = [_cell(entry["tasks"].get(task), metric) for task, metric in columns]
        md.append(f"| {_label(entry, folder)} | " + " | ".join(cells) + " |")
    return md + [""]
