"""Reports of classification runs (``model.assembly = "classifier"``), laid out like RoFormer's
GLUE table (Table 2) and its long-document table (Table 5).

:func:`write_classify_report` writes ``report.md`` with

- **the task table**: one row per configuration (encoder, and the fields that tell
  configurations apart, e.g. ``train.init_from``), with the split's metrics at the training
  length (accuracy, F1, Matthews correlation; Pearson, Spearman for a regression) and the loss;
  several seeds are ``mean ± sample standard deviation``;
- **by example length**, per training length: rows are length buckets (within it, 1x-2x,
  2x-4x, examples read whole), columns configurations, the task's headline metric (or
  ``--metric``); ``—`` where an encoder cannot read the length (a learned table); and a plot
  ``<metric>_by_length_L<n>.png``.

``report.csv`` holds the task table with full precision; ``runs.csv`` every run's bucket rows.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence

from posenc.kinds.classification_metrics import CLASSIFICATION_METRICS, REGRESSION_METRICS
from posenc.report.runs import Column, Run, group_runs
from posenc.report.tables import describe, format_table, write_runs_csv
from posenc.report.translation import bucket_table, plot_buckets, write_overall_csv

CLASSIFY_METRICS = tuple(dict.fromkeys((*CLASSIFICATION_METRICS, *REGRESSION_METRICS)))


def _stat(values: Sequence[float], scale: float) -> str:
    if not values:
        return "—"
    mean = math.fsum(values) / len(values) * scale
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {statistics.stdev(values) * scale:.2f}"


def _overall(column: Column, key: str) -> list[float]:
    values = [(run.eval.get("overall") or {}).get(key) for run in column.runs]
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def _metrics_of(runs: Sequence[Run]) -> list[str]:
    have = {k for r in runs for k in (r.eval.get("overall") or {})}
    return [m for m in CLASSIFY_METRICS if m in have]


def task_table(columns: Sequence[Column], metrics: Sequence[str]) -> list[list[str]]:
    """Rows of the task table (metrics x 100, as GLUE tables print them; the loss as is)."""
    rows = [["configuration", "n", *(f"{m} (x100)" for m in metrics), "loss", "examples"]]
    for column in columns:
        entries = [_stat(_overall(column, m), 100.0) for m in metrics]
        examples = sorted({int(r.eval["overall"]["examples"]) for r in column.runs})
        rows.append(
            [
                column.label,
                str(len(column.runs)),
                *entries,
                _stat(_overall(column, "loss"), 1.0),
                ", ".join(map(str, examples)),
            ]
        )
    return rows


def _describe(runs: Sequence[Run], columns: Sequence[Column]) -> list[str]:
    lines = [
        line
        for line in describe(runs, columns)
        if not line.startswith(("- Training:", "- Evaluation:"))
    ]
    first = runs[0].eval
    classes = first.get("classes")
    kind = "a regression" if classes is None else f"{len(classes)} classes {classes}"
    steps = sorted({r.eval.get("train_steps") for r in runs})
    seeds = sorted({r.seed for r in runs})
    lengths = sorted({r.train_len for r in runs})
    lines.append(
        f"- Training: {kind}, rows of at most {', '.join(map(str, lengths))} tokens, "
        f"{', '.join(map(str, steps))} steps; seeds {', '.join(map(str, seeds))}."
    )
    lines.append(
        f"- Evaluation: the {first.get('split')} split; the task table truncates each example to "
        "the training length (as training does), the length table reads each example whole in "
        "the bucket of its length."
    )
    return lines


def write_classify_report(sweep_dir: str, runs: Sequence[Run], metric: str | None) -> list[str]:
    """Writes the classification report of ``runs`` under ``sweep_dir`` (module docstring);
    ``metric`` (None: the runs' headline metric) is the one tabled by length. Returns the paths
    written, ``report.md`` first."""
    have = _metrics_of(runs)
    metric = metric or runs[0].eval.get("metric", "accuracy")
    if metric not in have:
        raise ValueError(f"--metric {metric}: these classification runs have {', '.join(have)}")
    tables = group_runs(runs)
    all_columns = [c for cols in tables.values() for c in cols]
    name = os.path.basename(os.path.abspath(sweep_dir))
    md = [f"# {name}: classification ({runs[0].eval.get('data', {}).get('source')})", ""]
    md += _describe(runs, all_columns) + [""]
    md += ["## At the training length", ""]
    rows = task_table(all_columns, have)
    md += format_table(rows[0], rows[1:]) + [""]
    plots = []
    for train_len, columns in tables.items():
        md += [f"## By example length, trained at {train_len} tokens: {metric}", ""]
        rows = bucket_table(columns, metric)
        rows[0][0] = "example length"
        md += format_table(rows[0], rows[1:]) + [""]
        plot = f"{metric}_by_length_L{train_len}.png"
        plot_buckets(
            os.path.join(sweep_dir, plot),
            columns,
            metric,
            lambda column, length, n=train_len: length / n,
            "example length bucket (upper bound, multiples of the training length)",
            metric,
        )
        plots.append(plot)
        md += [f"![{metric} by example length]({plot})", ""]
        md += ["*Error bars: sample standard deviation over seeds (none for n = 1).*", ""]
    paths = [os.path.join(sweep_dir, n) for n in ("report.md", "report.csv", "runs.csv")]
    with open(paths[0], "w") as f:
        f.write("\n".join(md))
    write_overall_csv(paths[1], all_columns, (*have, "loss"), _overall)
    write_runs_csv(paths[2], runs, sweep_dir)
    return paths + [os.path.join(sweep_dir, p) for p in plots]
