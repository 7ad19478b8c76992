"""What ``posenc analyze`` writes beside a run: the record (JSON), its tables (markdown, CSV) and
plots (PNG), all from the record alone, under the names :func:`posenc.workdir.analysis_names`
gives (``attention.json``, ``attention.md``, ``attention.csv``, ``attention_entropy.csv``,
``attention.png``, ``attention_entropy.png``).

A model with a pattern of layer kinds (the record's ``layer_kinds``) gets its layers named by
kind (``layer 3 (global)``) and, in the markdown, a section per kind: the kinds' entropy by length
and their attention by distance, each over its layers and its own visible pairs; the CSV rows
carry each layer's kind and its own pairs and uniform baseline. Without a pattern the files are
as they always were."""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.analysis.buckets import COARSE, distance_buckets
from posenc.workdir import RunDir, atomic_write_bytes, write_json


def write_analysis(run: RunDir, record: dict[str, Any]) -> list[str]:
    """Writes the record and its tables and plots (atomically, each); returns their paths."""
    names = record["files"]
    paths = {kind: run.file(name) for kind, name in names.items()}
    write_json(paths["json"], record)
    atomic_write_bytes(paths["table"], "\n".join(markdown(record)).encode())
    atomic_write_bytes(paths["csv"], _csv(distance_rows(record)))
    atomic_write_bytes(paths["entropy_csv"], _csv(entropy_rows(record)))
    atomic_write_bytes(paths["plot"], plot_distance(record))
    atomic_write_bytes(paths["entropy_plot"], plot_entropy(record))
    return list(paths.values())


def _measured(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in record["lengths"] if "error" not in r]


def _bucket_text(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}..{hi}"


