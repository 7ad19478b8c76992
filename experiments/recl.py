"""Transformer-XL's relative effective context length (Dai et al. 2019, Appendix C), reproduced in
shape at small scale.

Trains the paper's comparison group on one data set, the runs differing only where the paper's
rows do (its Table 9 ablations):

- ``xl_memory``: Transformer-XL: its relative encoding with segment recurrence (``mem_len`` =
  training length);
- ``shaw_memory``: the same model with Shaw et al.'s relative encoding, recurrence kept;
- ``xl_no_memory``: Transformer-XL's encoding without recurrence;
- ``vanilla``: absolute sinusoids, no memory, and a fixed context: it reads at most its training
  length (the paper's vanilla Transformer, Al-Rfou et al. 2018).

All four read the training data in the same order (consecutive segments per batch row,
``train.order=consecutive``), so that they differ only in encoding and memory.

Each run is evaluated as usual (``eval.json`` at 1-16x the training length, with memory where the
run has it; ``report.md`` puts them side by side). Then every run scores the same validation
targets with exactly ``c`` tokens of context, ``c = start, start + delta, ...``
(:func:`posenc.analysis.recl.context_losses`; runs with memory read the context as training-length
segments with the memory carried), and :func:`posenc.analysis.recl.recl` gives the group's RECL at
``r`` = 0.1, 0.5 and 1.0. Writes ``recl.md`` (the table beside the paper's), ``recl.json`` and
``recl_losses.npz`` into ``--workdir``.

    python experiments/recl.py                 # tiny: CPU, about 10 minutes on 2 cores
    python experiments/recl.py --variant gpu   # 6 layers, width 512, length 128, 5k steps

Rerunning resumes finished or interrupted runs from their work directories.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from posenc.analysis.recl import context_losses, recl, relative_gains
from posenc.models.restore import load_model
from posenc.report import write_report
from posenc.runs.config import apply_overrides, load_config, open_source
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import train

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "base.py")
R_VALUES = (0.1, 0.5, 1.0)
# Dai et al. 2019, Table 9 (WikiText-103), as in shared/REFERENCE.md.
PAPER = {
    "xl_memory": ("Transformer-XL 151M", (900, 800, 700)),
    "shaw_memory": ("with Shaw et al. encoding (128M)", (400, 400, 300)),
    "xl_no_memory": ("without recurrence", None),
    "vanilla": ("vanilla Transformer", (128, 128, 128)),
}
# name: (encoding, memory?)
RUNS = {
    "xl_memory": ("xl", True),
    "shaw_memory": ("shaw", True),
    "xl_no_memory": ("xl", False),
    "vanilla": ("sinusoidal", False),
}
VARIANTS = {
    "tiny": {
        "config": "tiny",
        "overrides": (
            "model.num_layers=2",
            "train.seq_len=32",
            "train.batch_size=16",
            "train.steps=1000",
            "train.checkpoint_every=500",
            "train.log_every=50",
            "eval.multiples=1,2,4,8,16",
            "eval.max_tokens=8192",
            "eval.batch_tokens=8192",
        ),
        "start": 16,
        "delta": 16,
        "contexts": 12,  # 16 .. 192
        "targets": 512,
        "batch_tokens": 16_384,
    },
    "gpu": {
        "config": "base",
        "overrides": (
            "train.seq_len=128",
            "train.batch_size=32",
            "train.steps=5000",
            "optim.warmup_steps=500",
            "train.checkpoint_every=1000",
            "eval.multiples=1,2,4,8,16",
            "eval.max_tokens=262144",
        ),
        "start": 64,
        "delta": 64,
        "contexts": 16,  # 64 .. 1024
        "targets": 4096,
        "batch_tokens": 131_072,
    },
}


def _config(variant: dict, encoding: str, memory: bool, extra: list[str]):
    config = load_config(f"{CONFIG}:{variant['config']}")
    # Every run reads the training data in the same order (consecutive segments per row, as
    # Transformer-XL trains), so that the runs differ only in encoding and memory.
    order = "train.order=consecutive"
    overrides = [*variant["overrides"], order, f"encoding.name={encoding}", *extra]
    config = apply_overrides(config, overrides)
    mem_len = config.train.seq_len if memory else 0
    return apply_overrides(config, [f"model.mem_len={mem_len}"])


def _table(result: dict) -> str:
    lines = [
        "| run | RECL r=0.1 | r=0.5 | r=1.0 | paper (WikiText-103) r=0.1 / 0.5 / 1.0 |",
        "|---|---:|---:|---:|---|",
    ]
    for name, row in result["recl"].items():
        label, paper = PAPER[name]
        cells = " | ".join(str(row[str(r)]) for r in R_VALUES)
        ref = "/".join(map(str, paper)) if paper else "—"
        lines.append(f"| {name} | {cells} | {label}: {ref} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=tuple(VARIANTS), default="tiny")
    parser.add_argument("--workdir", help="output directory (default runs/recl_<variant>)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a config override for every run, e.g. --config data.source=textdir:/data/wt103",
    )
    args = parser.parse_args(argv)
    variant = VARIANTS[args.variant]
    workdir = args.workdir or os.path.join("runs", f"recl_{args.variant}")
    os.makedirs(workdir, exist_ok=True)
    began = time.perf_counter()
    timings = {}

    configs = {n: _config(variant, e, m, args.config) for n, (e, m) in RUNS.items()}
    for name, config in configs.items():
        start = time.perf_counter()
        train(config, os.path.join(workdir, name))
        evaluate_workdir(os.path.join(workdir, name), progress=False)
        timings[name] = round(time.perf_counter() - start, 1)
        print(f"{name}: trained and evaluated in {timings[name]:.0f}s", flush=True)
    write_report(workdir)

    any_config = next(iter(configs.values()))
    stream = open_source(any_config).split_stream(any_config.eval.split)
    contexts = [variant["start"] + k * variant["delta"] for k in range(variant["contexts"])]
    targets = np.linspace(max(contexts), len(stream) - 1, variant["targets"]).astype(np.int64)
    start = time.perf_counter()
    losses = {}
    for name, config in configs.items():
        model = load_model(os.path.join(workdir, name))
        segment = config.train.seq_len if config.model.mem_len else None
        # The paper's vanilla Transformer has a fixed context, its training length.
        fixed = config.train.seq_len if name == "vanilla" else None
        losses[name] = context_losses(
            model,
            stream,
            targets,
            contexts,
            segment_len=segment,
            max_context=fixed,
            batch_tokens=variant["batch_tokens"],
        )
    timings["context_losses"] = round(time.perf_counter() - start, 1)
    result = {
        "variant": args.variant,
        "train_seq_len": any_config.train.seq_len,
        "mem_len": {n: c.model.mem_len for n, c in configs.items()},
        "contexts": contexts,
        "delta": variant["delta"],
        "targets": len(targets),
        "recl": {
            name: {str(r): v for r, v in zip(R_VALUES, values, strict=True)}
            for name, values in _recl_rows(losses, variant).items()
        },
        "gains": {
            str(r): {
                n: [round(float(g), 5) for g in gs] for n, gs in relative_gains(losses, r).items()
            }
            for r in R_VALUES
        },
        "mean_loss_by_context": {
            n: [round(float(x), 4) for x in v.mean(1)] for n, v in losses.items()
        },
        "seconds": {**timings, "total": round(time.perf_counter() - began, 1)},
    }
    np.savez(os.path.join(workdir, "recl_losses.npz"), contexts=contexts, targets=targets, **losses)
    with open(os.path.join(workdir, "recl.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = "\n\n".join(
        [
            f"# RECL ({args.variant}), Dai et al. 2019 Appendix C",
            f"Training length {result['train_seq_len']}, contexts {contexts[0]}..{contexts[-1]} "
            f"step {variant['delta']}, {len(targets)} validation targets, threshold 0.01.",
            _table(result),
            "Mean loss (nats) of the targets by context:\n\n"
            + "\n".join(f"- {n}: {v}" for n, v in result["mean_loss_by_context"].items()),
            f"Seconds: {result['seconds']}",
        ]
    )
    with open(os.path.join(workdir, "recl.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


def _recl_rows(losses: dict[str, np.ndarray], variant: dict) -> dict[str, list[int]]:
    per_r = [recl(losses, start=variant["start"], delta=variant["delta"], r=r) for r in R_VALUES]
    return {name: [values[name] for values in per_r] for name in losses}


if __name__ == "__main__":
    raise SystemExit(main())
