"""Hybrid layer patterns past the training length (issue 31): iRoPE, RNoPE-SWA, Gemma 3's
local/global layers, SmolLM3 and sliding-window RoPE beside RoPE, NoPE and ALiBi.

1. Perplexity at 1-16 x the training length: the sweep ``configs/sweeps/hybrids.py:<variant>``
   and its report (``<workdir>/report.md``).
2. Passkey retrieval at 1-16 x the training length: the sweep
   ``configs/sweeps/hybrids_passkey.py:<variant>`` (each architecture trained on
   ``synthetic:passkey``), ``posenc retrieval`` on each run, and the report of
   ``<workdir>/passkey`` (its retrieval section).

::

    python experiments/hybrids.py --variant tiny     # 2-core CPU
    python experiments/hybrids.py --variant gpu      # one GPU

Running it again skips finished runs and retrievals. Extra ``--config.<field>=<value>``
arguments apply to every point of both sweeps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.report import sweep_and_report, write_report
from posenc.retrieval.rundir import retrieval_workdir
from posenc.runs.config import load_module
from posenc.runs.sweep import run_sweep
from posenc.workdir import RunDir

CONFIGS = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "sweeps")
)


def passkey(variant: str, workdir: str, overrides: list[str], jobs: int, cache: str | None):
    """Trains the passkey sweep, scores each finished run's retrieval (once) and writes the
    folder's report; returns the report's paths."""
    spec = os.path.join(CONFIGS, "hybrids_passkey.py")
    scoring = load_module(spec).SCORING[variant]
    lengths = load_module(spec).LENGTHS
    points = run_sweep(
        f"{spec}:{variant}", workdir, overrides=overrides, jobs=jobs, compile_cache=cache
    )
    for point in points:
        if point["status"] not in ("done", "skipped"):
            continue
        run_dir = os.path.join(workdir, point["dir"])
        if next(RunDir(run_dir).retrieval_files(), None) is not None:
            continue
        start = time.perf_counter()
        record = retrieval_workdir(
            run_dir, tasks=("passkey",), lengths=lengths, progress=True, **scoring
        )
        took = time.perf_counter() - start
        print(f"{point['name']}: effective length {record['effective_length']} ({took:.0f}s)")
    return write_report(workdir, metric="exact_match")


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "gpu"), default="tiny")
    parser.add_argument("--workdir", help="output directory (default runs/hybrids_<variant>)")
    parser.add_argument("--jobs", type=int, help="points at a time (default 2 tiny, 1 gpu)")
    parser.add_argument(
        "--skip-passkey", action="store_true", help="the perplexity table only (step 1)"
    )
    args = parser.parse_args(rest)
    workdir = args.workdir or os.path.join("runs", f"hybrids_{args.variant}")
    jobs = args.jobs or (2 if args.variant == "tiny" else 1)
    cache = os.path.join(workdir, "compile_cache")
    start = time.perf_counter()
    points, paths = sweep_and_report(
        f"{os.path.join(CONFIGS, 'hybrids.py')}:{args.variant}",
        workdir,
        overrides=overrides,
        jobs=jobs,
        compile_cache=cache,
    )
    print(f"perplexity table: {time.perf_counter() - start:.0f}s")
    failed = any(p["status"] == "failed" for p in points)
    if not args.skip_passkey:
        passkey_dir = os.path.join(workdir, "passkey")
        paths += passkey(args.variant, passkey_dir, overrides, jobs, cache)
    for path in paths:
        if path.endswith("report.md"):
            with open(path) as f:
                print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