def coarse(
    length_record: dict[str, Any], key: str, kind: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A length's ``key`` (``"weight"``, ``"logit"`` or ``"uniform"``) in octave buckets:
    ``[n, 2]`` bucket bounds and the pair-weighted means ``[..., n]`` (the fine buckets nest in
    them); ``kind``: that layer kind's (``by_kind``) instead of the per-layer values."""
    fine = np.asarray(length_record["buckets"])
    source = length_record if kind is None else length_record["by_kind"][kind]
    pairs = np.asarray(source["pairs"], np.float64)
    values = np.asarray(source[key], np.float64)
    low, high = int(fine[0, 0]), int(fine[-1, 1])
    buckets = distance_buckets(low, high, COARSE)
    index = np.searchsorted(buckets[:, 0], fine[:, 0], side="right") - 1
    sums = np.zeros(values.shape[:-1] + (len(buckets),))
    counts = np.zeros(len(buckets))
    np.add.at(counts, index, pairs)
    np.add.at(sums.T, index, np.nan_to_num(values * pairs).T)
    # An octave without pairs (beyond a layer's window) has no mean.
    return buckets, np.where(counts > 0, sums / np.maximum(counts, 1e-300), np.nan)


def _fmt(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "—"
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _head_mean(means: np.ndarray, axis: int) -> np.ndarray:
    """The mean over heads (``axis``), NaN (shown "—") where no head has a value: an octave
    beyond a layer's window."""
    finite = np.isfinite(means)
    count = finite.sum(axis)
    total = np.where(finite, means, 0.0).sum(axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _kinds(record: dict[str, Any]) -> list[str] | None:
    """Each layer's kind (a model with a pattern of layer kinds), None without one."""
    return record.get("layer_kinds")


def layer_name(record: dict[str, Any], layer: int) -> str:
    """``"3"``, or ``"3 (global)"`` in a model with a pattern of layer kinds."""
    kinds = _kinds(record)
    return f"{layer} ({kinds[layer]})" if kinds else str(layer)


def _layer_source(record: dict[str, Any], r: dict[str, Any], layer: int) -> dict[str, Any]:
    """Where a layer's pairs, uniform baseline and ``log n`` are: its kind's entry (layers of
    one kind share their mask), or the length record (every layer's, without a pattern)."""
    kinds = _kinds(record)
    return r["by_kind"][kinds[layer]] if kinds and "by_kind" in r else r


def kind_lines(record: dict[str, Any]) -> list[str]:
    """The markdown section of a model with a pattern of layer kinds: what each kind is, its
    entropy by length, and its attention by distance at each length (head-averaged, over the
    kind's layers; each kind's own uniform baseline, its window's visible pairs); empty
    without a pattern."""
    kinds = _kinds(record)
    measured = [r for r in _measured(record) if "by_kind" in r]
    if not kinds or not measured:
        return []
    names = list(dict.fromkeys(kinds))
    described = record.get("kinds", {})
    lines = ["## Attention by layer kind", ""]
    lines += [
        f"- `{name}` (layers {', '.join(map(str, [i for i, k in enumerate(kinds) if k == name]))}"
        f"): {described.get(name, name)}"
        for name in names
    ]
    lines += ["", "H / log n by length, mean over each kind's layers, heads and rows:", ""]
    lines += ["| L | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for r in measured:
        mark = " (train)" if r["length"] == record["train_seq_len"] else ""
        cells = [_fmt(np.mean(r["by_kind"][n]["normalized_entropy"])) for n in names]
        lines.append(f"| {r['length']}{mark} | " + " | ".join(cells) + " |")
    for r in measured:
        buckets, _ = coarse(r, "weight", names[0])
        header = [_bucket_text(lo, hi) for lo, hi in buckets]
        lines += ["", f"### Mean attention weight by distance per kind, L = {r['length']}", ""]
        lines += ["| kind | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
        for name in names:
            _, means = coarse(r, "weight", name)
            _, uniform = coarse(r, "uniform", name)
            lines.append(f"| {name} | " + " | ".join(_fmt(x) for x in _head_mean(means, 0)) + " |")
            lines.append(f"| {name} uniform | " + " | ".join(_fmt(x) for x in uniform) + " |")
    return lines + [""]


def markdown(record: dict[str, Any]) -> list[str]:
    """The tables: entropy by length (per layer), then per length the head-averaged weight and
    logit by distance (octave buckets), each layer a row."""
    train_len = record["train_seq_len"]
    changes = ", ".join(f"{k}={v}" for k, v in record["changes"].items())
    title = f"# Attention by distance: {record['encoding']}" + (f" ({changes})" if changes else "")
    measured = _measured(record)
    layers = range(record["num_layers"])
    lines = [
        title,
        "",
        f"Trained at L = {train_len} (checkpoint step {record['checkpoint_step']}"
        f"{'' if record['finished'] else ', training not finished'}); "
        f"{record['split']} windows, {record['positions']} positions, "
        f"{record['num_heads']} heads per layer. Distance d = i - j counts tokens from the "
        "query back to the key. Weight: the mean softmax probability over the (query, key) "
        "pairs at that distance; logit: the mean of what the softmax reads (scaled, with the "
        "encoder's biases); uniform: what attention spread evenly over the visible keys would "
        "give. Means over heads here; per head in the CSV and JSON files.",
        "",
        "## Attention entropy by length",
        "",
        "H / log n: mean over query rows (those that see n >= 2 keys) and heads of the row's "
        "entropy over log of its visible keys; 1 is uniform attention. A ratio that rises with "
        "the length is attention diluted over more keys than in training.",
        "",
        f"| L | windows | mean log n{', layer 0' if _kinds(record) else ''} | "
        + " | ".join(f"layer {layer_name(record, i)} H / log n" for i in layers)
        + " |",
        "|---:|---:|---:|" + "---:|" * len(layers),
    ]
    for r in measured:
        ratios = [_fmt(np.mean(r["normalized_entropy"][i])) for i in layers]
        mark = " (train)" if r["length"] == train_len else ""
        lines.append(
            f"| {r['length']}{mark} | {r['windows']} | {r['log_keys']:.3g} | "
            + " | ".join(ratios)
            + " |"
        )
    lines += ["", "Entropy in nats (mean over rows and heads):", ""]
    lines += ["| L | " + " | ".join(f"layer {layer_name(record, i)}" for i in layers) + " |"]
    lines += ["|---:|" + "---:|" * len(layers)]
    for r in measured:
        cells = [_fmt(np.mean(r["entropy"][i])) for i in layers]
        lines.append(f"| {r['length']} | " + " | ".join(cells) + " |")
    for r in measured:
        for key, what in (("weight", "Mean attention weight"), ("logit", "Mean logit")):
            buckets, means = coarse(r, key)
            head_mean = _head_mean(means, 1)  # [layers, n]
            header = [_bucket_text(lo, hi) for lo, hi in buckets]
            lines += ["", f"## {what} by distance, L = {r['length']}", ""]
            lines += ["| layer | " + " | ".join(header) + " |"]
            lines += ["|---|" + "---:|" * len(header)]
            for i in layers:
                cells = " | ".join(_fmt(x) for x in head_mean[i])
                lines.append(f"| {layer_name(record, i)} | {cells} |")
            if key == "weight" and not _kinds(record):  # per kind in the kinds' section
                _, uniform = coarse(r, "uniform")
                lines.append("| uniform | " + " | ".join(_fmt(x) for x in uniform) + " |")
    lines += [""] + kind_lines(record) if _kinds(record) else []
    errors = [r for r in record["lengths"] if "error" in r]
    if errors:
        lines += [""] + [f"L = {r['length']}: not analysed ({r['error']})" for r in errors]
    return lines + [""]


def distance_rows(record: dict[str, Any]) -> list[list[Any]]:
    """CSV rows: one per length, layer, head and (quarter-octave) distance bucket; with a
    pattern of layer kinds a ``kind`` column after ``layer``, and each layer's own pairs and
    uniform baseline."""
    kinds = _kinds(record)
    kind_column = ["kind"] if kinds else []
    rows: list[list[Any]] = [
        ["length", "layer", *kind_column, "head", "distance_min", "distance_max", "pairs"]
        + ["mean_weight", "mean_logit", "uniform_weight"]
    ]
    for r in _measured(record):
        for layer, (weights, logits) in enumerate(zip(r["weight"], r["logit"], strict=True)):
            source = _layer_source(record, r, layer)
            kind = [kinds[layer]] if kinds else []
            for head, (w, g) in enumerate(zip(weights, logits, strict=True)):
                for b, (lo, hi) in enumerate(r["buckets"]):
                    rows.append(
                        [r["length"], layer, *kind, head, lo, hi, source["pairs"][b], w[b], g[b]]
                        + [source["uniform"][b]]
                    )
    return rows


def entropy_rows(record: dict[str, Any]) -> list[list[Any]]:
    """CSV rows: one per length, layer and head (with a pattern of layer kinds, a ``kind``
    column after ``layer`` and each layer's own mean ``log n``)."""
    kinds = _kinds(record)
    kind_column = ["kind"] if kinds else []
    rows: list[list[Any]] = [
        ["length", "layer", *kind_column, "head", "entropy", "mean_log_keys"]
        + ["entropy_over_log_keys"]
    ]
    for r in _measured(record):
        for layer, heads in enumerate(r["entropy"]):
            log_keys = _layer_source(record, r, layer)["log_keys"]
            kind = [kinds[layer]] if kinds else []
            for head, value in enumerate(heads):
                ratio = r["normalized_entropy"][layer][head]
                rows.append([r["length"], layer, *kind, head, value, log_keys, ratio])
    return rows


def _csv(rows: Sequence[Sequence[Any]]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerows(["" if x is None else x for x in row] for row in rows)
    return out.getvalue().encode()


def png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)
    return out.getvalue()


def figure(panels: int, width: float = 4.2, height: float = 3.2):
    """An Agg figure with ``panels`` axes, three per row (unused axes hidden); returns
    ``(figure, axes)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(panels, 3)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(width * cols, height * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:panels])


def plot_distance(record: dict[str, Any]) -> bytes:
    """One panel per layer: the head-averaged mean weight against distance, one line per length,
    the band spanning the heads' lowest to highest mean (PNG bytes)."""
    import matplotlib

    measured = _measured(record)
    fig, axes = figure(record["num_layers"])
    cmap = matplotlib.colormaps["viridis"]
    for layer, ax in enumerate(axes):
        for n, r in enumerate(measured):
            buckets = np.asarray(r["buckets"], np.float64)
            x = buckets.mean(axis=1)  # the bucket's centre
            w = np.asarray(r["weight"][layer], np.float64)  # [H, n]
            seen = np.isfinite(w).any(axis=0)  # buckets with pairs (a window sees fewer)
            x, w = x[seen], w[:, seen]
            color = cmap(n / max(1, len(measured) - 1))
            train = " (train)" if r["length"] == record["train_seq_len"] else ""
            ax.plot(x, np.nanmean(w, axis=0), color=color, label=f"L={r['length']}{train}")
            ax.fill_between(x, np.nanmin(w, axis=0), np.nanmax(w, axis=0), color=color, alpha=0.15)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("log")
        ax.set_title(f"layer {layer_name(record, layer)}", fontsize=10)
        ax.set_xlabel("distance i - j (tokens)")
        ax.set_ylabel("mean attention weight")
        ax.grid(True, which="both", alpha=0.3)
    if axes and measured:
        axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{record['encoding']}: attention weight by distance\n(lines: mean over heads; bands: "
        "lowest to highest head)",
        fontsize=9,
    )
    return png(fig)


def plot_entropy(record: dict[str, Any]) -> bytes:
    """Entropy over log of the visible keys against length, one line per layer (mean over
    heads, band over heads), the training length marked (PNG bytes)."""
    measured = _measured(record)
    fig, (ax,) = figure(1, 6.0, 4.0)
    lengths = [r["length"] for r in measured]
    for layer in range(record["num_layers"]):
        ratios = np.asarray([r["normalized_entropy"][layer] for r in measured], np.float64)
        if not len(ratios):
            break
        label = f"layer {layer_name(record, layer)}"
        line = ax.plot(lengths, ratios.mean(axis=1), marker="o", label=label)[0]
        ax.fill_between(
            lengths, ratios.min(axis=1), ratios.max(axis=1), color=line.get_color(), alpha=0.15
        )
    ax.axvline(record["train_seq_len"], color="0.4", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    if lengths:
        from matplotlib.ticker import FixedLocator, NullLocator

        ax.xaxis.set_major_locator(FixedLocator(lengths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(n) for n in lengths])
    ax.set_xlabel("window length L (tokens)")
    ax.set_ylabel("row entropy / log(visible keys)")
    ax.set_title(
        f"{record['encoding']}: attention entropy\n(1 = uniform; dashed: training length; "
        "bands: lowest to highest head)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    if measured:
        ax.legend(fontsize=7)
    return png(fig)


def summary_lines(record: dict[str, Any], workdir: str) -> list[str]:
    """What ``posenc analyze`` prints: the entropy table and the files written."""
    table = [line for line in markdown(record) if line.startswith("|")]
    lines = table[: 2 + len(_measured(record))]
    files = [os.path.join(workdir, name) for name in record["files"].values()]
    return lines + [f"wrote {path}" for path in files]
