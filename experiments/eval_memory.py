"""Evaluation memory and time of a 135M-parameter Llama-shaped model (SmolLM2-135M's shape,
49,152-token vocabulary, random parameters: no download), with default settings, and the chunked
loss against forming every logit at once (:mod:`posenc.benchmark.eval_memory`).

    python experiments/eval_memory.py --lengths 2048 --out runs/eval_memory
    python experiments/eval_memory.py --lengths 2048,4096 --unchunked --out runs/eval_memory

Each case runs in its own process (peak resident memory only grows); writes
``eval_memory.json`` and ``eval_memory.md`` to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from posenc.benchmark.eval_memory import Case, run_case, table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2048", help="comma-separated window lengths")
    parser.add_argument("--windows", type=int, default=4, help="windows scored per length")
    parser.add_argument(
        "--unchunked",
        action="store_true",
        help="also each length with model.loss_chunk=0 (every logit at once), batches sized as "
        "by default",
    )
    parser.add_argument("--out", default="runs/eval_memory")
    args = parser.parse_args(argv)
    cases = []
    for length in (int(x) for x in args.lengths.split(",")):
        cases.append(Case(length, windows=args.windows))
        if args.unchunked:
            cases.append(Case(length, loss_chunk=0, windows=args.windows))
    results = []
    for case in cases:
        results.append(run_case(case))
        print(json.dumps(results[-1]), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval_memory.json").write_text(json.dumps(results, indent=1))
    (out / "eval_memory.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
