"""ALiBi Table 2 (Press et al. 2022): train every encoder at L, evaluate at 1-16 x L.

Runs the sweep ``configs/sweeps/alibi_table2.py:<variant>`` (skipping finished points, resuming
interrupted ones), writes the report and prints its table::

    python experiments/alibi_table2.py --variant tiny            # 2-core CPU, ~5 minutes
    python experiments/alibi_table2.py --variant gpu              # one GPU, ~10 minutes
    python experiments/alibi_table2.py --variant paper \\
        --config.data.source=textdir:/data/wikitext-103          # the paper's model size

Extra ``--config.<field>=<value>`` arguments apply to every point (as with ``posenc sweep``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.report import write_report
from posenc.sweep import run_sweep

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "sweeps")
CONFIG = os.path.normpath(os.path.join(CONFIG, "alibi_table2.py"))


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "gpu", "paper"), default="tiny")
    parser.add_argument("--workdir", help="sweep directory (default runs/alibi_table2_<variant>)")
    parser.add_argument(
        "--jobs", type=int, default=None, help="points at a time (default 2 for tiny, 1 otherwise)"
    )
    parser.add_argument(
        "--metric", choices=("perplexity", "bits_per_byte", "loss"), default="perplexity"
    )
    args = parser.parse_args(rest)
    workdir = args.workdir or os.path.join("runs", f"alibi_table2_{args.variant}")
    jobs = args.jobs or (2 if args.variant == "tiny" else 1)
    start = time.perf_counter()
    points = run_sweep(f"{CONFIG}:{args.variant}", workdir, overrides=overrides, jobs=jobs)
    paths = write_report(workdir, metric=args.metric)
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0 if all(p["status"] != "failed" for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
