"""Where an encoder's training step (or one long evaluation window) spends its time, per
instruction, next to NoPE's.

The throughput benchmark (``experiments/throughput.py --rounds``) says how much an encoder costs
against NoPE; this says where, from XLA's trace of the compiled training step
(:mod:`posenc.benchmark.profile`): the step's wall time, its self time per kind of instruction
(fusions, dots, loops, broadcasts ...) beside the baseline's, and the costliest instructions
with the JAX operation each came from. One process, encoders one after the other: compare the
kinds within a run, and take ratios from the interleaved benchmark. ``--eval-length N``
profiles the scoring of one window of ``N`` tokens instead (the path ``auto`` picks for it,
``blocked`` for long windows), as ``throughput.py --rounds`` times it.

    python experiments/profile_step.py --size cpu --encoders nope,cope --steps 20 \
        --out runs/profile_cpu
    python experiments/profile_step.py --size cpu --encoders nope,fire --eval-length 4096

Writes ``profile_<size>.md`` to ``--out`` and prints it.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

import jax

from posenc import encodings
from posenc.benchmark import SIZES, Settings
from posenc.benchmark import profile as prof
from posenc.benchmark.rounds import _Eval, _Train
from posenc.devices.fits import compiler_options


def profile_encoder(settings: Settings, encoder: str, steps: int):
    """``(rows, wall seconds per step)`` of ``encoder``'s compiled training step."""
    train = _Train(settings, encoder)  # compiled and warmed up
    batch = train.trainer.global_batch(train.windows.batch(0))
    # The executable the step runs (compiled once with posenc's compiler options, then cached).
    text = train.trainer._step.compile(train.state, batch).as_text()
    state = train.state

    def run():
        nonlocal state
        state, metrics = train.trainer.step(state, batch)
        return metrics

    return prof.profile(run, steps, text)


def profile_window(settings: Settings, encoder: str, length: int, steps: int):
    """``(rows, wall seconds per window)`` of scoring one ``length``-token window."""
    window = _Eval(settings, encoder, length)  # compiled and run once
    # Compiled as the scorer compiles it (posenc's compiler options), so the names match.
    text = window.scorer.lower(1, length).compile(compiler_options()).as_text()
    return prof.profile(lambda: window.scorer.score(window.windows, 1), steps, text)


def markdown(
    results: dict[str, tuple[list[prof.OpTime], float]], top: int, what: str = "Training step"
) -> str:
    names = list(results)
    lines = [
        f"# {what} profile ({jax.devices()[0].platform}, {jax.device_count()} device(s))",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        "| wall ms per call | " + " | ".join(f"{results[n][1] * 1e3:.2f}" for n in names) + " |",
        "| instructions' self time, ms | "
        + " | ".join(f"{sum(r.seconds for r in results[n][0]) * 1e3:.2f}" for n in names)
        + " |",
    ]
    kinds = {n: {k: s for k, s, _ in prof.by_kind(results[n][0])} for n in names}
    order = sorted(
        {k for n in names for k in kinds[n]},
        key=lambda k: -max(kinds[n].get(k, 0.0) for n in names),
    )
    for kind in order[:top]:
        cells = " | ".join(f"{kinds[n].get(kind, 0.0) * 1e3:.2f}" for n in names)
        lines.append(f"| `{kind}` | {cells} |")
    for name in names:
        lines += ["", f"## {name}: the {top} costliest instructions", ""]
        lines += ["| ms | per call | instruction | shape | from |", "|---:|---:|---|---|---|"]
        for r in results[name][0][:top]:
            i = r.instruction
            lines.append(
                f"| {r.seconds * 1e3:.3f} | {r.calls:g} | `{i.name}` | `{i.shape[:40]}` | "
                f"`{i.op_name[-70:]}` |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--encoders", default="nope,cope", help="comma-separated, NoPE first")
    parser.add_argument("--steps", type=int, default=20, help="traced steps (or windows)")
    parser.add_argument(
        "--eval-length", type=int, default=None, help="profile one window of this many tokens"
    )
    parser.add_argument("--top", type=int, default=15, help="rows per table")
    parser.add_argument("--out", default="runs/profile", help="folder of the report")
    args = parser.parse_args(argv)
    names = [n for n in args.encoders.split(",") if n]
    unknown = sorted(set(names) - set(encodings.names()))
    if unknown:
        parser.error(f"unknown --encoders {unknown}; known: {', '.join(encodings.names())}")
    lengths = None if args.eval_length is None else (args.eval_length,)
    settings = Settings(
        size=args.size, encoders=tuple(names), steps=args.steps, warmup=3, eval_lengths=lengths
    )
    if args.eval_length is None:
        results = {n: profile_encoder(settings, n, args.steps) for n in names}
        report, stem = markdown(results, args.top), f"profile_{args.size}"
    else:
        results = {n: profile_window(settings, n, args.eval_length, args.steps) for n in names}
        what = f"Evaluation window ({args.eval_length} tokens)"
        report, stem = markdown(results, args.top, what), f"profile_{args.size}_{args.eval_length}"
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(report)
    print(report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
