"""Training throughput, model FLOP utilisation and memory, and long-window evaluation cost.

Per encoder, at one model size: training with ``posenc.runs.train.Trainer`` (tokens/s, step time,
MFU, peak memory) and scoring one window at each evaluation length with
``posenc.kinds.stream.Scorer``. What is measured and how (the MFU formula and its citation, where
the memory figures come from): :mod:`posenc.benchmark`.

    python experiments/throughput.py --size small --out runs/throughput          # GPU
    python experiments/throughput.py --size cpu --out runs/throughput_cpu        # seconds on CPU

Writes ``throughput_<size>.json`` and ``throughput_<size>.md`` to ``--out``.

On a noisy machine, compare encoders with ``--rounds N`` instead: everything is compiled first,
then each round times every encoder once (training steps and one window per length) in a
rotated order, and the report gives medians, min-max spreads and ratios to NoPE measured in the
same round (:mod:`posenc.benchmark.rounds`); it writes ``rounds_<size>.json`` and ``.md``:

    python experiments/throughput.py --size cpu --rounds 5 --eval-lengths 128,4096,16384 \
        --encoders nope,rope,alibi,kerple_log,xl,fire,t5,shaw --out runs/rounds_cpu

``--peer`` adds a training row for the same network written by hand in plain JAX
(:mod:`posenc.benchmark.peer`): its ratio to NoPE is what posenc's model code costs.

``--window W`` measures what an attention window and a layer pattern cost at evaluation
(:mod:`posenc.benchmark.windows`), in ``--rounds`` interleaved rounds (default 3): a sliding
window of ``W`` over ``--window-length`` tokens against the same tokens in full windows of
``W``, per token, and a ``local, local, local, global`` pattern against its layers' own costs;
it writes ``windows_<size>.json`` and ``.md``:

    python experiments/throughput.py --size cpu --window 512 --window-length 16384 \
        --pattern-length 4096 --rounds 5 --out runs/windows_cpu
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from posenc import encodings
from posenc.attention.core import IMPLEMENTATIONS
from posenc.benchmark import SIZES, Settings, rounds, run, windows, write_report
from posenc.benchmark.settings import ISOLATE


def _parse_args(argv: Sequence[str]) -> tuple[Settings, str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--encoders", default=",".join(encodings.names()), help="comma-separated encoder names"
    )
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    parser.add_argument(
        "--eval-lengths", default=None, help="comma-separated window lengths (default by size)"
    )
    parser.add_argument("--eval-repeats", type=int, default=3, help="timed runs per length")
    parser.add_argument("--attention-impl", choices=IMPLEMENTATIONS, default="auto")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="override the size's batch")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per-device peak")
    parser.add_argument("--data", default="pystdlib", help="data.source of the windows")
    parser.add_argument("--data-dir", default=None, help="data.data_dir")
    parser.add_argument(
        "--isolate",
        choices=ISOLATE,
        default="auto",
        help="one process per measurement (auto: where the device reports peak memory)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="interleaved rounds (every encoder once per round; ratios to NoPE per round)",
    )
    parser.add_argument("--no-train", action="store_true", help="with --rounds: evaluation only")
    parser.add_argument(
        "--peer",
        action="store_true",
        help="with --rounds: also time NoPE's network written by hand in plain JAX",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=0,
        help="the cost of a sliding window of this size and of a local/global pattern, only",
    )
    parser.add_argument(
        "--window-length", type=int, default=16384, help="with --window: the long window's tokens"
    )
    parser.add_argument(
        "--pattern-length",
        type=int,
        default=None,
        help="with --window: tokens of the pattern figures (default --window-length)",
    )
    parser.add_argument(
        "--window-encoder", default="rope", help="with --window: the encoder of every layer"
    )
    parser.add_argument("--out", default="runs/throughput", help="output directory")
    args = parser.parse_args(argv)
    lengths = args.eval_lengths
    if lengths is not None:
        lengths = [int(x) for x in lengths.split(",") if x.strip()]
    try:
        settings = Settings(
            size=args.size,
            encoders=[e for e in args.encoders.split(",") if e],
            steps=args.steps,
            warmup=args.warmup,
            eval_lengths=lengths,
            eval_repeats=args.eval_repeats,
            attention_impl=args.attention_impl,
            dtype=args.dtype,
            batch_size=args.batch_size,
            peak_tflops=args.peak_tflops,
            data=args.data,
            data_dir=args.data_dir,
            isolate=args.isolate,
            timeout=args.timeout,
        )
    except ValueError as e:
        parser.error(str(e))
    if args.rounds < 0:
        parser.error(f"--rounds must be >= 0, got {args.rounds}")
    return settings, args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    settings, args = _parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out
    if args.window:
        report = windows.run_window_rounds(
            settings,
            args.rounds or 3,
            encoder=args.window_encoder,
            window=args.window,
            length=args.window_length,
            pattern_length=args.pattern_length,
        )
        print(windows.write_report(report, out))
        return report
    if args.rounds:
        report = rounds.run_rounds(settings, args.rounds, train=not args.no_train, peer=args.peer)
        print(rounds.write_report(report, out))
        return report
    report = run(settings)
    print(write_report(report, out))
    return report


if __name__ == "__main__":
    main()
