"""Pretrained models past their training length: perplexity at 1-8 x L, RoPE models as released
and under PI, NTK, dynamic NTK, YaRN and Llama 3 scaling (zero-shot), the others as they are.

    # real checkpoints, fetched beforehand with your own tools (posenc never downloads):
    python experiments/pretrained_extrapolation.py /models/pythia-160m /models/gpt2 \\
        /models/bloom-560m /models/TinyLlama-1.1B --data tfds:pg19 --max-tokens 1000000
    # tiny: the test suite's random tiny models (tests/hf/golden) on a few stdlib files, CPU
    python experiments/pretrained_extrapolation.py --variant tiny

Writes ``extrapolation.md``, ``extrapolation.csv`` and ``extrapolation.png`` to ``--workdir``
(default ``runs/pretrained_extrapolation[_tiny]``), beside each model's imported run directory.
Run again to resume: imports and evaluations already made are kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from posenc.studies import pretrained_extrapolation as pe

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
# The tiny variant: one randomly initialised folder per family (tests/hf/make_golden.py), read at
# L = 32 (their max_position_embeddings; BLOOM states none), scored on these stdlib modules.
TINY_MODELS = ("llama", "gpt_neox", "bloom", "gpt2", "opt", "gemma3", "olmo3", "cohere2", "smollm3")
TINY_TEXTS = ("textwrap", "string", "bisect", "heapq", "colorsys", "fnmatch", "glob", "shlex")


def tiny_texts(folder: str) -> str:
    """A text folder of a few standard-library modules (the same on every machine of one Python
    version); returns its ``textdir:`` spec."""
    os.makedirs(folder, exist_ok=True)
    for name in TINY_TEXTS:
        module = __import__(name)
        with open(module.__file__, encoding="utf-8") as src:
            text = src.read()
        with open(os.path.join(folder, f"{name}.txt"), "w", encoding="utf-8") as dst:
            dst.write(text)
    return f"textdir:{folder}"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="Hugging Face model folders or posenc runs")
    parser.add_argument("--variant", choices=("tiny",), default=None)
    parser.add_argument(
        "--data", default=None, help="text Hugging Face models score: tfds:pg19, textdir:DIR"
    )
    parser.add_argument("--data-dir", default=None, help="data directory (default posenc's)")
    parser.add_argument("--workdir", help="experiment directory")
    parser.add_argument("--multiples", type=_ints, default=(1, 2, 4, 8), help="e.g. 1,2,4,8")
    parser.add_argument("--factor", type=int, default=None, help="RoPE s (default max multiple)")
    parser.add_argument("--max-tokens", type=int, default=0, help="tokens scored per length")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help="tokens per batch (default: each run's own; unset, sized from the memory budget)",
    )
    args = parser.parse_args(argv)
    workdir = args.workdir or os.path.join(
        "runs", "pretrained_extrapolation" + ("_tiny" if args.variant else "")
    )
    models, data, train_len = list(args.models), args.data, None
    if args.variant == "tiny":
        golden = os.path.join(REPO, "tests", "hf", "golden")
        models = models or [os.path.join(golden, name) for name in TINY_MODELS]
        data = data or tiny_texts(os.path.join(workdir, "texts"))
        train_len = 32
        args.max_tokens = args.max_tokens or 2048
    if not models:
        parser.error("give model folders (and --data for Hugging Face ones), or --variant tiny")
    plan = pe.Plan(
        multiples=args.multiples,
        factor=args.factor,
        train_len=train_len,
        max_tokens=args.max_tokens,
        batch_tokens=args.batch_tokens,
    )
    start = time.perf_counter()
    paths = pe.run(models, workdir, data, plan, data_dir=args.data_dir)
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
