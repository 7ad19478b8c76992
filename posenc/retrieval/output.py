"""Retrieval results as a markdown table and plots (heat map by length x depth; score by length).

Numbers are percentages of the trials' scores (RULER's partial credit for multi-needle tasks).
Plots are drawn with matplotlib's Agg backend and returned as PNG bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.analysis.output import figure, png


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def length_text(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def grid(task: dict[str, Any], lengths: Sequence[int], depths: Sequence[float]) -> np.ndarray:
    """A task's cell scores ``[depths, lengths]`` (NaN where a length was not scored)."""
    out = np.full((len(depths), len(lengths)), np.nan)
    for cell in task["cells"]:
        out[list(depths).index(cell["depth"]), list(lengths).index(cell["length"])] = cell["score"]
    return out


def markdown(record: dict[str, Any], title: str = "") -> list[str]:
    """The tables: per task, score by depth (rows) and length (columns) with the depth mean;
    then the mean over tasks by length and the effective lengths."""
    lengths, depths = record["lengths"], record["depths"]
    head = "| depth | " + " | ".join(length_text(n) for n in lengths) + " |"
    rule = "|---|" + "---:|" * len(lengths)
    lines = [f"# Retrieval{': ' + title if title else ''}", ""]
    lines.append(
        f"Score (%) of greedy outputs, {record['trials']} trials per cell, seed {record['seed']}; "
        f"lengths in the model's tokens; depth = the needle's fraction of the context. "
        f"Effective length: the longest length up to which the mean over tasks stays > "
        f"{record['threshold']} % (RULER's threshold)."
    )
    for name, task in record["tasks"].items():
        g = grid(task, lengths, depths)
        lines += ["", f"## {name} ({task['metric']})", "", head, rule]
        for i, depth in enumerate(depths):
            row = [None if np.isnan(x) else float(x) for x in g[i]]
            lines.append(f"| {depth:g} | " + " | ".join(_fmt(x) for x in row) + " |")
        means = {r["length"]: r.get("score") for r in task["by_length"]}
        lines.append("| **mean** | " + " | ".join(_fmt(means.get(n)) for n in lengths) + " |")
        errors = [r for r in task["by_length"] if "error" in r]
        lines += [f"- length {r['length']}: not scored: {r['error']}" for r in errors]
        lines.append(f"- effective length: {task['effective_length'] or 'none'}")
    lines += ["", "## Mean over tasks", "", "| | " + " | ".join(map(length_text, lengths)) + " |"]
    lines.append("|---|" + "---:|" * len(lengths))
    lines.append("| score | " + " | ".join(_fmt(r["score"]) for r in record["by_length"]) + " |")
    effective = record["effective_length"]
    lines += [
        "",
        f"Effective length (threshold {record['threshold']} %): {effective or 'none'}",
    ]
    if record.get("train_seq_len"):
        lines.append(f"Training length: {record['train_seq_len']}")
    return lines


def plot_heatmap(record: dict[str, Any], title: str = "") -> bytes:
    """One panel per task: score by length (x) and depth (y), red 0 to green 100, each cell
    written in (PNG bytes)."""
    lengths, depths = record["lengths"], record["depths"]
    names = list(record["tasks"])
    fig, axes = figure(len(names), 0.55 * len(lengths) + 2.2, 0.32 * len(depths) + 1.6)
    for ax, name in zip(axes, names, strict=True):
        g = grid(record["tasks"][name], lengths, depths)
        image = ax.imshow(g, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        for (i, j), x in np.ndenumerate(g):
            if not np.isnan(x):
                ax.text(j, i, f"{x:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [length_text(n) for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(name, fontsize=9)
        # The training length: a dashed line between the last length within it and the next.
        inside = sum(n <= (record.get("train_seq_len") or 0) for n in lengths)
        if 0 < inside < len(lengths):
            ax.axvline(inside - 0.5, color="k", lw=1, ls="--")
    fig.colorbar(image, ax=axes, label="score (%)", shrink=0.8)
    if title:
        fig.suptitle(fit_title(title, fig.get_figwidth(), 10), fontsize=10)
    return png(fig)


def fit_title(text: str, width: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width`` inches at ``fontsize`` points (a run's
    label, a YaRN evaluation's settings and its file, is wider than a one-task figure: the
    title was cut at both edges). A character is taken as 0.6 of the font size wide."""
    import textwrap

    return textwrap.fill(text, max(20, int(width * 72 / (0.6 * fontsize))))


def plot_curve(record: dict[str, Any], title: str = "") -> bytes:
    """Score (mean over depths) against length, one line per task and the mean over tasks; the
    threshold and the training length dashed (PNG bytes)."""
    fig, (ax,) = figure(1, 5.2, 3.4)
    for name, task in record["tasks"].items():
        rows = [r for r in task["by_length"] if "score" in r]
        ax.plot([r["length"] for r in rows], [r["score"] for r in rows], marker="o", label=name)
    mean = [r for r in record["by_length"] if r["score"] is not None]
    if len(record["tasks"]) > 1 and mean:
        ax.plot([r["length"] for r in mean], [r["score"] for r in mean], "k-", lw=2, label="mean")
    ax.axhline(record["threshold"], color="0.5", ls=":", lw=1)
    if record.get("train_seq_len"):
        ax.axvline(record["train_seq_len"], color="0.4", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-2, 102)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("score (%)")
    ax.legend(fontsize=7)
    ax.set_title(fit_title(title or "retrieval", fig.get_figwidth(), 9), fontsize=9)
    return png(fig)
