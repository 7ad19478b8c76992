"""The report's plots: a metric against evaluation length, and loss by position."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.report.evidence import ERROR_BARS
from posenc.report.runs import Column, cell, table_lengths
from posenc.report.tables import metric_heading


def line_colors(tables: dict[int, list[Column]]) -> dict[str, Any]:
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


def plain_numbers(ax) -> None:
    """Tick labels as the numbers themselves: no offset (``+1.01e3`` above the axis, the ticks
    reading 0.3 ... 0.65, when every perplexity is near 1010) and no scientific notation on a
    linear axis (a log axis keeps its own formatter)."""
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        formatter = axis.get_major_formatter()
        if isinstance(formatter, ScalarFormatter):
            formatter.set_useOffset(False)
            formatter.set_scientific(False)


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
            label=f"{column.label} (n={len(column.runs)})",
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
    plain_numbers(ax)
    ax.set_xlabel("evaluation length L_valid (tokens, log scale)")
    ax.set_ylabel(metric_heading(metric, [r for c in columns for r in c.runs]))
    ax.set_title(f"{metric} against evaluation length, trained at L = {train_len}")
    ax.grid(True, which="both", alpha=0.3)
    if ys:
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.text(0.01, 0.005, ERROR_BARS, fontsize=7, color="0.3", ha="left", va="bottom", wrap=True)
    fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))  # room for the caption
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
    plain_numbers(ax)
    ax.set_xlabel("position inside the window (1 = first token, log scale)")
    ax.set_ylabel("loss (nats), mean over runs and log-spaced position buckets")
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
