"""Algorithmic tasks (``data.source = "synthetic:<task>"``, posenc/kinds/tasks.py): a decoder reads
``input SEP target``, is trained on the target tokens for inputs of length 1..``train.seq_len``,
and is scored at longer inputs by per-token accuracy and greedy exact match.

Variants (``--config configs/tasks.py:VARIANT``; ``--config.data.source=synthetic:<task>``):

- ``tiny``: a 2-core CPU in well under a minute per run: 2 layers, width 64, inputs 1-8,
  scored at 4, 8 (seen) and 12, 16, 24, 32 (unseen).
- ``ruoss``: Ruoss et al. 2023's model as their code sets it (``randomized_positional_encodings``,
  ``experiments/example.py`` and ``models/transformer.py``: 5 layers, width 64, 8 heads, MLP 256,
  dropout 0.1, batch 128, learning rate 1e-3 (under posenc's cosine schedule), 10,000
  steps), trained on inputs 1-40 and scored at
  41-500 in steps of 10 (and 10-40, seen), positions for randomization from [0, 2048). The paper's
  model is an encoder reading the input and blank output slots; ours is a decoder, as issue 10 and
  Kazemnejad et al. have it.
- ``nope``: a decoder of Kazemnejad et al. 2023's size (about 107M parameters: 12 layers, width
  768, 12 heads), trained on inputs 1-20, scored at 2-40 in steps of 2. The learning rate,
  schedule and steps are ours, not the paper's.

Example::

    posenc train --config configs/tasks.py:tiny --config.data.source=synthetic:reverse \
      --config.encoding.name=nope --workdir runs/reverse_nope
    posenc eval --workdir runs/reverse_nope && posenc report runs/reverse_nope
"""

import os

from posenc.runs.config import load_config

_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py")
VARIANTS = ("tiny", "ruoss", "nope")


def get_config(variant: str = "tiny"):
    if variant not in VARIANTS:
        raise ValueError(f"configs/tasks.py has variants {VARIANTS}, got {variant!r}")
    config = load_config(f"{_BASE}:base")
    config.data.source = "synthetic:reverse_string"
    config.encoding.name = "rope"
    config.train.max_position = 2048  # randomized positions' range (Ruoss et al.)
    config.eval.multiples = ()
    if variant == "tiny":
        config.model.update(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32")
        config.optim.update(learning_rate=3e-3, warmup_steps=50, weight_decay=0.0)
        config.train.update(seq_len=8, batch_size=32, steps=600, log_every=50)
        config.train.checkpoint_every = 300
        config.eval.update(lengths=(4, 8, 12, 16, 24, 32), examples=64)
    elif variant == "ruoss":
        config.model.update(num_layers=5, model_dim=64, num_heads=8, mlp_dim=256, dropout=0.1)
        config.model.dtype = "float32"
        config.optim.update(learning_rate=1e-3, warmup_steps=0, weight_decay=0.0, grad_clip=1.0)
        config.train.update(seq_len=40, batch_size=128, steps=10_000, log_every=100)
        config.train.checkpoint_every = 2000
        seen = (10, 20, 30, 40)
        config.eval.update(lengths=seen + tuple(range(41, 500, 10)) + (500,), examples=256)
    else:  # nope
        config.model.update(num_layers=12, model_dim=768, num_heads=12, mlp_dim=3072)
        config.model.dtype = "bfloat16"
        config.optim.update(learning_rate=3e-5, warmup_steps=500, weight_decay=0.05)
        config.train.update(seq_len=20, batch_size=64, steps=20_000, log_every=100)
        config.train.checkpoint_every = 2000
        config.eval.update(lengths=tuple(range(2, 41, 2)), examples=256)
    return config
