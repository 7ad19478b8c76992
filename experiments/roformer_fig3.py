"""RoFormer Figure 3: training loss against steps with and without RoPE, for masked-LM
pre-training (BERT's learned absolute positions against RoPE) and for causal LM with Performer
linear attention (absolute positions against RoPE, eq. 19), several seeds per line.

    python experiments/roformer_fig3.py --variant tiny      # 2-core CPU, about 10 minutes
    python experiments/roformer_fig3.py --variant gpu       # one GPU

Runs the sweeps ``configs/sweeps/roformer_fig3.py:<variant>_mlm`` and ``..._linear`` (finished
points are skipped, interrupted ones resumed) into ``--workdir`` (default
``runs/roformer_fig3_<variant>``), then writes ``report.md`` (the loss at a quarter, half, three
quarters and the end of training, mean ± standard deviation over seeds) and one plot per panel.
``--config.<field>=<value>`` overrides apply to every point.
"""

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.report.curves import convergence_report
from posenc.runs.sweep import run_sweep

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
CONFIG = os.path.normpath(os.path.join(ROOT, "configs", "sweeps", "roformer_fig3.py"))
PANELS = (
    ("mlm", "masked-LM pre-training: learned absolute (BERT) vs RoPE (Figure 3, left)"),
    ("linear", "causal LM with Performer linear attention, without vs with RoPE (Figure 3, right)"),
)


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "gpu"), default="tiny")
    parser.add_argument("--workdir", help="directory of both sweeps and the report")
    parser.add_argument(
        "--jobs", type=int, default=None, help="points at a time (default 2 for tiny, 1 otherwise)"
    )
    args = parser.parse_args(rest)
    workdir = args.workdir or os.path.join("runs", f"roformer_fig3_{args.variant}")
    jobs = args.jobs or (2 if args.variant == "tiny" else 1)
    start = time.perf_counter()
    failed = 0
    panels = []
    for panel, title in PANELS:
        sweep_dir = os.path.join(workdir, panel)
        points = run_sweep(
            f"{CONFIG}:{args.variant}_{panel}", sweep_dir, overrides=overrides, jobs=jobs
        )
        failed += sum(p["status"] == "failed" for p in points)
        panels.append((title, sweep_dir))
    paths = convergence_report(workdir, panels)
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
