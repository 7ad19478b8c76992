"""Training curves of a sweep: loss against step, one line per configuration, seeds as a spread.

Where the tables compare evaluations, a convergence claim ("RoPE converges faster", RoFormer
Figure 3) is about the training loss as it falls. :func:`find_curves` groups a sweep's points by
configuration (points equal but for ``seed`` form one curve), :func:`loss_table` gives the loss
at fixed steps as ``mean ± sample standard deviation`` over seeds, and :func:`plot_curves` draws
the mean with the spread shaded, as the paper's figure draws its two lines.

The loss at a step is the one ``metrics.jsonl`` logged there: the mean training loss over the
``train.log_every`` steps up to it (the same tokens for every configuration of a sweep, since
windows depend only on the seed and the step).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.report.tables import format_table
from posenc.workdir import CONFIG_FILE, METRICS_FILE, SWEEP_FILE, flatten, read_json, read_jsonl

SPREAD = (
    "Entries and lines: the mean over seeds, ± (shaded) one sample standard deviation; the "
    "number of seeds is in the legend, and a line without shading is one run."
)
# Fields that do not make two points different configurations.
_NOT_IDENTITY = (
    "seed",
    "train.progress",
    "data.data_dir",
    "distributed.",
    "mesh.",
    "model.remat",
    "eval.",
)


@dataclasses.dataclass
class Curve:
    """The runs (one per seed) of one configuration.

    Attributes:
      label: the fields that tell this configuration from the others, e.g.
        ``encoding.name=rope``.
      dirs: the runs' work directories, by seed.
      losses: per run, ``{step: logged training loss}``.
      identity: the flattened config fields that define the configuration.
    """

    label: str
    dirs: list[str]
    losses: list[dict[int, float]]
    identity: dict[str, Any]

    def steps(self) -> list[int]:
        """The steps every run of the curve logged."""
        common = set.intersection(*(set(run) for run in self.losses)) if self.losses else set()
        return sorted(common)

    def at(self, step: int) -> tuple[float, float | None, int]:
        """``(mean, sample standard deviation or None, seeds)`` of the loss at ``step``."""
        values = [run[step] for run in self.losses if step in run]
        if not values:
            return math.nan, None, 0
        spread = statistics.stdev(values) if len(values) > 1 else None
        return math.fsum(values) / len(values), spread, len(values)


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    flat = flatten(config)
    return {
        k: v
        for k, v in flat.items()
        if not any(k == p or (p.endswith(".") and k.startswith(p)) for p in _NOT_IDENTITY)
    }


def _labels(identities: Sequence[dict[str, Any]]) -> list[str]:
    """Each identity as the fields that differ between them (``field=value, ...``).

    An encoder hyperparameter (``encoding.hparams.*``) counts only where it differs between
    configurations of the same encoder: learned positions' ``max_len`` against RoPE, which has
    none, is told apart by ``encoding.name`` already.
    """

    def varies(key: str, group: Sequence[dict[str, Any]]) -> bool:
        return len({json.dumps(i.get(key), default=repr) for i in group}) > 1

    def differs(key: str) -> bool:
        if not key.startswith("encoding.hparams."):
            return varies(key, identities)
        names = {i.get("encoding.name") for i in identities}
        return any(
            varies(key, [i for i in identities if i.get("encoding.name") == name]) for name in names
        )

    keys = sorted({k for ident in identities for k in ident})
    differ = [k for k in keys if differs(k)]
    if not differ:
        return ["all"] * len(identities)
    return [", ".join(f"{k}={ident.get(k)}" for k in differ) for ident in identities]


def find_curves(sweep_dir: str, metric: str = "loss") -> list[Curve]:
    """The training curves of a sweep directory, in sweep order (``sweep.json``).

    Args:
      sweep_dir: a directory written by ``posenc sweep``.
      metric: the metrics-line field to read (``loss``).

    Raises:
      FileNotFoundError: no ``sweep.json`` or no point with metrics.
    """
    sweep = read_json(os.path.join(sweep_dir, SWEEP_FILE))
    if sweep is None:
        raise FileNotFoundError(f"no {SWEEP_FILE} in {sweep_dir}; run `posenc sweep` first")
    groups: dict[str, tuple[dict[str, Any], list[str], list[dict[int, float]]]] = {}
    for point in sweep["points"]:
        point_dir = os.path.join(sweep_dir, point["dir"])
        config = read_json(os.path.join(point_dir, CONFIG_FILE))
        lines = read_jsonl(os.path.join(point_dir, METRICS_FILE))
        if config is None or not lines:
            continue
        identity = _identity(config)
        key = json.dumps(sorted(identity.items()), default=repr)
        entry = groups.setdefault(key, (identity, [], []))
        entry[1].append(point_dir)
        entry[2].append({int(line["step"]): float(line[metric]) for line in lines})
    if not groups:
        raise FileNotFoundError(f"no point of {sweep_dir} has logged {METRICS_FILE} yet")
    identities = [g[0] for g in groups.values()]
    return [
        Curve(label, dirs, losses, identity)
        for label, (identity, dirs, losses) in zip(
            _labels(identities), groups.values(), strict=True
        )
    ]


def loss_table(curves: Sequence[Curve], steps: Sequence[int], digits: int = 3) -> list[str]:
    """Markdown rows: one per step, one column per curve, ``mean ± spread (n seeds)``."""
    header = ["step", *(c.label for c in curves)]
    rows = []
    for step in steps:
        cells = [str(step)]
        for curve in curves:
            mean, spread, n = curve.at(step)
            if n == 0:
                cells.append("—")
            elif spread is None:
                cells.append(f"{mean:.{digits}f}")
            else:
                cells.append(f"{mean:.{digits}f} ± {spread:.{digits}f}")
        rows.append(cells)
    return format_table(header, rows)


def plot_curves(path: str, curves: Sequence[Curve], title: str, ylabel: str = "training loss"):
    """Loss against step: the mean over seeds, the spread (± one standard deviation) shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.report.plots import plain_numbers

    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    for curve in curves:
        steps = curve.steps()
        stats = [curve.at(s) for s in steps]
        mean = np.array([m for m, _, _ in stats])
        spread = np.array([s or 0.0 for _, s, _ in stats])
        seeds = max(n for _, _, n in stats) if stats else 0
        (line,) = ax.plot(steps, mean, label=f"{curve.label} ({seeds} seeds)", linewidth=1.5)
        if seeds > 1:
            ax.fill_between(steps, mean - spread, mean + spread, color=line.get_color(), alpha=0.2)
    plain_numbers(ax)  # no "+1e4" offset over steps or losses close together
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\nshaded: ± one sample standard deviation over seeds", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def convergence_report(
    out_dir: str, panels: Sequence[tuple[str, str]], steps: Sequence[int] | None = None
) -> list[str]:
    """``report.md`` with, per panel (``(title, sweep directory)``), the loss table at ``steps``
    (default: a quarter, half, three quarters and all of the common steps) and a plot
    ``curves_<n>.png``; returns the paths written (report.md first)."""
    md = ["# Training loss against step", ""]
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, "report.md")]
    for number, (title, sweep_dir) in enumerate(panels, start=1):
        found = find_curves(sweep_dir)
        common = sorted(set.intersection(*(set(c.steps()) for c in found)))
        if steps is None:
            chosen = sorted(
                {common[max(0, round(len(common) * f) - 1)] for f in (0.25, 0.5, 0.75, 1)}
            )
        else:
            chosen = list(steps)
        plot = os.path.join(out_dir, f"curves_{number}.png")
        plot_curves(plot, found, title)
        md += [f"## {title}", "", f"Runs: `{sweep_dir}`.", ""]
        md += loss_table(found, chosen) + [""]
        md += [f"![{title}]({os.path.basename(plot)})", "", f"*{SPREAD}*", ""]
        paths.append(plot)
    with open(paths[0], "w") as f:
        f.write("\n".join(md))
    return paths
