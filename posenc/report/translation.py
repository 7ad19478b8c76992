"""Reports of translation runs (``model.assembly = "encoder_decoder"``), laid out like the
founding papers' tables.

:func:`write_translation_report` writes ``report.md`` with

- **the BLEU table** (Vaswani et al.'s Table 3, Shaw et al.'s Tables 2-3): one row per
  configuration (encoder, and the fields that tell configurations apart: Shaw's clipping
  distance, keys or values only, ...), with sacreBLEU's BLEU (13a, and the ``intl`` tokenisation
  comparable with the papers' tokenised BLEU), chrF, the output/reference length ratio and the
  teacher-forced loss of the evaluated split; several seeds are ``mean ± sample standard
  deviation`` with ``(n=k)``; the signatures say which BLEU is which;
- **BLEU by source length** (train short, test long for sequence-to-sequence: Neishi &
  Yoshinaga 2019, Rosendahl et al. 2019): per training source length, rows are source-length
  buckets (within it, 1x-2x, 2x-4x, ...) and columns configurations; the length ratio per bucket
  beside it (truncated outputs fall below 1, runaway ones above); and a plot
  ``bleu_by_source_length_L<n>.png``.

Runs scored on different data (source, languages, content) get a section each, ``## Data:
...``, with these tables: their numbers are not comparable; ``report.csv``'s rows then name the
data. A bucket's label says how many sentences it holds.

``report.csv`` holds the BLEU table with full precision; ``runs.csv`` every run's bucket rows.
"""

from __future__ import annotations

import csv
import math
import os
import statistics
from collections.abc import Callable, Sequence

from posenc.kinds.translation import Translation
from posenc.report.runs import Column, Run, cell, group_runs, table_lengths
from posenc.report.tables import describe, format_table, write_runs_csv

TRANSLATION_METRICS = Translation.report_metrics
_METRIC_TEXT = {
    "bleu": "BLEU (sacreBLEU, 13a)",
    "bleu_intl": "BLEU (intl tokenisation)",
    "chrf": "chrF",
    "length_ratio": "length ratio (output / reference)",
}


def _stat(values: Sequence[float]) -> str:
    if not values:
        return "—"
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}"


def _overall(column: Column, key: str) -> list[float]:
    """The column's runs' corpus-level ``key`` (``bleu``, ... or ``loss``), one per seed."""
    out = []
    for run in column.runs:
        source = run.eval.get("teacher_forced", {}) if key == "loss" else run.eval.get("overall")
        value = (source or {}).get(key)
        if value is not None:
            out.append(float(value))
    return out


def bleu_table(columns: Sequence[Column]) -> list[list[str]]:
    """Rows of the BLEU table: header, ``n`` per configuration, then one row per
    configuration."""
    header = ["configuration", "n", *(_METRIC_TEXT[m] for m in TRANSLATION_METRICS), "loss"]
    rows = [header]
    for column in columns:
        entries = [_stat(_overall(column, m)) for m in (*TRANSLATION_METRICS, "loss")]
        rows.append([column.label, str(len(column.runs)), *entries])
    return rows


def bucket_table(
    columns: Sequence[Column], metric: str, count: str | None = None
) -> list[list[str]]:
    """Rows of a by-source-length table: header, ``n`` (runs per column), then one row per
    bucket; with ``count`` (``"sentences"``) a bucket's label also says how many items it holds
    (``<=1x (<= 64), 412 sentences``; "differ" where the runs disagree)."""
    lengths = table_lengths(columns)
    labels = {}
    counts: dict[int, set] = {}
    for column in columns:
        for run in column.runs:
            for r in run.eval["results"]:
                labels[r["length"]] = f"{r['label']} (<= {r['length']})"
                if count is not None:
                    counts.setdefault(r["length"], set()).add(r.get(count))
    for length, seen in counts.items():
        if len(seen) == 1 and None not in seen:
            labels[length] += f", {seen.pop():,} {count}"
        else:  # runs that scored other numbers of sentences (eval.max_sentences)
            labels[length] += f", {count} differ between runs"
    rows = [["source length", *(c.label for c in columns)]]
    rows.append(["n", *(str(len(c.runs)) for c in columns)])
    for length in lengths:
        row = [labels[length]]
        for column in columns:
            entry = cell(column, length, metric)
            row.append("—" if entry is None or entry.mean is None else _stat(entry.values))
        rows.append(row)
    return rows


