"""The report's text: markdown tables laid out like ALiBi's Tables 2-3, what was measured,
notes, and the CSV files."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from typing import Any

from posenc.kinds.registry import kinds
from posenc.report import evidence
from posenc.report.runs import Column, Run, cell, table_lengths
from posenc.workdir import EVAL_FILE, SWEEP_FILE, read_json

DASH = "—"
_DIGITS = {
    "perplexity": 2,
    "bits_per_byte": 4,
    "loss": 4,
    "accuracy": 4,
    "exact_match": 4,
    "sequence_accuracy": 4,
}
# The common tables' headings of their metrics; the run kinds add theirs
# (:attr:`posenc.kinds.base.RunKind.report_metric_text`).
METRIC_TEXT = {
    "perplexity": "perplexity (per token; tokens are bytes)",
    "bits_per_byte": "bits per byte",
    "loss": "loss (nats per token)",
}


def metric_text(metric: str) -> str:
    """How a table heads ``metric``: :data:`METRIC_TEXT`, else the heading the first run kind
    that gives one gives it (a KeyError for neither)."""
    texts = dict(METRIC_TEXT)
    for kind in kinds():
        texts = {**kind.report_metric_text, **texts}
    return texts[metric]


def metric_heading(metric: str, runs: Sequence[Run]) -> str:
    """:func:`metric_text` of ``metric``, its tokens named after the runs' own (a perplexity
    per token of an imported model's BPE tokenizer is not per byte)."""
    tokens = sorted({r.tokens for r in runs})
    if metric != "perplexity" or tokens == ["bytes"]:
        return metric_text(metric)
    if len(tokens) == 1:
        return f"perplexity (per token; tokens are the model's {tokens[0]} tokens)"
    return "perplexity (per token; the runs' tokens differ: see Tokens)"


def _fmt(value: float, metric: str) -> str:
    return f"{value:.{_DIGITS[metric]}f}"


def _superscript(i: int) -> str:
    return str(i).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))


def markdown_table(
    columns: Sequence[Column], metric: str, footnotes: dict[str, dict[str, Any]], name: str = ""
) -> list[str]:
    """Rows of one markdown table: the runs per column (``n``), then one row per length.
    Errors get one footnote per column, collected in ``footnotes`` (``name`` + label -> number,
    lengths, first message)."""
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
                text = f"{_fmt(entry.mean, metric)} ± {_fmt(entry.spread, metric)}"
                cells.append(text + evidence.entry_runs(column, length, metric))
            else:
                cells.append(_fmt(entry.mean, metric) + evidence.entry_runs(column, length, metric))
        rows.append([str(length), *cells])
    header = ["L_valid", *(c.label for c in columns)]
    return format_table(header, [evidence.runs_row(columns), *rows])


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table, every column right-aligned to its widest cell."""
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
        if d.get("split"):  # generated examples have no split
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
    lines += _training(runs, columns)
    per_entry = sorted({len(c.runs) for c in columns})
    if max(per_entry) > 1:
        lines.append(
            "- Entries: row n counts the runs (seeds) of each column; an entry is their mean ± "
            "sample standard deviation, or the one run's value where n = 1 (no spread: weaker "
            "evidence); (n=k) marks an entry with fewer runs than its column."
        )
    else:
        lines.append("- Entries: one run each (n = 1): no spread over seeds is measured.")
    for kind in kinds():
        lines += kind.report_notes(evals)
    mode = _common([e["mode"] for e in evals])
    tokens = [r["tokens"] for e in evals for r in e["results"] if "tokens" in r]
    # A kind whose runs are not scored on windows says how they are.
    scored = next(filter(None, (k.report_evaluation(evals) for k in kinds())), None)
    if scored:
        text = f"- Evaluation: {scored}"
        mode = tokens = split = None
    else:
        text = f"- Evaluation: {mode or 'mixed'} windows"
    if mode == "sliding":
        text += f" (stride {_common([e['stride'] for e in evals])})"
    if tokens:
        scored = f"{min(tokens):,}" + (f"-{max(tokens):,}" if max(tokens) > min(tokens) else "")
        text += f", {scored} tokens scored per length"
    text += f" of the {split} split" if split else ""
    randomized = sorted(
        {e.get("max_position") for e in evals if e.get("positions") == "randomized"}
    )
    if randomized:
        ranges = ", ".join(f"[0, {m})" for m in randomized)
        every = "" if len(randomized) == len(evals) else " (where the column says so)"
        text += f"; positions randomized{every}: a sorted random subset of {ranges} per batch"
    lines.append(text + ".")
    capped = evidence.max_tokens_note(runs)
    if capped:
        lines.append(f"- Unscored: {capped}.")
    devices = sorted({e.get("device", "?") for e in evals})
    lines.append(f"- Device (evaluation): {', '.join(devices)}.")
    return lines


def _training(runs: Sequence[Run], columns: Sequence[Column]) -> list[str]:
    """The lines saying how the runs were trained: the training of those posenc trained,
    and for an imported model (``pretrained.json``) where it came from, not the import's one
    checkpoint step and the base config's batch; and the tokens when some are not bytes."""
    label = {id(r): c.label for c in columns for r in c.runs}
    trained = [r for r in runs if r.imported is None]
    lines = []
    if trained:
        evals = [r.eval for r in trained]
        batch = _common([r.identity.get("train.batch_size") for r in trained])
        steps = _common([e["train_steps"] for e in evals])
        train_lens = sorted({e["train_seq_len"] for e in evals})
        text = f"- Training: L = {', '.join(map(str, train_lens))}"
        text += f", {steps:,} steps" if steps is not None else ", steps differ between runs"
        if batch:
            text += f" of {batch} windows"
        text += f"; seeds {', '.join(map(str, sorted({e['seed'] for e in evals})))}"
        lines.append(text + ".")
    imported = {}
    for r in runs:
        record = r.imported
        if record is not None:
            text = (
                f"{label[id(r)]}: the {record.get('family', '?')} model of "
                f"`{record.get('source', '?')}` (its config's training length L = {r.train_len})"
            )
            imported.setdefault(text, None)
    if imported:
        lines.append(
            "- Imported (`posenc import-hf`; posenc did not train these): "
            + "; ".join(imported)
            + "."
        )
    if any(r.tokens != "bytes" for r in runs):
        tokenizers = {label[id(r)]: r.tokens for r in runs}
        said = {
            k: "bytes" if k == "bytes" else f"the model's own {k} tokenizer"
            for k in tokenizers.values()
        }
        tokens = "; ".join(f"{name}: {said[t]}" for name, t in tokenizers.items())
        lines.append(f"- Tokens: {tokens}.")
    return lines


