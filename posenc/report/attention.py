"""The attention section of a report: ``posenc analyze`` records of models whose layers differ.

A model with a pattern of layer kinds (:mod:`posenc.layers.pattern`: a window, an encoder or
attention options per kind) is read per kind: every analysis record under a folder (one level
down, as :func:`posenc.report.find_runs` looks) whose model has one (its ``layer_kinds``) gets a
row per kind with the kind's mean ``entropy / log n`` (1: uniform attention over the kind's
visible keys) at each analysed length, and its mean attention weight on the farthest octave of
distances it can see beside what uniform attention would put there. Records of models without a
pattern are left to their own ``attention.md`` (one kind: nothing to compare).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from posenc.workdir import ANALYSIS_STEM, read_json


def find_records(folder: str) -> list[tuple[str, dict[str, Any]]]:
    """``(path, record)`` of every analysis record with layer kinds in ``folder`` and its
    subdirectories, in name order."""
    dirs = [folder] + sorted(
        os.path.join(folder, n)
        for n in (os.listdir(folder) if os.path.isdir(folder) else [])
        if os.path.isdir(os.path.join(folder, n))
    )
    out = []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            stem, ext = os.path.splitext(name)
            if ext != ".json" or not (
                stem == ANALYSIS_STEM or stem.startswith(ANALYSIS_STEM + "-")
            ):
                continue
            record = read_json(os.path.join(d, name))
            if isinstance(record, dict) and record.get("layer_kinds") and "lengths" in record:
                out.append((os.path.join(d, name), record))
    return out


def _fmt(x: float | None) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _far(length_record: dict[str, Any], kind: str) -> tuple[float | None, float | None]:
    """The kind's head-averaged mean weight, and uniform attention's, over the farthest octave
    of distances it sees (the last octave bucket holding any of its pairs)."""
    from posenc.analysis.output import coarse

    buckets, means = coarse(length_record, "weight", kind)
    _, uniform = coarse(length_record, "uniform", kind)
    fine = np.asarray(length_record["buckets"])
    pairs = np.asarray(length_record["by_kind"][kind]["pairs"], np.float64)
    if not (pairs > 0).any():
        return None, None
    farthest = fine[np.flatnonzero(pairs > 0)[-1], 0]  # the first distance of its last bucket
    last = int(np.searchsorted(buckets[:, 0], farthest, side="right") - 1)
    return float(np.nanmean(means[:, last])), float(uniform[last])


def attention_section(folder: str) -> list[str]:
    """The markdown of the section (empty when no record under ``folder`` has layer kinds)."""
    records = find_records(folder)
    if not records:
        return []
    md = ["## Attention by layer kind (`posenc analyze`)", ""]
    md.append(
        "Models whose layers differ, read per kind (each over its layers and its own visible "
        "keys): H / log n is the mean row entropy over log of the row's visible keys (1: "
        "uniform); far weight is the mean attention weight on the farthest octave of distances "
        "the kind sees, beside uniform attention's (in brackets)."
    )
    for path, record in records:
        measured = [r for r in record["lengths"] if "by_kind" in r]
        if not measured:
            continue
        where = os.path.relpath(path, folder)
        lengths = [r["length"] for r in measured]
        train = record.get("train_seq_len")
        header = [f"{n}{' (train)' if n == train else ''}" for n in lengths]
        md += ["", f"### {where} (trained at L = {train})", ""]
        md += ["| kind | layers | " + " | ".join(f"H / log n, {h}" for h in header)]
        md[-1] += " | " + " | ".join(f"far weight, {n}" for n in lengths) + " |"
        md.append("|---|---|" + "---:|" * (2 * len(lengths)))
        described = record.get("kinds", {})
        for kind in dict.fromkeys(record["layer_kinds"]):
            entries = [r["by_kind"][kind] for r in measured]
            ratios = [_fmt(float(np.mean(e["normalized_entropy"]))) for e in entries]
            far = []
            for r in measured:
                weight, uniform = _far(r, kind)
                far.append(f"{_fmt(weight)} ({_fmt(uniform)})")
            layers = ", ".join(map(str, entries[0]["layers"]))
            name = described.get(kind, kind)
            md.append(f"| {name} | {layers} | " + " | ".join(ratios + far) + " |")
    return md + [""]
