"""The command line shared by the sweep reproductions (``alibi_table2.py``,
``extrapolation_table.py``, ``ruoss_table1.py``, ``nope_ranking.py``): run the sweep, write the
report, print its table."""

from __future__ import annotations

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.report import sweep_and_report

CONFIGS = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "sweeps")
)


def main(
    config_name: str,
    description: str,
    argv: list[str] | None = None,
    *,
    variants: tuple[str, ...] = ("tiny", "gpu", "paper"),
    metrics: tuple[str, ...] = ("perplexity", "bits_per_byte", "loss"),
) -> int:
    """``--variant`` (one of ``variants``), ``--workdir``, ``--jobs``, ``--metric`` (one of
    ``metrics``, the first the default), ``--compile-cache`` (JAX's persistent compilation
    cache, by default ``<workdir>/compile_cache``: another seed of a point loads its compiled
    steps; ``none`` turns it off) and ``--config.<field>=<value>`` overrides (applied to every
    point, as with ``posenc sweep``)."""
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--variant", choices=variants, default=variants[0])
    parser.add_argument("--workdir", help=f"sweep directory (default runs/{config_name}_<variant>)")
    parser.add_argument(
        "--jobs", type=int, default=None, help="points at a time (default 2 for tiny, 1 otherwise)"
    )
    parser.add_argument("--metric", choices=metrics, default=metrics[0])
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="JAX's persistent compilation cache (default <workdir>/compile_cache; none: off)",
    )
    args = parser.parse_args(rest)
    workdir = args.workdir or os.path.join("runs", f"{config_name}_{args.variant}")
    jobs = args.jobs or (2 if args.variant == "tiny" else 1)
    cache = args.compile_cache or os.path.join(workdir, "compile_cache")
    start = time.perf_counter()
    spec = f"{os.path.join(CONFIGS, config_name)}.py:{args.variant}"
    points, paths = sweep_and_report(
        spec,
        workdir,
        overrides=overrides,
        jobs=jobs,
        metric=args.metric,
        compile_cache=None if cache == "none" else cache,
    )
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0 if all(p["status"] != "failed" for p in points) else 1
