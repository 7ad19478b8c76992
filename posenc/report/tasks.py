"""Reports of algorithmic-task runs (``data.source = "synthetic:<task>"``), laid out like the
length-generalisation papers' tables.

:func:`write_task_report` gathers the evaluated task runs under a directory and writes
``report.md`` with

- **the summary** (Ruoss et al. 2023, Table 1's layout): one row per task, one column per
  configuration (encoder, and randomized positions where a sweep has both), each entry the metric
  averaged over the *unseen* lengths (those above the training length, ``train.seq_len``), with
  the spread over seeds where there are several; a last row averages over the tasks;
- **the ranking** (Kazemnejad et al. 2023, Sec. 4's mean reciprocal rank): per task the
  configurations are ranked by that average (ties share the mean of their ranks); a
  configuration's MRR is the mean over tasks of 1 / rank;
- per task, the metric at every evaluated length (rows) and configuration (columns), and a plot
  ``<metric>_<task>.png`` of the metric against length, one line per configuration, the training
  range shaded.

``report.csv`` holds the summary with full precision. Metrics: ``accuracy`` (per-token, teacher
forcing: Ruoss et al.'s), ``exact_match`` (greedy generation: Kazemnejad et al.'s),
``sequence_accuracy`` and ``loss``.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Sequence

from posenc import kinds
from posenc.kinds.tasks import SyntheticTask
from posenc.report.runs import Column, Run, cell, group_runs, table_lengths
from posenc.report.tables import describe, format_table, markdown_table

TASK_METRICS = SyntheticTask.report_metrics
TASK_METRIC_TEXT = {
    "accuracy": "per-token accuracy on the target (teacher forcing)",
    "exact_match": "exact match of greedy generation",
    "sequence_accuracy": "per-token accuracy, averaged per example",
    "loss": "loss on the target tokens (nats per token)",
}


def unseen_mean(column: Column, metric: str) -> tuple[float | None, float | None, int]:
    """The metric averaged over the lengths above the training length, per seed; then
    ``(mean over seeds, sample standard deviation or None, seeds)``. None where no run has a
    value at an unseen length."""
    per_seed = []
    for run in column.runs:
        values = [
            float(r[metric])
            for r in run.eval["results"]
            if r["length"] > run.train_len and r.get(metric) is not None and "error" not in r
        ]
        if values:
            per_seed.append(math.fsum(values) / len(values))
    if not per_seed:
        return None, None, 0
    spread = statistics.stdev(per_seed) if len(per_seed) > 1 else None
    return math.fsum(per_seed) / len(per_seed), spread, len(per_seed)


def ranks(scores: dict[str, float], higher_is_better: bool = True) -> dict[str, float]:
    """Rank 1 for the best score; tied scores share the mean of the ranks they span."""
    ordered = sorted(scores, key=lambda k: -scores[k] if higher_is_better else scores[k])
    out, i = {}, 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and scores[ordered[j + 1]] == scores[ordered[i]]:
            j += 1
        for k in ordered[i : j + 1]:
            out[k] = (i + j) / 2 + 1
        i = j + 1
    return out


def mean_reciprocal_rank(
    per_task: dict[str, dict[str, float]],
    higher_is_better: bool = True,
    labels: Sequence[str] | None = None,
) -> dict[str, float]:
    """``{configuration: mean over tasks of 1 / rank}``, ranking within each task; a
    configuration without a score in a task (in ``labels`` but not scored there, e.g. a learned
    table that cannot embed the unseen lengths) counts as ranked last there."""
    labels = list(labels or dict.fromkeys(label for s in per_task.values() for label in s))
    totals = dict.fromkeys(labels, 0.0)
    for scores in per_task.values():
        r = ranks(scores, higher_is_better)
        for label in labels:
            totals[label] += 1.0 / r.get(label, len(labels))
    return {label: totals[label] / len(per_task) for label in labels}


def _fmt(value: float | None, spread: float | None, metric: str) -> str:
    if value is None:
        return ""
    scale, digits = (100.0, 1) if metric != "loss" else (1.0, 3)
    text = f"{value * scale:.{digits}f}"
    return text if spread is None else f"{text} ± {spread * scale:.{digits}f}"


def plot_task(path: str, columns: Sequence[Column], train_len: int, metric: str, title: str):
    """The metric against input length, one line per configuration (mean over seeds, the
    spread shaded), the training range ``[1, train_len]`` shaded grey."""
    import matplotlib.pyplot as plt

    lengths = table_lengths(columns)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    ax.axvspan(0, train_len + 0.5, color="0.85", label=f"training lengths 1-{train_len}")
    for column in columns:
        xs, ys, spreads = [], [], []
        for length in lengths:
            entry = cell(column, length, metric)
            if entry is not None and entry.error is None and entry.values:
                xs.append(length)
                ys.append(entry.mean)
                spreads.append(entry.spread or 0.0)
        if not xs:
            continue
        (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=column.label)
        if any(spreads):
            lo = [y - s for y, s in zip(ys, spreads, strict=True)]
            hi = [y + s for y, s in zip(ys, spreads, strict=True)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlim(0, max(lengths) * 1.02 if lengths else 1)
    if metric != "loss":
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("input length")
    ax.set_ylabel(TASK_METRIC_TEXT[metric])
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _summary_section(grouped: dict[str, dict[int, list[Column]]], metric: str):
    """Per task and configuration the metric over the unseen lengths, its average over tasks and
    the mean reciprocal rank: ``(summary, mrr, markdown lines)``."""
    summary: dict[str, dict[str, tuple[float | None, float | None, int]]] = {}
    for task, tables in grouped.items():
        for train_len, columns in tables.items():
            key = task if len(tables) == 1 else f"{task} (L={train_len})"
            summary[key] = {c.label.removesuffix(" †"): unseen_mean(c, metric) for c in columns}
    labels = list(dict.fromkeys(label for row in summary.values() for label in row))
    rows = []
    for key, row in summary.items():
        rows.append(
            [key, *(_fmt(*row[label][:2], metric) if label in row else "" for label in labels)]
        )
    averages = []
    for label in labels:
        values = [
            row[label][0] for row in summary.values() if row.get(label, (None,))[0] is not None
        ]
        averages.append(_fmt(math.fsum(values) / len(values), None, metric) if values else "")
    rows.append(["average over tasks", *averages])
    scores = {
        key: {label: v[0] for label, v in row.items() if v[0] is not None}
        for key, row in summary.items()
    }
    mrr = mean_reciprocal_rank(scores, metric != "loss", labels) if scores else {}
    unit = "%" if metric != "loss" else "nats"
    md = [
        f"## Summary: {metric} ({unit}) averaged over the unseen lengths (above the training "
        "length), per task",
        "",
        *format_table(["task", *labels], rows),
        "",
        f"## Mean reciprocal rank over the tasks by {metric} (the summary above; a configuration "
        "without a score in a task ranks last there)",
        "",
        *format_table(
            ["configuration", "MRR"],
            [[label, f"{mrr[label]:.3f}"] for label in sorted(mrr, key=lambda k: -mrr[k])],
        ),
        "",
    ]
    return summary, mrr, md


def write_task_report(
    sweep_dir: str, runs: Sequence[Run], metric: str | None = "accuracy"
) -> list[str]:
    """Writes ``report.md``, ``report.csv`` and one plot per task (see the module docstring)
    for the task runs ``runs`` found under ``sweep_dir`` (``metric`` None: accuracy); returns
    the paths (report.md first).

    Raises:
      ValueError: an unknown metric, or no task run.
    """
    import matplotlib

    matplotlib.use("Agg")
    metric = metric or "accuracy"
    if metric not in TASK_METRICS:
        raise ValueError(
            f"--metric must be one of {list(TASK_METRICS)} for task runs, got {metric!r}"
        )
    runs = [r for r in runs if kinds.get("task").owns_eval(r.eval)]
    if not runs:
        raise ValueError(
            f"no algorithmic-task run (data.source=synthetic:<task>) under {sweep_dir}"
        )
    if metric == "exact_match" and all(
        r.get("exact_match") is None for run in runs for r in run.eval["results"]
    ):
        raise ValueError("--metric exact_match: the runs were evaluated with eval.generate=False")
    tasks = list(dict.fromkeys(run.eval["task"] for run in runs))
    grouped = {task: group_runs([r for r in runs if r.eval["task"] == task]) for task in tasks}
    summary, mrr, summary_md = _summary_section(grouped, metric)
    sections, plots = [], []
    footnotes: dict = {}
    for task, tables in grouped.items():
        for train_len, columns in tables.items():
            key = task if len(tables) == 1 else f"{task} (L={train_len})"
            plot = f"{metric}_{key.replace(' ', '_').replace('(', '').replace(')', '')}.png"
            plot_task(
                os.path.join(sweep_dir, plot),
                columns,
                train_len,
                metric,
                f"{task}: {metric} against input length (trained on 1-{train_len})",
            )
            plots.append(plot)
            sections += [f"### {key}", ""]
            sections += markdown_table(columns, metric, footnotes, f" ({key})") + [""]
            sections += [f"![{key}]({plot})", ""]

    md = [f"# {os.path.basename(os.path.abspath(sweep_dir))}: {TASK_METRIC_TEXT[metric]}", ""]
    first = grouped[tasks[0]]  # one column per configuration
    md += describe(runs, [c for cols in first.values() for c in cols]) + [""]
    md += summary_md
    # The other paper's metric too, where the runs have it (Ruoss: accuracy; NoPE: exact match).
    other = {"accuracy": "exact_match", "exact_match": "accuracy"}.get(metric)
    if other and any(r.get(other) is not None for run in runs for r in run.eval["results"]):
        md += _summary_section(grouped, other)[2]
    md += ["## Per task and length", ""] + sections
    for label, note in footnotes.items():
        md.append(f"{note['number']}. {label}: {note['error']} (lengths {note['lengths']})")
    paths = [os.path.join(sweep_dir, "report.md"), os.path.join(sweep_dir, "report.csv")]
    with open(paths[0], "w") as f:
        f.write("\n".join(md) + "\n")
    with open(paths[1], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "configuration", f"{metric}_unseen_mean", "spread", "seeds", "mrr"])
        for key, row in summary.items():
            for label, (mean, spread, n) in row.items():
                w.writerow([key, label, mean, spread, n, mrr.get(label)])
    return paths + [os.path.join(sweep_dir, p) for p in plots]