def _plot(path: str, columns: Sequence[Column], metric: str) -> None:
    def multiple(column: Column, length: int) -> float:
        return next(
            r["max_multiple"]
            for run in column.runs
            for r in run.eval["results"]
            if r["length"] == length
        )

    plot_buckets(
        path,
        columns,
        metric,
        multiple,
        "source length bucket (upper bound, multiples of the training length)",
        _METRIC_TEXT[metric],
    )


def plot_buckets(
    path: str,
    columns: Sequence[Column],
    metric: str,
    x_of: Callable[[Column, int], float],
    xlabel: str,
    ylabel: str,
) -> None:
    """``metric`` per length bucket, one line per column with error bars over seeds; the x of a
    bucket (upper bound ``length``) is ``x_of(column, length)``, a multiple of the training
    length (log scale, the training length marked)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for column in columns:
        xs, ys, errs = [], [], []
        for length in table_lengths([column]):
            entry = cell(column, length, metric)
            if entry is None or entry.mean is None:
                continue
            xs.append(x_of(column, length))
            ys.append(entry.mean)
            errs.append(entry.spread or 0.0)
        ax.errorbar(
            xs, ys, yerr=errs, marker="o", capsize=3, label=f"{column.label} (n={len(column.runs)})"
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.axvline(1, color="grey", linestyle=":", linewidth=1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _describe(runs: Sequence[Run], columns: Sequence[Column]) -> list[str]:
    """What was measured, as :func:`posenc.report.tables.describe` says it, with a translation
    run's training and evaluation instead of windows."""
    lines = [
        line
        for line in describe(runs, columns)
        if not line.startswith(("- Training:", "- Evaluation:"))
    ]
    first = runs[0].eval
    model = first.get("model", {})
    enc_layers = model.get("num_encoder_layers") or model.get("num_layers")
    data_lines = sum(line.startswith("- Data:") for line in lines)
    lines.insert(
        data_lines,
        f"- Encoder-decoder: {enc_layers} encoder and {model.get('num_layers')} decoder "
        f"layers; vocabulary {first.get('vocab', {}).get('kind')} "
        f"({first.get('vocab', {}).get('vocab_size')} ids).",
    )
    bounds = sorted({r.train_len for r in runs})
    steps = sorted({r.eval.get("train_steps") for r in runs})
    seeds = sorted({r.seed for r in runs})
    lines.append(
        f"- Training: sources of at most {', '.join(map(str, bounds))} tokens, "
        f"{', '.join(map(str, steps))} steps; seeds {', '.join(map(str, seeds))}."
    )
    sentences = sorted({r.eval.get("sentences") for r in runs})
    lines.append(
        f"- Evaluation: {', '.join(map(str, sentences))} sentences of the "
        f"{first.get('split')} split, beam search (below); BLEU per source-length bucket."
    )
    return lines


