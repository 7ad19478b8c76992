"""Evaluation memory and time of a 135M-parameter Llama-shaped model (SmolLM2-135M's shape,
49,152-token vocabulary, random parameters: no download), with default settings, and the chunked
loss against forming every logit at once (:mod:`posenc.benchmark.eval_memory`).

    python experiments/eval_memory.py --lengths 2048 --out runs/eval_memory
    python experiments/eval_memory.py --lengths 2048,4096 --unchunked --out runs/eval_memory

``--loss-rounds N`` also times the loss alone, chunked and unchunked, over one window of each
length (``--no-cases``: only that). Each case runs in its own process (peak resident memory only
grows); writes
``eval_memory.json`` and ``eval_memory.md`` to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from posenc.benchmark.eval_memory import Case, loss_table, loss_times, run_case, table


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
    parser.add_argument(
        "--loss-rounds",
        type=int,
        default=0,
        help="time the loss alone (chunked by default, unchunked) over one window of each "
        "length, in this many interleaved rounds, for evaluation and for training",
    )
    parser.add_argument("--no-cases", action="store_true", help="only the loss times")
    parser.add_argument("--out", default="runs/eval_memory")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    cases = []
    for length in [] if args.no_cases else lengths:
        cases.append(Case(length, windows=args.windows))
        if args.unchunked:
            cases.append(Case(length, loss_chunk=0, windows=args.windows))
    results = []
    for case in cases:
        results.append(run_case(case))
        print(json.dumps(results[-1]), flush=True)
    losses = []
    for length in lengths if args.loss_rounds else []:
        for grad in (False, True):
            losses.append(loss_times(length, args.loss_rounds, grad))
            print(json.dumps(losses[-1]), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval_memory.json").write_text(json.dumps({"cases": results, "loss": losses}, indent=1))
    text = table(results) + "\n\n" + loss_table(losses) + "\n"
    (out / "eval_memory.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
