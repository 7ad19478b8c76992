"""RoFormer Figure 2: long-term decay of RoPE (Su et al., arXiv 2104.09864, Section 3.4.3).

Plots the paper's "relative upper bound" (1/(d/2)) * sum_{j=1}^{d/2} |S_j| against the
relative distance, computed exactly by :func:`posenc.analysis.theory.rope_relative_upper_bound`, and
the same bound for larger RoPE bases over a long range. No training; runs in about a second on a
CPU:

    python experiments/roformer_decay.py --out runs/roformer_decay

Writes to --out:
  roformer_fig2.csv         distance 0..--max-distance, one column per base
  roformer_decay_long.csv   distance 0..--long-max-distance, one column per base
  roformer_fig2.png         the paper's figure: d=--dim, base 10000, distance 0..--max-distance
  roformer_decay_bases.png  every base on a log distance axis up to --long-max-distance
"""

from __future__ import annotations

import argparse
import csv
import pathlib
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from posenc.analysis.theory import rope_relative_upper_bound, rope_thetas

PAPER_BASE = 10000.0
SUMMARY_DISTANCES = (0, 50, 100, 250)


def _base_label(base: float) -> str:
    return str(int(base)) if float(base).is_integer() else repr(float(base))


def column_name(base: float) -> str:
    """CSV column holding the bound for ``base``, e.g. ``base_10000``."""
    return f"base_{_base_label(base)}"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/roformer_decay", help="output directory")
    parser.add_argument(
        "--max-distance", type=int, default=250, help="last distance of Figure 2 (paper: 250)"
    )
    parser.add_argument(
        "--long-max-distance", type=int, default=65536, help="last distance of the long range"
    )
    parser.add_argument("--dim", type=int, default=128, help="head dimension d (paper: 128)")
    parser.add_argument(
        "--bases", default="10000,500000,1000000", help="comma-separated RoPE bases to compare"
    )
    args = parser.parse_args(argv)
    if args.max_distance < 1 or args.long_max_distance < 1:
        parser.error("--max-distance and --long-max-distance must be >= 1")
    try:
        args.bases = [float(b) for b in args.bases.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--bases must be comma-separated numbers, got {args.bases!r}")
    if not args.bases:
        parser.error("--bases must name at least one base")
    try:
        for base in [PAPER_BASE, *args.bases]:
            rope_thetas(args.dim, base)
    except ValueError as e:
        parser.error(str(e))
    return args


def _write_csv(path: pathlib.Path, distances: np.ndarray, table: dict[float, np.ndarray]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["distance", *(column_name(b) for b in table)])
        for row, dist in enumerate(distances):
            # repr round-trips float64, so the CSV holds the exact values.
            writer.writerow([int(dist), *(repr(float(v[row])) for v in table.values())])


def _plot_fig2(path: pathlib.Path, distances: np.ndarray, bound: np.ndarray, dim: int) -> None:
    fig = Figure(figsize=(5.0, 3.6), dpi=150)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(distances, bound, linewidth=1.0)
    ax.set_xlabel("relative distance")
    ax.set_ylabel("relative upper bound")
    ax.set_xlim(distances[0], distances[-1])
    ax.set_title(f"Long-term decay of RoPE (d={dim}, base={_base_label(PAPER_BASE)})", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def _octave_means(distances: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean bound over each octave [2^k, 2^(k+1)), placed at the octave's geometric centre."""
    centres, means = [], []
    k = 0
    while 2**k <= distances[-1]:
        mask = (distances >= 2**k) & (distances < 2 ** (k + 1))
        centres.append(2**k * np.sqrt(2.0))
        means.append(bound[mask].mean())
        k += 1
    return np.asarray(centres), np.asarray(means)


def _plot_bases(
    path: pathlib.Path, distances: np.ndarray, table: dict[float, np.ndarray], dim: int
) -> None:
    fig = Figure(figsize=(6.4, 4.0), dpi=150)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positive = distances >= 1  # distance 0 has no place on a log axis
    for base, bound in table.items():
        # The raw bound oscillates strongly; the octave means show the trend.
        (line,) = ax.plot(distances[positive], bound[positive], linewidth=0.3, alpha=0.2)
        centres, means = _octave_means(distances[positive], bound[positive])
        ax.plot(
            centres,
            means,
            marker="o",
            markersize=3,
            linewidth=1.6,
            color=line.get_color(),
            label=f"base {_base_label(base)} (octave mean)",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlim(1, distances[-1])
    ax.set_xlabel("relative distance")
    ax.set_ylabel("relative upper bound")
    ax.set_title(f"RoPE long-term decay by base (d={dim})", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    short = np.arange(args.max_distance + 1)
    long = np.arange(args.long_max_distance + 1)
    short_table = {b: rope_relative_upper_bound(short, args.dim, b) for b in args.bases}
    long_table = {b: rope_relative_upper_bound(long, args.dim, b) for b in args.bases}
    paper = short_table.get(PAPER_BASE)
    if paper is None:
        paper = rope_relative_upper_bound(short, args.dim, PAPER_BASE)

    _write_csv(out / "roformer_fig2.csv", short, short_table)
    _write_csv(out / "roformer_decay_long.csv", long, long_table)
    _plot_fig2(out / "roformer_fig2.png", short, paper, args.dim)
    _plot_bases(out / "roformer_decay_bases.png", long, long_table, args.dim)

    shown = [d for d in SUMMARY_DISTANCES if d <= args.max_distance]
    print(f"RoPE relative upper bound, d={args.dim} (RoFormer Fig. 2 is base 10000)")
    print(f"{'base':>9} " + " ".join(f"{'r=' + str(d):>7}" for d in shown) + "  r@<=1/4 of r=0")
    for base in args.bases:
        bound = long_table[base]
        quarter = np.flatnonzero(bound <= bound[0] / 4)
        first = str(int(quarter[0])) if quarter.size else f"> {args.long_max_distance}"
        values = " ".join(f"{short_table[base][d]:7.3f}" for d in shown)
        print(f"{_base_label(base):>9} {values}  {first:>14}")
    print(f"wrote {out}/roformer_fig2.csv, roformer_decay_long.csv, *.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
