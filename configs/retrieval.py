"""Retrieval trained from scratch: a decoder on ``synthetic:passkey`` (Landmark Attention's
passkey prompt at 248-288 byte tokens, the key at a uniform depth; posenc/data/synthetic/
retrieval.py), scored beyond its training length with ``posenc retrieval``.

Variants (``--config configs/retrieval.py:VARIANT``; ``--config.data.source=synthetic:<task>``
for ``niah_single_1``, ``niah_multikey_2`` or ``niah_multikey_3``, whose shortest prompts are
366, 366 and 445 bytes: raise ``train.seq_len`` with them):

- ``tiny``: 2 layers, width 64, prompts up to 288 bytes, 1500 steps of 32 prompts (44 minutes on
  a heavily shared 2-core CPU). The loss covers the whole prompt (a language model's), which
  teaches copying from the context early: the key sentence repeats its key. At 1500 steps the
  model copies the key's digits but not yet their order (6 % exact match in range); 1200 more
  steps from it (``--init-from``, learning rate 1e-3) reach 74-90 % in range
  (experiments/README.md): 95 % needs a longer schedule.

Example::

    posenc train --config configs/retrieval.py:tiny --config.encoding.name=alibi \
      --workdir runs/passkey_alibi
    posenc retrieval --workdir runs/passkey_alibi --lengths 288,576,1152,2304 \
      --depths 0,0.25,0.5,0.75,1 --trials 20
"""

import os

from posenc.config import load_config

_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "base.py")
VARIANTS = ("tiny",)


def get_config(variant: str = "tiny"):
    if variant not in VARIANTS:
        raise ValueError(f"configs/retrieval.py has variants {VARIANTS}, got {variant!r}")
    config = load_config(f"{_BASE}:base")
    config.data.source = "synthetic:passkey"
    config.encoding.name = "rope"
    config.eval.multiples = ()
    config.model.update(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32")
    config.optim.update(learning_rate=3e-3, warmup_steps=50, weight_decay=0.0)
    # Prompt lengths in byte tokens (the separator before the answer included).
    config.train.update(seq_len=288, batch_size=32, steps=1500, log_every=100)
    config.train.checkpoint_every = 500
    # posenc eval: exact match of the key after "input SEP" at these prompt lengths.
    config.eval.update(lengths=(256, 288), examples=64)
    return config
