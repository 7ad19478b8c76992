"""Retrieval trained from scratch: a decoder on ``synthetic:passkey`` (Landmark Attention's
passkey prompt at 248-288 byte tokens, the key at a uniform depth; posenc/data/synthetic/
retrieval.py), scored beyond its training length with ``posenc retrieval``.

Variants (``--config configs/retrieval.py:VARIANT``; ``--config.data.source=synthetic:<task>``
for ``niah_single_1``, ``niah_multikey_2`` or ``niah_multikey_3``, whose shortest prompts are
366, 366 and 445 bytes: raise ``train.seq_len`` with them):

- ``tiny``: 2 layers, width 64, 4 heads, prompts up to 288 bytes, 1200 steps of 8 prompts
  (learning rate 3e-3 after 50 warmup steps, cosine to 3e-4); the loss covers the whole prompt
  (a language model's), which teaches copying from the context early: the key sentence repeats
  its key. About 2.5 CPU minutes. With ALiBi it retrieves the key at 100 % in range (seeds 0
  and 1; tests/test_retrieval_run.py checks >= 95 %): its recency bias gives the previous-token
  attention a copying circuit needs from the start. RoPE has to learn that attention, and with
  this budget copies the key's digits in the wrong order (3-23 % in range); 2700 steps of 32
  prompts gave it 74-90 % (experiments/README.md).

Example::

    posenc train --config configs/retrieval.py:tiny --config.encoding.name=alibi \
      --workdir runs/passkey_alibi
    posenc retrieval --workdir runs/passkey_alibi --lengths 288,576,1152,2304 \
      --depths 0,0.25,0.5,0.75,1 --trials 20
"""

import os

from posenc.runs.config import load_config

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
    config.train.update(seq_len=288, batch_size=8, steps=1200, log_every=100)
    config.train.checkpoint_every = 500
    # posenc eval: exact match of the key after "input SEP" at these prompt lengths.
    config.eval.update(lengths=(256, 288), examples=64)
    return config
