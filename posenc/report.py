"""Reports: the ``eval.json`` files of a sweep as the papers' tables, and plots.

:func:`write_report` gathers every evaluated run under a sweep directory (the points listed in
``sweep.json``, or every ``*/eval.json``, or the directory's own ``eval.json``) and writes:

- ``report.md``: per training length, a table with evaluation lengths as rows (first column
  ``L_valid``) and encoders as columns, laid out like ALiBi's Tables 2-3, preceded by what was
  measured (data set and its hash, model size, training length and steps, device). Several seeds
  of one configuration are one entry ``mean ± sample standard deviation``. A length an encoder
  cannot represent (a learned table shorter than the window) shows ``—`` with a footnote.
- ``report.csv``: the same tables, wide (``train_seq_len, L_valid``, one column per encoder, plus
  ``<encoder> spread`` and ``<encoder> n`` columns when some entry has several seeds; ``—`` cells
  are empty), full float precision.
- ``runs.csv``: one row per run and length (the raw numbers every table entry comes from, with
  the checkpoint step each run was scored at).
- ``<metric>_vs_length_L<train length>.png``: the metric against evaluation length (log x), one
  line per encoder, the training length marked.
- ``loss_by_position_L<train length>.png``: loss against position inside the window at the
  longest evaluation length (log-spaced buckets), one line per encoder.

A run evaluated before its training finished (``posenc eval`` on an interrupted run) is marked
``†`` in its column's name, with a note giving the step it was scored at. A perplexity that
overflowed is shown as ``inf``.

Columns are named by encoder; two configurations of one encoder in the same table (a sweep over
RoPE's base, say) get the config fields that tell them apart appended to the name.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.workdir import CONFIG_FILE, EVAL_FILE, SWEEP_FILE, flatten, read_json

METRICS = ("perplexity", "bits_per_byte", "loss")
DASH = "—"
_DIGITS = {"perplexity": 2, "bits_per_byte": 4, "loss": 4}
_METRIC_TEXT = {
    "perplexity": "perplexity (per token; tokens are bytes)",
    "bits_per_byte": "bits per byte",
    "loss": "loss (nats per token)",
}
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
        flat = flatten(fields)
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
    text = ", ".join(f"{k.removeprefix('encoding.hparams.')}={run.identity.get(k)}" for k in differ)
    return f"{run.encoding} ({text})"


def cell(column: Column, length: int, metric: str) -> Cell | None:
    """The entry of ``column`` at ``length`` (None: no run evaluated that length)."""
    values, error = [], None
    for run in column.runs:
        r = run.result(length)
        if r is None:
            continue
        if "error" in r:
            error = r["error"]
        else:
            values.append(float(r[metric]))
    if not values and error is None:
        return None
    return Cell(values, error)


def table_lengths(columns: Sequence[Column]) -> list[int]:
    return sorted({r["length"] for c in columns for run in c.runs for r in run.eval["results"]})


def _fmt(value: float, metric: str) -> str:
    return f"{value:.{_DIGITS[metric]}f}"


def _superscript(i: int) -> str:
    return str(i).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def markdown_table(
    columns: Sequence[Column], metric: str, footnotes: dict[str, dict[str, Any]], name: str = ""
) -> list[str]:
    """Rows of one markdown table. Errors get one footnote per column, collected in
    ``footnotes`` (``name`` + label -> number, lengths, first message)."""
    rows = []
    for length in table_lengths(columns):
        cells = []
        for column in columns:
            entry = cell(column, length, metric)
            if entry is None:
                cells.append("")
            elif entry.error:
                note = footnotes.setdefault(
                    f"{column.label}{name}",
                    {"number": len(footnotes) + 1, "lengths": [], "error": entry.error},
                )
                note["lengths"].append(length)
                cells.append(DASH + _superscript(note["number"]))
            elif entry.spread is not None:
                cells.append(f"{_fmt(entry.mean, metric)} ± {_fmt(entry.spread, metric)}")
            else:
                cells.append(_fmt(entry.mean, metric))
        rows.append([str(length), *cells])
    header = ["L_valid", *(c.label for c in columns)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    for row in rows:
        lines.append("| " + " | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) + " |")
    return lines


def _common(values: Sequence[Any]) -> Any:
    """The value if all are equal, else None."""
    return values[0] if values and all(v == values[0] for v in values) else None


def describe(runs: Sequence[Run], columns: Sequence[Column]) -> list[str]:
    """What was measured: data, model, training, evaluation and device."""
    evals = [r.eval for r in runs]
    lines = []
    data = [e["data"] for e in evals]
    split = _common([d.get("split") for d in data])
    for source in sorted({d["source"] for d in data}):
        d = next(x for x in data if x["source"] == source)
        split_info = d.get("splits", {}).get(d.get("split"), {})
        text = f"- Data: `{source}`"
        if d.get("content_sha256"):
            text += f", content sha256 `{d['content_sha256'][:16]}`"
        text += f"; scored split `{d.get('split')}`"
        if split_info.get("tokens"):
            text += f" ({split_info['tokens']:,} tokens"
            if split_info.get("stream_sha256"):
                text += f", stream sha256 `{split_info['stream_sha256'][:16]}`"
            text += ")"
        lines.append(text + ".")
    models = [{k: v for k, v in e["model"].items() if k != "num_params"} for e in evals]
    m = _common(models)
    if m:
        head_dim = m.get("head_dim") or m["model_dim"] // m["num_heads"]
        layers = f"{m['num_layers']} layer" + ("s" if m["num_layers"] != 1 else "")
        lines.append(
            f"- Model: {layers}, width {m['model_dim']}, {m['num_heads']} heads "
            f"(head dim {head_dim}), MLP {m['mlp_dim']}, {m['norm']}, {m['dtype']}."
        )
    else:
        lines.append("- Model: differs between runs (see each run's config.json).")
    params = []
    for c in columns:
        counts = sorted({r.eval["model"]["num_params"] for r in c.runs})
        params.append(f"{c.label} {'/'.join(f'{n:,}' for n in counts)}")
    lines.append("- Parameters: " + "; ".join(params) + ".")
    batch = _common([r.identity.get("train.batch_size") for r in runs])
    steps = _common([e["train_steps"] for e in evals])
    train_lens = sorted({e["train_seq_len"] for e in evals})
    text = f"- Training: L = {', '.join(map(str, train_lens))}"
    text += f", {steps:,} steps" if steps is not None else ", steps differ between runs"
    if batch:
        text += f" of {batch} windows"
    seeds = sorted({e["seed"] for e in evals})
    per_entry = sorted({len(c.runs) for c in columns})
    text += f"; seeds {', '.join(map(str, seeds))}"
    if max(per_entry) > 1:
        text += " (entries are mean ± sample standard deviation over seeds)"
    lines.append(text + ".")
    mode = _common([e["mode"] for e in evals])
    tokens = [r["tokens"] for e in evals for r in e["results"] if "tokens" in r]
    text = f"- Evaluation: {mode or 'mixed'} windows"
    if mode == "sliding":
        text += f" (stride {_common([e['stride'] for e in evals])})"
    if tokens:
        text += f", {min(tokens):,}-{max(tokens):,} tokens scored per length"
    lines.append(text + (f" of the {split} split." if split else "."))
    devices = sorted({e.get("device", "?") for e in evals})
    lines.append(f"- Device (evaluation): {', '.join(devices)}.")
    return lines


def _sweep_failures(sweep_dir: str) -> list[str]:
    sweep = read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if sweep is None:
        return []
    out = []
    for p in sweep["points"]:
        if p["status"] not in ("done", "skipped"):
            error = (p.get("error") or "").splitlines()[0][:300] if p.get("error") else ""
            out.append(f"- `{p['dir']}`: {p['status']}" + (f" ({error})" if error else ""))
    return out


def write_csv(path: str, tables: dict[int, list[Column]], metric: str) -> None:
    labels = list(dict.fromkeys(c.label for cols in tables.values() for c in cols))
    seeded = any(len(c.runs) > 1 for cols in tables.values() for c in cols)
    header = ["train_seq_len", "L_valid"]
    for label in labels:
        header += [label] + ([f"{label} spread", f"{label} n"] if seeded else [])
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for train_len, columns in tables.items():
            by_label = {c.label: c for c in columns}
            for length in table_lengths(columns):
                row: list[Any] = [train_len, length]
                for label in labels:
                    entry = cell(by_label[label], length, metric) if label in by_label else None
                    ok = entry is not None and entry.error is None
                    row.append(repr(entry.mean) if ok else "")
                    if seeded:
                        spread = entry.spread if ok else None
                        row += [repr(spread) if spread is not None else "", entry.n if ok else ""]
                writer.writerow(row)


def write_runs_csv(path: str, runs: Sequence[Run], sweep_dir: str) -> None:
    fields = ["loss", "perplexity", "bits_per_byte", "tokens", "windows", "seconds"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["dir", "encoding", "train_seq_len", "seed", "checkpoint_step", "train_steps"]
            + ["length", *fields, "error"]
        )
        for run in runs:
            step = run.eval.get("checkpoint_step")
            for r in run.eval["results"]:
                writer.writerow(
                    [os.path.relpath(run.dir, sweep_dir), run.encoding, run.train_len, run.seed]
                    + ["" if step is None else step, run.eval["train_steps"], r["length"]]
                    + [repr(r[k]) if k in r else "" for k in fields]
                    + [r.get("error", "")]
                )


def _colors(tables: dict[int, list[Column]]) -> dict[str, Any]:
    import matplotlib

    labels = list(dict.fromkeys(c.label for cols in tables.values() for c in cols))
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _mark_train_length(ax, train_len: int) -> None:
    """A dashed vertical line at the training length, labelled at the top of the axes."""
    ax.axvline(train_len, color="0.4", linestyle="--", linewidth=1)
    ax.text(
        train_len,
        1.0,
        f" train L={train_len}",
        transform=ax.get_xaxis_transform(),
        va="top",
        ha="left",
        fontsize=8,
        color="0.3",
    )


def plot_metric(path: str, columns: Sequence[Column], train_len: int, metric: str, colors) -> None:
    """The metric against evaluation length, one line per column."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    lengths = table_lengths(columns)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    ys = []
    for column in columns:
        xs, means, spreads = [], [], []
        for length in lengths:
            entry = cell(column, length, metric)
            if entry is not None and entry.error is None and math.isfinite(entry.mean):
                xs.append(length)
                means.append(entry.mean)
                spreads.append(entry.spread or 0.0)
        if not xs:
            continue
        ys += means
        ax.errorbar(
            xs,
            means,
            yerr=spreads if any(spreads) else None,
            marker="o",
            markersize=4,
            capsize=3,
            label=column.label,
            color=colors[column.label],
        )
    _mark_train_length(ax, train_len)
    if not ys:
        ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", va="center")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(x) for x in lengths])
    if ys and min(ys) > 0 and max(ys) / min(ys) > 4:
        ax.set_yscale("log")
    ax.set_xlabel("evaluation length L_valid (tokens, log scale)")
    ax.set_ylabel(_METRIC_TEXT[metric])
    ax.set_title(f"{metric} against evaluation length, trained at L = {train_len}")
    ax.grid(True, which="both", alpha=0.3)
    if ys:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def position_curve(column: Column, length: int) -> np.ndarray | None:
    """Mean over seeds of the loss at each position of a window of ``length`` (NaN: unscored)."""
    curves = []
    for run in column.runs:
        r = run.result(length)
        if r is None or "error" in r:
            return None
        curves.append([np.nan if x is None else x for x in r["loss_by_position"]])
    return np.mean(np.asarray(curves, np.float64), axis=0) if curves else None


