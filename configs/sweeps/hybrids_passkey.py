"""Passkey retrieval of the hybrid layer patterns (``configs/sweeps/hybrids.py``: iRoPE,
RNoPE-SWA, Gemma 3's local/global layers, SmolLM3, sliding-window RoPE, beside RoPE, NoPE and
ALiBi), each trained from scratch on ``synthetic:passkey`` (``configs/retrieval.py``: Landmark
Attention's passkey prompt at up to 288 byte tokens, the key at a uniform depth) and scored by
``posenc retrieval`` at 1, 2, 4, 8 and 16 x 288 tokens (:data:`LENGTHS`).

The architectures are ``hybrids.py``'s at the training length 288 (windows and chunks of
L / 2 and L / 4: 144 and 72 tokens), with its layer count.

Variants:

- ``tiny``: 4 layers, width 64, 4 heads, float32, 600 steps of 8 prompts (half of
  ``configs/retrieval.py:tiny``'s 1200, for the 2-core CPU's time); retrieval at three depths,
  four trials each.
- ``gpu``: 8 layers, width 256, 8 heads, 3000 steps of 32 prompts; five depths, 20 trials
  (not measured).

Run::

    python experiments/hybrids.py --variant tiny      # the perplexity table, then this
"""

import os

import ml_collections

from posenc.runs.config import load_config, load_module

_HERE = os.path.dirname(os.path.abspath(__file__))
_HYBRIDS = load_module(os.path.join(_HERE, "hybrids.py"))
_RETRIEVAL = os.path.join(_HERE, os.pardir, "retrieval.py")

VARIANTS = ("tiny", "gpu")
# Prompt lengths scored: 1, 2, 4, 8 and 16 x the training length.
LENGTHS = tuple(288 * m for m in _HYBRIDS.MULTIPLES)
# posenc retrieval's depths and trials per (length, depth).
SCORING = {
    "tiny": {"depths": (0.0, 0.5, 1.0), "trials": 4},
    "gpu": {"depths": (0.0, 0.25, 0.5, 0.75, 1.0), "trials": 20},
}


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"hybrids_passkey has variants {VARIANTS}, got {variant!r}")
    config = load_config(f"{_RETRIEVAL}:tiny")
    config.model.num_layers = _HYBRIDS.get_config(variant).model.num_layers
    if variant == "tiny":
        config.train.steps = 600
        config.eval.examples = 32
    else:
        config.model.update(model_dim=256, num_heads=8, mlp_dim=1024)
        config.train.update(batch_size=32, steps=3000)
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    seq_len = get_config(variant).train.seq_len
    return [{**_HYBRIDS.architecture(name, seq_len), "seed": 0} for name in _HYBRIDS.ARCHITECTURES]
