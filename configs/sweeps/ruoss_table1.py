"""Ruoss et al. 2023, *Randomized Positional Encodings Boost Length Generalization of
Transformers*, Table 1's shape: tasks x encodings, accuracy averaged over the unseen lengths.

Each encoding that takes positions is trained twice, with contiguous positions and with
randomized ones (a sorted random subset of [0, 2048) per batch, evaluated the same way, as the
paper does); NoPE takes none. The paper's finding to test: randomizing raises the average
accuracy over unseen lengths (by 12.0 points across its 15 tasks).

Variants:

- ``tiny``: three tasks a 2-layer model learns on a CPU in a few hundred steps, on inputs 1-8,
  scored up to 32 (``configs/tasks.py:tiny``); two seeds (entries are their mean and spread).
- ``paper``: all 15 tasks at the paper's lengths (train 1-40, test 41-500) with the reference
  code's model (``configs/tasks.py:ruoss``); one seed per point (the paper takes the best of 10
  seeds x 3 learning rates: add ``seed`` values to compare like with like).

Run::

    python experiments/ruoss_table1.py --variant tiny
"""

import os

from posenc.runs.config import load_module

_TASKS = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tasks.py"))

TINY_TASKS = ("even_pairs", "reverse_string", "bucket_sort")
# The paper's encodings: none, sin/cos, relative (Transformer-XL), ALiBi, RoPE, learned.
ENCODINGS = ("nope", "sinusoidal", "xl", "alibi", "rope", "learned")
TINY_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi")
VARIANTS = ("tiny", "paper")
SEEDS = {"tiny": (0, 1), "paper": (0,)}


def get_config(variant: str = "tiny"):
    if variant not in VARIANTS:
        raise ValueError(f"ruoss_table1 has variants {VARIANTS}, got {variant!r}")
    return _TASKS.get_config("tiny" if variant == "tiny" else "ruoss")


def get_sweep(variant: str = "tiny") -> list[dict]:
    config = get_config(variant)
    from posenc.data import synthetic
    from posenc.data.synthetic.tasks import length_ok

    tasks = TINY_TASKS if variant == "tiny" else synthetic.RUOSS_TASKS
    names = TINY_ENCODINGS if variant == "tiny" else ENCODINGS
    points = []
    for task in tasks:
        # A length the task cannot produce (modular arithmetic: odd ones only) is replaced by
        # the next shorter one, as Delétang et al.'s code does.
        lengths = tuple(
            dict.fromkeys(
                n if length_ok(task, n) else n - 1
                for n in config.eval.lengths
                if length_ok(task, n) or length_ok(task, n - 1)
            )
        )
        rows = max(synthetic.row_width(task, n) for n in lengths)
        for name in names:
            modes = ("contiguous",) if name == "nope" else ("contiguous", "randomized")
            for mode, seed in ((m, s) for m in modes for s in SEEDS[variant]):
                point = {"data.source": f"synthetic:{task}", "encoding.name": name, "seed": seed}
                point["train.positions"] = mode
                if lengths != tuple(config.eval.lengths):
                    point["eval.lengths"] = lengths
                if name == "learned":  # a row for every position evaluated (or drawn)
                    point["encoding.hparams.max_len"] = (
                        rows if mode == "contiguous" else config.train.max_position
                    )
                points.append(point)
    return points