def bucket(curve: np.ndarray, num_buckets: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Averages a per-position curve over log-spaced buckets of positions.

    Returns ``(x, y)``: the geometric centre of each bucket (1-based positions) and its mean;
    positions 1..4 keep a bucket each (the loss changes fastest there). Wider buckets further
    out average more tokens, so the curve is about equally smooth across the log axis.
    """
    length = len(curve)
    edges = np.unique(np.round(np.geomspace(1, length + 1, num_buckets + 1)).astype(int))
    edges = np.unique(np.concatenate([np.arange(1, min(6, length + 2)), edges]))
    xs, ys = [], []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):  # 1-based positions [lo, hi)
        values = curve[lo - 1 : hi - 1]
        values = values[np.isfinite(values)]
        if len(values):
            xs.append(math.sqrt(lo * (hi - 1)))
            ys.append(float(values.mean()))
    return np.asarray(xs), np.asarray(ys)


def plot_positions(path: str, columns: Sequence[Column], train_len: int, colors) -> int | None:
    """Loss by position inside the window at the table's longest length; returns that length."""
    import matplotlib.pyplot as plt

    lengths = table_lengths(columns)
    curves = {}
    for length in reversed(lengths):
        curves = {c.label: position_curve(c, length) for c in columns}
        curves = {k: v for k, v in curves.items() if v is not None}
        if curves:
            break
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8), layout="constrained")
    for label, curve in curves.items():
        x, y = bucket(curve)
        ax.plot(x, y, label=label, color=colors[label], linewidth=1.5)
    _mark_train_length(ax, train_len)
    ax.set_xscale("log")
    ax.set_xlabel("position inside the window (1 = first token, log scale)")
    ax.set_ylabel("loss (nats), mean over log-spaced position buckets")
    missing = [c.label for c in columns if c.label not in curves]
    title = f"loss by position, windows of {length} tokens (trained at L = {train_len})"
    if missing:
        title += f"\nnot shown (cannot evaluate {length}): {', '.join(missing)}"
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return length