def sweep_failures(sweep_dir: str) -> list[str]:
    sweep = read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if sweep is None:
        return []
    out = []
    for p in sweep["points"]:
        if p["status"] not in ("done", "skipped"):
            error = (p.get("error") or "").splitlines()[0][:300] if p.get("error") else ""
            if p["status"] == "unselected":
                error = "not run: left out by posenc sweep --only"
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
    fields = ["loss", "perplexity", "bits_per_byte", "accuracy", "tokens", "windows", "seconds"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["dir", "file", "encoding", "changes", "train_seq_len", "seed", "checkpoint_step"]
            + ["train_steps", "length", *fields, "error"]
        )
        for run in runs:
            step = run.eval.get("checkpoint_step")
            changes = json.dumps(run.changes, sort_keys=True) if run.changes else ""
            for r in run.eval["results"]:
                source = run.sources.get(r["length"], run.files[0])
                writer.writerow(
                    [os.path.relpath(run.dir, sweep_dir), source, run.encoding, changes]
                    + [run.train_len, run.seed, "" if step is None else step]
                    + [run.eval["train_steps"], r["length"]]
                    + [repr(r[k]) if k in r else "" for k in fields]
                    + [r.get("error", "")]
                )


def unfinished_notes(columns: Sequence[Column], sweep_dir: str) -> list[str]:
    """One line per run scored before its training finished (the ``†`` columns)."""
    lines = []
    for column in columns:
        for run in column.unfinished:
            step = run.eval.get("checkpoint_step")
            lines.append(
                f"† {column.label.removesuffix(' †')}: `{_where(run, sweep_dir)}` "
                f"was scored at step {step} of {run.eval['train_steps']} (training unfinished)."
            )
    return lines


def _where(run: Run, sweep_dir: str) -> str:
    """The run's directory relative to the report, and its evaluation files but eval.json."""
    where = os.path.relpath(run.dir, sweep_dir)
    others = [f for f in run.files if f != EVAL_FILE]
    return where + (f" ({', '.join(others)})" if others else "")


def superseded_notes(runs: Sequence[Run], sweep_dir: str) -> list[str]:
    """One line per evaluation report left out for scoring an older checkpoint step than the
    run's other reports under the same settings."""
    lines = []
    for run in runs:
        for name in run.superseded:
            lines.append(
                f"- `{os.path.join(os.path.relpath(run.dir, sweep_dir), name)}` scored an older "
                f"checkpoint than step {run.eval.get('checkpoint_step')} of "
                f"{', '.join(run.files)}; left out (evaluate again to include those lengths)."
            )
    return ["Evaluations left out:", "", *lines, ""] if lines else []


def footnote_lines(footnotes: dict[str, dict[str, Any]]) -> list[str]:
    md = []
    for label, note in footnotes.items():
        lengths = ", ".join(map(str, sorted(set(note["lengths"]))))
        md.append(
            f"{DASH}{_superscript(note['number'])} {label} cannot be evaluated at L_valid = "
            f"{lengths}: {note['error']}"
        )
        md.append("")
    return md
