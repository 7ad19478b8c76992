"""Kazemnejad et al. 2023, *The Impact of Positional Encoding on Length Generalization in
Transformers*: decoder-only models with NoPE, T5's relative bias, ALiBi, rotary and absolute
positions on their tasks, ranked by mean reciprocal rank across tasks (the paper: NoPE 0.69, T5
0.55, ALiBi 0.50, rotary 0.33, absolute 0.22), with exact match of greedy generation as the
metric.

Variants:

- ``tiny``: three tasks a 2-layer model learns on a CPU, trained on lengths 1-8 and scored at
  4, 8 and 9-16 (``configs/tasks.py:tiny``, 1500 steps); two seeds.
- ``paper``: the paper's eight generated tasks (SCAN and PCFG need their TFDS data sets
  prepared; they are left out), each at the paper's lengths (``synthetic.PAPER_LENGTHS``: copy
  and reverse trained to 20 and tested to 40, the arithmetic tasks, parity and LEGO to 8 and 16),
  three seeds, a decoder of the paper's size (``configs/tasks.py:nope``).

"Absolute" is the learned table here (Kazemnejad et al.'s APE, as in GPT-2), with a row for every
position evaluated, of which training reaches only the first ones. Lengths are evaluated up to
twice the training length, as in the paper.

Run::

    python experiments/nope_ranking.py --variant tiny
"""

import os

from posenc.runs.config import load_module

_TASKS = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tasks.py"))

# The paper's generated tasks (SCAN and PCFG read prepared data sets; add them by hand).
NOPE_TASKS = (
    "copy",
    "reverse",
    "addition",
    "polynomial_evaluation",
    "sorting",
    "summation",
    "parity",
    "lego",
)
TINY_TASKS = ("copy", "reverse", "sorting")
ENCODINGS = ("nope", "t5", "alibi", "rope", "learned")
VARIANTS = ("tiny", "paper")
SEEDS = {"tiny": (0, 1), "paper": (0, 1, 2)}
TINY_STEPS = 1500


def get_config(variant: str = "tiny"):
    if variant not in VARIANTS:
        raise ValueError(f"nope_ranking has variants {VARIANTS}, got {variant!r}")
    return _TASKS.get_config("tiny" if variant == "tiny" else "nope")


def get_sweep(variant: str = "tiny") -> list[dict]:
    from posenc.data import synthetic
    from posenc.data.synthetic.tasks import length_ok

    config = get_config(variant)
    tasks = TINY_TASKS if variant == "tiny" else NOPE_TASKS
    points = []
    for task in tasks:
        train_len = config.train.seq_len
        if variant == "paper":  # the paper's ranges per task (train to L, test to about 2 L)
            train_len, test_len = synthetic.PAPER_LENGTHS[task]
        else:  # the paper's range too: seen lengths, then every length up to 2 L
            test_len = 2 * train_len
        lengths = tuple(n for n in range(1, test_len + 1) if length_ok(task, n))
        if variant == "tiny":  # fewer seen lengths (each evaluated length compiles)
            lengths = tuple(n for n in lengths if n > train_len or n % 4 == 0)
        overrides = {"train.seq_len": train_len, "eval.lengths": lengths}
        if variant == "tiny":  # copy's 62 symbols take longer to learn than tasks.py's 600 steps
            overrides["train.steps"] = TINY_STEPS
        # The learned table has a row for every evaluated position, trained only as far as the
        # training examples reach (Kazemnejad et al.'s absolute embeddings, as in GPT-2).
        rows = max(synthetic.row_width(task, n) for n in lengths)
        for name in ENCODINGS:
            for seed in SEEDS[variant]:
                point = {"data.source": f"synthetic:{task}", "encoding.name": name, "seed": seed}
                point.update(overrides)
                if name == "learned":
                    point["encoding.hparams.max_len"] = rows
                points.append(point)
    return points