def _unfinished_notes(columns: Sequence[Column], sweep_dir: str) -> list[str]:
    """One line per run scored before its training finished (the ``†`` columns)."""
    lines = []
    for column in columns:
        for run in column.unfinished:
            step = run.eval.get("checkpoint_step")
            lines.append(
                f"† {column.label.removesuffix(' †')}: `{os.path.relpath(run.dir, sweep_dir)}` "
                f"was scored at step {step} of {run.eval['train_steps']} (training unfinished)."
            )
    return lines


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
    md = [f"## Trained at L = {train_len}: {_METRIC_TEXT[metric]}", ""]
    name = f" (trained at L = {train_len})" if several else ""
    md += markdown_table(columns, metric, footnotes, name) + [""]
    md += _unfinished_notes(columns, sweep_dir)
    plots = [f"{metric}_vs_length_L{train_len}.png"]
    plot_metric(os.path.join(sweep_dir, plots[0]), columns, train_len, metric, colors)
    md.append(f"![{metric} against evaluation length]({plots[0]})")
    name = f"loss_by_position_L{train_len}.png"
    longest = plot_positions(os.path.join(sweep_dir, name), columns, train_len, colors)
    if longest is not None:
        plots.append(name)
        md.append(f"![loss by position at L_valid = {longest}]({name})")
    return md + [""], plots


