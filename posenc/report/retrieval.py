"""The retrieval section of a report: every ``posenc retrieval`` record under a folder.

Every record is read: ``retrieval.json`` and each ``retrieval-<settings>.json`` (other
lengths, tasks, haystack or evaluation settings; :func:`posenc.workdir.retrieval_names`), the
plain name of a run written before records were named by their settings included.

- a table: one row per record (encoder, its evaluation changes, training length), the mean score
  over tasks at each length, and RULER's effective length at the record's threshold; the tasks,
  trials and seed each row was measured with;
- ``retrieval_vs_length.png``: the mean score against length, one line per record;
- ``retrieval_heatmap_<n>.png``: each record's score by length x depth, one panel per task.
"""

from __future__ import annotations

import os
from typing import Any

from posenc.workdir import RunDir, atomic_write_bytes

CURVE_FILE = "retrieval_vs_length.png"
HEATMAP_PREFIX = "retrieval_heatmap_"


def find_records(folder: str) -> list[tuple[str, dict[str, Any]]]:
    """``(path, record)`` of every retrieval record in ``folder`` and its subdirectories (one
    level, as :func:`posenc.report.find_runs` looks), in name order."""
    dirs = [folder] + sorted(
        os.path.join(folder, n)
        for n in (os.listdir(folder) if os.path.isdir(folder) else [])
        if os.path.isdir(os.path.join(folder, n))
    )
    out = []
    for d in dirs:
        run = RunDir(d)
        for name in run.retrieval_files():
            record = run.read_eval(name)
            if record is not None and "by_length" in record:
                out.append((os.path.join(d, name), record))
    return out


def evaluation_label(record: dict[str, Any]) -> str:
    """A record's evaluation named as the perplexity table names it: the encoder, then what the
    evaluation changed (``rope (yarn x4)``, by :func:`posenc.report.runs.describe_changes`)."""
    from posenc.report.runs import describe_changes

    changes = record.get("changes") or {}
    encoding = record.get("encoding", "?")
    what = describe_changes(encoding, changes, record.get("train_seq_len")) if changes else ""
    return encoding + (f" ({what})" if what else "")


def _label(path: str, record: dict[str, Any], folder: str) -> str:
    """:func:`evaluation_label` (with the run's pattern of layer kinds, if it has one:
    :func:`posenc.report.runs.pattern_text`), then the record's training length and file."""
    from posenc.report.runs import pattern_text
    from posenc.runs.drope import dropped_from
    from posenc.workdir import CONFIG_FILE, INIT_FILE, flatten, read_json

    where = os.path.relpath(path, folder)
    config = read_json(os.path.join(os.path.dirname(path), CONFIG_FILE))
    pattern = pattern_text(flatten(config)) if isinstance(config, dict) else ""
    label = evaluation_label(record) + (f" ({pattern})" if pattern else "")
    dropped = dropped_from(read_json(os.path.join(os.path.dirname(path), INIT_FILE)))
    if dropped:  # a DroPE continuation (posenc.runs.drope)
        label += f" (DroPE from {dropped})"
    return f"{label} [train {record.get('train_seq_len')}; {where}]"


def retrieval_section(folder: str) -> tuple[list[str], list[str]]:
    """The markdown of the section and the files written (empty when there is no record)."""
    records = find_records(folder)
    if not records:
        return [], []
    from posenc.retrieval.output import figure, fit_title, length_text, plot_heatmap, png

    lengths = sorted({r["length"] for _, rec in records for r in rec["by_length"]})
    md = ["## Retrieval: passkey and needle-in-a-haystack", ""]
    md.append(
        "Mean score (%) over tasks and depths by context length (the model's tokens); effective "
        "length: the longest length up to which the mean stays above the threshold (RULER)."
    )
    md += ["", "| run | " + " | ".join(map(length_text, lengths)) + " | effective | tasks |"]
    md.append("|---|" + "---:|" * (len(lengths) + 1) + "---|")
    fig, (ax,) = figure(1, 6.0, 3.6)
    files = []
    for i, (path, rec) in enumerate(records, 1):
        scores = {r["length"]: r["score"] for r in rec["by_length"]}
        cells = ["—" if scores.get(n) is None else f"{scores[n]:.1f}" for n in lengths]
        label = _label(path, rec, folder)
        tasks = ", ".join(rec["tasks"])
        setting = f"{tasks}; {rec['trials']} trials, seed {rec['seed']}, > {rec['threshold']} %"
        effective = rec["effective_length"] or "none"
        md.append(f"| {label} | " + " | ".join(cells) + f" | {effective} | {setting} |")
        shown = [(n, s) for n, s in sorted(scores.items()) if s is not None]
        ax.plot([n for n, _ in shown], [s for _, s in shown], marker="o", label=label)
        name = f"{HEATMAP_PREFIX}{i}.png"
        atomic_write_bytes(os.path.join(folder, name), plot_heatmap(rec, label))
        files.append(name)
    ax.axhline(records[0][1]["threshold"], color="0.5", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-2, 102)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("score (%)")
    # Below the axes, each label broken to the figure's width: a label is as long as a YaRN
    # evaluation's settings and file, and a legend inside the axes ran off the left edge.
    handles, labels = ax.get_legend_handles_labels()
    labels = [fit_title(x, fig.get_figwidth(), 6) for x in labels]
    fig.legend(handles, labels, loc="outside lower center", fontsize=6)
    atomic_write_bytes(os.path.join(folder, CURVE_FILE), png(fig))
    md += ["", f"![retrieval score against length]({CURVE_FILE})", ""]
    md += [f"![retrieval heat map {i}]({name})" for i, name in enumerate(files, 1)] + [""]
    return md, [CURVE_FILE, *files]
