"""DroPE (Gelberg et al. 2026) against YaRN: RoPE trained at L, continued with NoPE for a small
fraction of its steps, and evaluated at 1-16 x L beside RoPE as it is and under YaRN scaling at
evaluation (``posenc.studies.drope``, which states the recipe and where each setting comes from).

The source runs are ``configs/sweeps/recent_encoders.py``'s RoPE model (the issue-33 table's), so
the DroPE row there is this one::

    python experiments/drope.py --variant tiny     # 2-core CPU
    python experiments/drope.py --variant gpu      # one GPU

Writes ``report.md``, ``report.csv`` and ``perplexity_vs_length.png`` to ``--workdir`` (default
``runs/drope_<variant>``). Running it again skips what is finished. Extra
``--config.<field>=<value>`` arguments apply to the RoPE runs (and so to their continuations).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.runs.config import apply_overrides, load_config
from posenc.studies import drope

CONFIGS = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "sweeps")
)
# Seeds per variant: the tiny one is a check of the recipe, the gpu one the measurement.
SEEDS = {"tiny": (0,), "gpu": (0, 1)}


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "gpu"), default="tiny")
    parser.add_argument("--workdir", help="experiment directory (default runs/drope_<variant>)")
    parser.add_argument(
        "--fraction",
        type=float,
        default=drope.Plan.fraction,
        help="recalibration steps as a fraction of the RoPE run's (default 0.02, the paper's "
        "upper figure for pretrained models)",
    )
    parser.add_argument("--seeds", type=lambda t: tuple(int(x) for x in t.split(",")))
    parser.add_argument("--yarn-factor", type=int, default=None, help="default 16 (16 x L)")
    args = parser.parse_args(rest)
    config = load_config(f"{os.path.join(CONFIGS, 'recent_encoders.py')}:{args.variant}")
    config = apply_overrides(config, ["encoding.name=rope", "train.progress=False", *overrides])
    workdir = args.workdir or os.path.join("runs", f"drope_{args.variant}")
    plan = drope.Plan(fraction=args.fraction, yarn_factor=args.yarn_factor)
    start = time.perf_counter()
    paths = drope.run(config, workdir, plan, seeds=args.seeds or SEEDS[args.variant])
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
