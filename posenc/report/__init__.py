"""Reports: the evaluations of a sweep as the papers' tables, and plots.

:func:`write_report` gathers every evaluation of every run under a sweep directory (the points
listed in ``sweep.json``, or every evaluated subdirectory, or the directory itself): each
``eval.json`` and each ``eval-<changes>.json`` (:mod:`posenc.report.runs`), and writes:

- ``report.md``: per training length, a table with evaluation lengths as rows (first column
  ``L_valid``) and encoders as columns, laid out like ALiBi's Tables 2-3, preceded by what was
  measured (data set and its hash, model size, training length and steps, device). Several seeds
  of one configuration are one entry ``mean ± sample standard deviation``. A length an encoder
  cannot represent (a learned table shorter than the window) shows ``—`` with a footnote.
- ``report.csv``: the same tables, wide (``train_seq_len, L_valid``, one column per encoder, plus
  ``<encoder> spread`` and ``<encoder> n`` columns when some entry has several seeds; ``—`` cells
  are empty), full float precision.
- ``runs.csv``: one row per evaluation and length (the raw numbers every table entry comes from,
  with the file each came from, the evaluation's changes and the checkpoint step scored).
- ``<metric>_vs_length_L<train length>.png``: the metric against evaluation length (log x), one
  line per encoder, the training length marked.
- ``loss_by_position_L<train length>.png``: loss against position inside the window at the
  longest evaluation length (log-spaced buckets), one line per encoder.
- a retrieval section (``posenc retrieval`` records: passkey and needle-in-a-haystack accuracy by
  length, effective lengths, ``retrieval_vs_length.png`` across runs and each run's heat map by
  length x depth, :mod:`posenc.report.retrieval`);
- a harness section (``posenc harness`` results kept under each run's ``harness/`` folder:
  each lm-evaluation-harness task's metric per run, :mod:`posenc.report.harness`);
- an attention section for models whose layers differ (``posenc analyze`` records of a pattern
  of layer kinds: attention entropy and far weight per kind by length,
  :mod:`posenc.report.attention`).

A run evaluated before its training finished (``posenc eval`` on an interrupted run) is marked
``†`` in its column's name, with a note giving the step it was scored at. A perplexity that
overflowed is shown as ``inf``. Every table starts with a row ``n`` (runs per column) and the
evidence flags of :mod:`posenc.report.evidence` follow it: runs still learning at their last
step (``‡``, by a stated rule), lengths scored on few windows, tokens ``eval.max_tokens`` left
unscored; the plots caption their error bars.

The tables above are the common ones, of the language-model runs (causal and masked LM). Each
run belongs to the first run kind (:mod:`posenc.kinds`) that owns its evaluation report
(:meth:`~posenc.kinds.base.RunKind.owns_eval`); a kind may write a report of its own
(:attr:`~posenc.kinds.base.RunKind.report_writer`): a folder holding translation runs is
reported as translation runs (:mod:`posenc.report.translation`), one holding classification
runs as classification runs (:mod:`posenc.report.classify`: the GLUE metrics at the training
length, and by example length), one holding algorithmic-task runs as task runs
(:mod:`posenc.report.tasks`); with several such kinds, the one of the lowest
:attr:`~posenc.kinds.base.RunKind.report_precedence`. Language-model runs beside them (a sweep
mixing translation and LM points) follow in ``report.md`` as a section of their own, their
tables in ``report-lm.csv`` and ``runs-lm.csv``, where the kind has them
(:attr:`~posenc.kinds.base.RunKind.report_lm_beside`; not beside task runs). Runs a report
leaves out are named in a warning and at the end of ``report.md``.

Columns are named by encoder; two configurations of one encoder in the same table (a sweep over
RoPE's base, say) get the config fields that tell them apart appended to the name, and an
evaluation under changed settings what it changed (``rope (yarn x8)``). A model with a pattern of
layer kinds is named by its pattern (``3 x [rope, sliding:32] + [nope]``) rather than by its
``layers.*`` fields.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from posenc.kinds.base import RunKind
from posenc.kinds.registry import kinds
from posenc.report import evidence
from posenc.report.attention import attention_section
from posenc.report.harness import harness_section
from posenc.report.plots import bucket, line_colors, plot_metric, plot_positions, position_curve
from posenc.report.retrieval import retrieval_section
from posenc.report.runs import METRICS, Cell, Column, Run, cell, find_runs, group_runs
from posenc.report.tables import (
    DASH,
    describe,
    footnote_lines,
    markdown_table,
    metric_heading,
    superseded_notes,
    sweep_failures,
    unfinished_notes,
    write_csv,
    write_runs_csv,
)
from posenc.workdir import EVAL_FILE, EVAL_PREFIX

__all__ = [
    "sweep_and_report",
    "DASH",
    "METRICS",
    "Cell",
    "Column",
    "ReportWarning",
    "Run",
    "bucket",
    "cell",
    "describe",
    "find_runs",
    "group_runs",
    "markdown_table",
    "plot_metric",
    "plot_positions",
    "position_curve",
    "write_csv",
    "write_report",
    "write_runs_csv",
]


def _table_section(
    sweep_dir: str,
    train_len: int,
    columns: list[Column],
    metric: str,
    footnotes: dict[str, dict[str, Any]],
    colors: dict[str, Any],
    several: bool,
) -> tuple[list[str], list[str]]:
    """The markdown of one training length (table, plots, notes) and the plot files written."""
    heading = metric_heading(metric, [r for c in columns for r in c.runs])
    md = [f"## Trained at L = {train_len}: {heading}", ""]
    name = f" (trained at L = {train_len})" if several else ""
    md += markdown_table(columns, metric, footnotes, name) + [""]
    notes = unfinished_notes(columns, sweep_dir) + evidence.unconverged_notes(columns, sweep_dir)
    notes += evidence.few_window_notes(columns)
    md += [line for note in notes for line in (note, "")]
    plots = [f"{metric}_vs_length_L{train_len}.png"]
    plot_metric(os.path.join(sweep_dir, plots[0]), columns, train_len, metric, colors)
    md.append(f"![{metric} against evaluation length]({plots[0]})")
    md += ["", f"*{evidence.ERROR_BARS}*", ""]
    name = f"loss_by_position_L{train_len}.png"
    longest = plot_positions(os.path.join(sweep_dir, name), columns, train_len, colors)
    if longest is not None:
        plots.append(name)
        md.append(f"![loss by position at L_valid = {longest}]({name})")
        md += ["", "*Loss by position: the mean over each column's runs, no spread shown.*"]
    return md + [""], plots


# The metric ``posenc report`` asks for unless told: a kind with a report of its own then tables
# its own default (its writer is given None).
DEFAULT_METRIC = "perplexity"


def write_report(sweep_dir: str, metric: str = DEFAULT_METRIC) -> list[str]:
    """Writes the tables and plots of ``sweep_dir`` (see the module docstring), and the
    retrieval section (:mod:`posenc.report.retrieval`) where runs have ``posenc retrieval``
    records, the harness section (:mod:`posenc.report.harness`) where runs have ``posenc
    harness`` results and the attention section (:mod:`posenc.report.attention`) where models with a
    pattern of layer kinds have ``posenc analyze`` records; a folder with such records only
    gets those sections alone.

    Returns:
      The paths written (report.md first).
    """
    section, files = retrieval_section(sweep_dir)
    attention = attention_section(sweep_dir)
    harness = harness_section(sweep_dir)
    parts = (("retrieval", section), ("attention", attention), ("harness", harness))
    what = " and ".join(n for n, part in parts if part)
    section += attention + harness
    try:
        paths = _write_report(sweep_dir, metric)
    except FileNotFoundError:
        if not section:
            raise
        paths = [os.path.join(sweep_dir, "report.md")]
        title = f"# {os.path.basename(os.path.abspath(sweep_dir))}: {what}"
        with open(paths[0], "w") as f:
            f.write(title + "\n\n")
    if section:
        with open(paths[0], "a") as f:
            f.write("\n" + "\n".join(section) + "\n")
    return paths + [os.path.join(sweep_dir, name) for name in files]


def _write_report(sweep_dir: str, metric: str = DEFAULT_METRIC) -> list[str]:
    """Writes the tables and plots of ``sweep_dir`` (see the module docstring).

    Args:
      sweep_dir: a directory written by ``posenc sweep`` (or any folder of work directories,
        or one work directory).
      metric: one of the common tables' (``perplexity``, ``bits_per_byte``, ``loss``;
        ``accuracy`` of masked-LM runs, ``train.objective = "masked_lm"``: the share of masked
        tokens predicted), or one a run kind's report offers
        (:attr:`~posenc.kinds.base.RunKind.report_metrics`: algorithmic tasks get
        :func:`posenc.report.tasks.write_task_report` instead, with ``accuracy`` (the default
        for them), ``exact_match``, ``sequence_accuracy`` or ``loss``).

    Returns:
      The paths written (report.md first).

    Raises:
      ValueError: an unknown metric, or one no run has (``accuracy`` without a masked-LM
        run, ``exact_match`` without a task run, ...).
      FileNotFoundError: no ``eval.json`` under ``sweep_dir``.
    """
    import matplotlib

    matplotlib.use("Agg")
    # The metrics every report knows, the most general kind's (asked last) first.
    offered = tuple(m for k in reversed(kinds()) for m in k.report_metrics)
    known = tuple(dict.fromkeys(METRICS + offered))
    if metric not in known:
        raise ValueError(f"--metric must be one of {list(known)}, got {metric!r}")
    runs = find_runs(sweep_dir)
    if not runs:
        raise FileNotFoundError(
            f"no evaluation ({EVAL_FILE} or {EVAL_PREFIX}*.json) under {sweep_dir}; run "
            "`posenc sweep` (or `posenc train`, `posenc eval`) first"
        )
    owners = [_owner(r) for r in runs]
    writers = [k for k in kinds() if k.report_writer is not None and k in owners]
    if writers:  # a report of the kind's own (BLEU by source length, GLUE metrics, ...)
        kind = min(writers, key=lambda k: k.report_precedence)
        chosen = [r for r, k in zip(runs, owners, strict=True) if k is kind]
        others = [r for r, k in zip(runs, owners, strict=True) if k is not kind]
        paths = _writer(kind)(sweep_dir, chosen, None if metric == DEFAULT_METRIC else metric)
        what = kind.report_runs or kind.name
        if kind.report_lm_beside:
            return paths + _with_text_runs(paths[0], sweep_dir, others, metric, what)
        _name_left_out(paths[0], sweep_dir, others, what)
        return paths
    md, paths = _text_report(sweep_dir, runs, metric)
    paths.insert(0, os.path.join(sweep_dir, "report.md"))
    with open(paths[0], "w") as f:
        f.write("\n".join(md))
    return paths


def _owner(run: Run) -> RunKind | None:
    """The run's kind: the first (in :attr:`~posenc.kinds.base.RunKind.precedence` order) that
    owns its evaluation report; None: no registered kind does (its tables are the common
    ones)."""
    return next((k for k in kinds() if k.owns_eval(run.eval)), None)


def _writer(kind: RunKind) -> Callable[[str, list[Run], str | None], list[str]]:
    """The function :attr:`~posenc.kinds.base.RunKind.report_writer` names
    (``"module:function"``), imported."""
    module, _, name = kind.report_writer.partition(":")
    return getattr(importlib.import_module(module), name)


def _is_text_run(run: Run) -> bool:
    """A run tabled in the common tables by window length (a language model's)."""
    owner = _owner(run)
    return owner is None or owner.report_writer is None


def _with_text_runs(
    report_md: str, sweep_dir: str, others: Sequence[Run], metric: str, kind: str
) -> list[str]:
    """Appends to ``report_md`` the section of the language-model runs among ``others`` (the
    runs a kind's own report does not cover), writing its tables as ``report-lm.csv`` and
    ``runs-lm.csv``, and names the rest as left out (``kind``: what the report's runs are
    called); returns the files written. ``metric`` is the LM tables' when the LM runs have it,
    else perplexity."""
    text = [r for r in others if _is_text_run(r)]
    _name_left_out(report_md, sweep_dir, [r for r in others if not _is_text_run(r)], kind)
    if not text:
        return []
    have = {m for run in text for r in run.eval["results"] for m in METRICS if m in r}
    md, paths = _text_report(
        sweep_dir, text, metric if metric in have else DEFAULT_METRIC, suffix="-lm"
    )
    md[0] = f"# Language-model runs: {md[0].split(': ', 1)[-1]}"
    with open(report_md, "a") as f:
        f.write("\n\n" + "\n".join(md))
    return paths


def _text_report(
    sweep_dir: str, runs: Sequence[Run], metric: str, suffix: str = ""
) -> tuple[list[str], list[str]]:
    """The markdown of language-model runs' tables (title first) and the files written:
    ``report<suffix>.csv``, ``runs<suffix>.csv`` and the plots."""
    reports = [r.eval for r in runs]
    for kind in kinds():  # a kind that says better why its metric is missing
        refusal = kind.report_refusal(metric, reports, sweep_dir)
        if refusal:
            raise ValueError(refusal)
    have = sorted({m for run in runs for r in run.eval["results"] for m in METRICS if m in r})
    if metric not in have:  # a metric of other kinds' runs only
        whose = "; ".join(
            f"{' and '.join(k.report_own_metrics)}: {k.report_runs or k.name} runs"
            for k in kinds()
            if k.report_own_metrics
        )
        raise ValueError(
            f"--metric {metric}: no run under {sweep_dir} has it ({whose}); these runs have "
            f"{', '.join(have)}"
        )
    tables = group_runs(runs)
    colors = line_colors(tables)
    all_columns = [c for cols in tables.values() for c in cols]
    md = [f"# {os.path.basename(os.path.abspath(sweep_dir))}: {metric} by evaluation length", ""]
    md += describe(runs, all_columns) + [""]
    footnotes: dict[str, dict[str, Any]] = {}
    plots = []
    for train_len, columns in tables.items():
        section, written = _table_section(
            sweep_dir, train_len, columns, metric, footnotes, colors, len(tables) > 1
        )
        md += section
        plots += written
    md += footnote_lines(footnotes)
    md += superseded_notes(runs, sweep_dir)
    failures = sweep_failures(sweep_dir)
    if failures:
        md += ["Points without results:", ""] + failures + [""]
    paths = [os.path.join(sweep_dir, f"{n}{suffix}.csv") for n in ("report", "runs")]
    write_csv(paths[0], tables, metric)
    write_runs_csv(paths[1], runs, sweep_dir)
    return md, paths + [os.path.join(sweep_dir, p) for p in plots]


class ReportWarning(UserWarning):
    """Runs under a report's directory were left out of it (the message says which and why)."""


def _name_left_out(report_md: str, sweep_dir: str, runs: Sequence[Run], kind: str) -> None:
    """Says in a warning and at the end of ``report.md`` which runs a kind's own report (of
    ``kind`` runs) left out: a report covers one kind of run (task runs: accuracy per input
    length; translation runs: BLEU; text runs: perplexity per window length)."""
    if not runs:
        return
    names = ", ".join(os.path.relpath(r.dir, sweep_dir) for r in runs)
    note = (
        f"{len(runs)} other run{'s' * (len(runs) > 1)} left out ({names}): this report covers "
        f"{kind} runs, which a report does not mix with others; report the rest from a folder "
        "of their own"
    )
    with open(report_md, "a") as f:
        f.write(f"\n{note}.\n")
    warnings.warn(note, ReportWarning, stacklevel=3)


def sweep_and_report(
    config_spec: str,
    workdir: str,
    *,
    overrides: Sequence[str] = (),
    jobs: int = 1,
    metric: str = DEFAULT_METRIC,
    compile_cache: str | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Runs a sweep (skipping finished points, resuming interrupted ones) and writes its report:
    what a reproduction script does. Returns the sweep's points and the report's paths.
    ``compile_cache``: as :func:`posenc.runs.sweep.run_sweep`'s."""
    from posenc.runs.sweep import run_sweep

    points = run_sweep(
        config_spec, workdir, overrides=overrides, jobs=jobs, compile_cache=compile_cache
    )
    return points, write_report(workdir, metric=metric)