def _footnote_lines(footnotes: dict[str, dict[str, Any]]) -> list[str]:
    md = []
    for label, note in footnotes.items():
        lengths = ", ".join(map(str, sorted(set(note["lengths"]))))
        md.append(
            f"{DASH}{_superscript(note['number'])} {label} cannot be evaluated at L_valid = "
            f"{lengths}: {note['error']}"
        )
        md.append("")
    return md


def write_report(sweep_dir: str, metric: str = "perplexity") -> list[str]:
    """Writes the tables and plots of ``sweep_dir`` (see the module docstring).

    Args:
      sweep_dir: a directory written by ``posenc sweep`` (or any folder of work directories,
        or one work directory).
      metric: ``perplexity``, ``bits_per_byte`` or ``loss``.

    Returns:
      The paths written (report.md first).

    Raises:
      ValueError: an unknown metric.
      FileNotFoundError: no ``eval.json`` under ``sweep_dir``.
    """
    import matplotlib

    matplotlib.use("Agg")
    if metric not in METRICS:
        raise ValueError(f"--metric must be one of {list(METRICS)}, got {metric!r}")
    runs = find_runs(sweep_dir)
    if not runs:
        raise FileNotFoundError(
            f"no {EVAL_FILE} under {sweep_dir}; run `posenc sweep` (or `posenc train`) first"
        )
    tables = group_runs(runs)
    colors = _colors(tables)
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
    md += _footnote_lines(footnotes)
    failures = _sweep_failures(sweep_dir)
    if failures:
        md += ["Points without results:", ""] + failures + [""]
    paths = [os.path.join(sweep_dir, n) for n in ("report.md", "report.csv", "runs.csv")]
    with open(paths[0], "w") as f:
        f.write("\n".join(md))
    write_csv(paths[1], tables, metric)
    write_runs_csv(paths[2], runs, sweep_dir)
    return paths + [os.path.join(sweep_dir, p) for p in plots]
