"""The benchmark report as markdown, and the two files a run writes."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from posenc.workdir import write_json

_GIB = 2.0**30


def output_stem(size: str) -> str:
    """The name, without suffix, of a run's files: ``throughput_<size>``."""
    return f"throughput_{size}"


def write_report(report: dict[str, Any], out: str | pathlib.Path) -> str:
    """Writes ``throughput_<size>.json`` and ``throughput_<size>.md`` to ``out``.

    Returns:
      The markdown.
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = output_stem(report["meta"]["size"])
    write_json(out / f"{stem}.json", report)
    text = markdown(report)
    (out / f"{stem}.md").write_text(text)
    return text


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: a header with device and settings, a training and an eval table."""
    lines = _header(report["meta"]) + _train_table(report) + _eval_table(report)
    return "\n".join(lines + paths_table(report["train"] + report["eval"])) + "\n"


def paths_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The attention path ``auto`` takes on each backend (``row["paths"]``,
    :mod:`posenc.runs.paths`), one line per encoder and length; empty when no row has them."""
    seen: dict[tuple[str, int], dict[str, str]] = {}
    for row in rows:
        if row.get("paths"):  # a training row has its seq_len, an evaluation row its length
            seen.setdefault((row["encoder"], row.get("length", row.get("seq_len"))), row["paths"])
    if not seen:
        return []
    backends = list(next(iter(seen.values())))
    lines = [
        "",
        "Attention path `auto` takes on each backend (the same rules asked for each backend: "
        "posenc.runs.paths):",
        "",
        "| encoder | length | " + " | ".join(backends) + " |",
        "|---|---:|" + "---|" * len(backends),
    ]
    for (encoder, length), paths in seen.items():
        lines.append(f"| {encoder} | {length} | " + " | ".join(paths[b] for b in backends) + " |")
    return lines


def _header(meta: dict[str, Any]) -> list[str]:
    m = meta["model"]
    return [
        f"# Throughput and memory: size `{meta['size']}`",
        "",
        f"- date: {meta['date']}; device: {meta['device_count']} x {meta['device_kind']} "
        f"({meta['platform']}); host: {meta['host']}, {meta['host_cpus']} CPUs, 1-min load "
        f"average {meta['load_average_1min'][0]} at start, {meta['load_average_1min'][1]} at end",
        f"- jax {meta['jax_version']}, flax {meta['flax_version']}, python {meta['python']}",
        f"- model: {m['num_layers']} layers, width {m['model_dim']}, {m['num_heads']} heads, "
        f"MLP {m['mlp_dim']}, vocab {m['vocab_size']}, {m['dtype']}; train length "
        f"{meta['train']['seq_len']}, batch {meta['train']['batch_size']}, "
        f"{meta['optimizer']}",
        f"- timing: {meta['warmup']} warm-up steps, then {meta['steps']} timed steps; eval: "
        f"one window, batch 1, median of {meta['eval_repeats']}; attention_impl "
        f"`{meta['attention_impl']}`; data `{meta['data']}`",
        f"- MFU: model FLOPs per token {meta['flops_per_token']}; peak "
        + (
            f"{meta['peak_tflops_per_device']} TFLOP/s per device (bf16 dense)"
            if meta["peak_tflops_per_device"]
            else "unknown for this device (MFU omitted; give --peak-tflops)"
        ),
        f"- memory: {meta['memory_source']}",
    ]


# (heading, alignment rule) of each column; the leading ones name the row.
_TRAIN_COLUMNS = (
    ("encoder", "---"),
    ("path", "---"),
    ("tokens/s", "---:"),
    ("step (ms)", "---:"),
    ("MFU", "---:"),
    ("model TFLOP/s", "---:"),
    ("memory", "---:"),
    ("compile (s)", "---:"),
    ("loss", "---:"),
)
_EVAL_COLUMNS = (
    ("encoder", "---"),
    ("length", "---:"),
    ("path", "---"),
    ("seconds", "---:"),
    ("tokens/s", "---:"),
    ("memory", "---:"),
    ("compile (s)", "---:"),
)


def _train_table(report: dict[str, Any]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
        return [
            row["path"],
            f"{row['tokens_per_s']:,.0f}",
            f"{1e3 * row['step_time_s']:.1f}",
            mfu,
            f"{row['model_tflops_per_s']:.3g}",
            _bytes(row),
            f"{row['compile_s']:.1f}",
            f"{row['loss']:.3f}",
        ]

    return ["", *_table(_TRAIN_COLUMNS, ("encoder",), report["train"], cells)]


def _eval_table(report: dict[str, Any]) -> list[str]:
    def cells(row: dict[str, Any]) -> list[str]:
        return [
            row["path"],
            f"{row['seconds']:.3f}",
            f"{row['tokens_per_s']:,.0f}",
            _bytes(row),
            f"{row['compile_s']:.1f}",
        ]

    title = ["", "Evaluation of one window (batch 1):", ""]
    return title + _table(_EVAL_COLUMNS, ("encoder", "length"), report["eval"], cells)


def _table(
    columns: Sequence[tuple[str, str]],
    keys: Sequence[str],
    rows: Sequence[dict[str, Any]],
    cells: Callable[[dict[str, Any]], list[str]],
) -> list[str]:
    """A markdown table: each row is its ``keys`` then ``cells(row)``, or the error and blanks."""
    lines = [
        "| " + " | ".join(name for name, _ in columns) + " |",
        "|" + "|".join(rule for _, rule in columns) + "|",
    ]
    for row in rows:
        named = [str(row[k]) for k in keys]
        if "error" in row:
            blanks = len(columns) - len(keys) - 1
            lines.append("| " + " | ".join([*named, _cell_error(row)]) + " |" + " |" * blanks)
        else:
            lines.append("| " + " | ".join(named + cells(row)) + " |")
    return lines


def _bytes(row: dict[str, Any]) -> str:
    value = row.get("memory_bytes")
    if value is None:
        return "-"
    return f"{value / _GIB:.2f} GiB" if value >= _GIB else f"{value / 2**20:.1f} MiB"


def _cell_error(row: dict[str, Any]) -> str:
    """The error's first clause (the JSON keeps all of it)."""
    return "error: " + row["error"].split("; ")[0].replace("|", "/")[:200]