def _split(rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    return rows[0], rows[1:]


def _decoding_text(d: dict) -> str:
    return (
        f"beam {d.get('beam_size')}, alpha {d.get('alpha')}, outputs up to the source length "
        f"+ {d.get('max_len_offset')}"
    )


def data_sets(runs: Sequence[Run]) -> dict[tuple, list[Run]]:
    """The runs by the data they were scored on: source spec, languages and content hash (the
    same spec read from another data directory is another data set), in the runs' order."""
    out: dict[tuple, list[Run]] = {}
    for run in runs:
        d = run.eval.get("data") or {}
        key = (d.get("source"), d.get("src_lang"), d.get("tgt_lang"), d.get("content_sha256"))
        out.setdefault(key, []).append(run)
    return out


def _data_names(keys: Sequence[tuple]) -> dict[tuple, tuple[str, str]]:
    """Each data set's heading (``parallel:default` (en → de)``) and its short name for the
    CSV's rows (``parallel:default en-de``); the content hash where a source and its languages
    are not enough to tell two apart."""
    names = {}
    for key in keys:
        source, src, tgt, sha = key
        details = [f"{src} → {tgt}"] if src or tgt else []
        short = f"{source} {src}-{tgt}" if src or tgt else str(source)
        if sum(k[:3] == key[:3] for k in keys) > 1:
            details.append(f"sha256 {str(sha)[:12]}")
            short += f" sha256 {str(sha)[:12]}"
        names[key] = (f"`{source}`" + (f" ({', '.join(details)})" if details else ""), short)
    return names


def write_translation_report(
    sweep_dir: str, runs: Sequence[Run], metric: str | None = "bleu"
) -> list[str]:
    """Writes the translation report of ``runs`` under ``sweep_dir`` (module docstring);
    ``metric`` (None: BLEU) is the one tabled and plotted by source length. Runs scored on
    different data get a section each (``## Data: ...``): their numbers are not comparable.
    Returns the paths written, ``report.md`` first."""
    metric = metric or "bleu"
    if metric not in TRANSLATION_METRICS:
        raise ValueError(
            f"--metric {metric}: translation runs have {', '.join(TRANSLATION_METRICS)}"
        )
    by_data = data_sets(runs)
    names = _data_names(list(by_data))
    several = len(by_data) > 1
    name = os.path.basename(os.path.abspath(sweep_dir))
    md = [f"# {name}: translation", ""]
    # The columns as report.csv and the parameter counts name them: with the data's short
    # name when there are several data sets (the same encoder is then a column of each).
    named = [
        Column(f"{c.label} [{names[key][1]}]" if several else c.label, c.runs)
        for key, data_runs in by_data.items()
        for c in _all_columns(data_runs)
    ]
    md += _describe(runs, named) + [""]
    plots = []
    for k, (key, data_runs) in enumerate(by_data.items()):
        heading = names[key][0]
        suffix = f"_data{k + 1}" if several else ""
        level = "###" if several else "##"
        if several:
            md += [f"## Data: {heading}", ""]
        section, written = _data_section(sweep_dir, data_runs, metric, level, suffix)
        md += section
        plots += written
    paths = [os.path.join(sweep_dir, n) for n in ("report.md", "report.csv", "runs.csv")]
    with open(paths[0], "w") as f:
        f.write("\n".join(md))
    _write_csv(paths[1], named)
    write_runs_csv(paths[2], runs, sweep_dir)
    return paths + [os.path.join(sweep_dir, p) for p in plots]


def _all_columns(runs: Sequence[Run]) -> list[Column]:
    return [c for cols in group_runs(runs).values() for c in cols]


def _data_section(
    sweep_dir: str, runs: Sequence[Run], metric: str, level: str, suffix: str
) -> tuple[list[str], list[str]]:
    """The BLEU table and the tables by source length of runs on one data set: the markdown
    and the plots written (``suffix`` in their names)."""
    tables = group_runs(runs)
    all_columns = [c for cols in tables.values() for c in cols]
    md = [f"{level} BLEU", ""]
    md += format_table(*_split(bleu_table(all_columns))) + [""]
    decoding = {_decoding_text(r.eval.get("decoding") or {}) for r in runs}
    md += [f"Decoding: {', '.join(sorted(decoding))}.", ""]
    signatures = {
        s for r in runs for s in (r.eval.get("overall") or {}).get("signatures", {}).values()
    }
    md += ["sacreBLEU signatures: " + "; ".join(f"`{s}`" for s in sorted(signatures)), ""]
    plots = []
    for train_len, columns in tables.items():
        md += [f"{level} By source length, trained on sources of at most {train_len} tokens", ""]
        md += (
            [f"{_METRIC_TEXT[metric]}:", ""]
            + format_table(*_split(bucket_table(columns, metric, "sentences")))
            + [""]
        )
        md += [f"{_METRIC_TEXT['length_ratio']}:", ""]
        md += format_table(*_split(bucket_table(columns, "length_ratio", "sentences"))) + [""]
        plot = f"{metric}_by_source_length_L{train_len}{suffix}.png"
        _plot(os.path.join(sweep_dir, plot), columns, metric)
        plots.append(plot)
        md += [f"![{metric} by source length]({plot})", ""]
        md += ["*Error bars: sample standard deviation over seeds (none for n = 1).*", ""]
    return md, plots


def _write_csv(path: str, columns: Sequence[Column]) -> None:
    write_overall_csv(path, columns, (*TRANSLATION_METRICS, "loss"), _overall)


def write_overall_csv(
    path: str,
    columns: Sequence[Column],
    keys: Sequence[str],
    values: Callable[[Column, str], list[float]],
) -> None:
    """``report.csv`` of a table with one row per configuration: ``values(column, key)`` (one
    per seed) as the mean and sample standard deviation of each key, full precision."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["configuration", "n", *keys, *(f"{k} spread" for k in keys)])
        for column in columns:
            per_key = [values(column, k) for k in keys]
            means = [math.fsum(v) / len(v) if v else "" for v in per_key]
            spreads = [statistics.stdev(v) if len(v) > 1 else "" for v in per_key]
            writer.writerow([column.label, len(column.runs), *means, *spreads])
