"""Passkey retrieval of the 2024-2026 encoders (``configs/sweeps/recent_encoders.py``: the issue's
new encoders beside RoPE, NoPE, ALiBi and FIRE), each trained from scratch on
``synthetic:passkey`` (``configs/retrieval.py``: Landmark Attention's passkey prompt at up to 288
byte tokens, the key at a uniform depth) and scored by ``posenc retrieval`` at 1, 2, 4, 8 and
16 x 288 tokens (:data:`LENGTHS`), as ``hybrids_passkey.py`` does for the hybrids.

Variants:

- ``tiny``: 2 layers, width 64, 4 heads, float32, 300 steps of 8 prompts (a quarter of
  ``configs/retrieval.py:tiny``'s 1200, for the 2-core CPU's time: 13 trainings), seed 0 only;
  retrieval at three depths, four trials each. At twice this budget no architecture of the
  hybrids experiment retrieved at all (experiments/README.md), so expect zeros: the part checks
  that every encoder runs the protocol, and is there to be run on GPU.
- ``gpu``: 6 layers, width 256, 8 heads, 3000 steps of 32 prompts, seeds 0 and 1; five depths,
  20 trials (not measured).

Run::

    python experiments/recent_encoders.py --variant tiny      # the perplexity table, then this
"""

import os

import ml_collections

from posenc.runs.config import load_config, load_module
from posenc.runs.sweep import product

_HERE = os.path.dirname(os.path.abspath(__file__))
_RECENT = load_module(os.path.join(_HERE, "recent_encoders.py"))
_RETRIEVAL = os.path.join(_HERE, os.pardir, "retrieval.py")

VARIANTS = ("tiny", "gpu")
# Prompt lengths scored: 1, 2, 4, 8 and 16 x the training length.
LENGTHS = tuple(288 * m for m in _RECENT.MULTIPLES)
SEEDS = {"tiny": (0,), "gpu": (0, 1)}
# posenc retrieval's depths and trials per (length, depth).
SCORING = {
    "tiny": {"depths": (0.0, 0.5, 1.0), "trials": 4},
    "gpu": {"depths": (0.0, 0.25, 0.5, 0.75, 1.0), "trials": 20},
}


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"recent_encoders_passkey has variants {VARIANTS}, got {variant!r}")
    config = load_config(f"{_RETRIEVAL}:tiny")
    if variant == "tiny":
        config.train.update(steps=300, checkpoint_every=300)
        config.eval.examples = 32
    else:
        config.model.update(num_layers=6, model_dim=256, num_heads=8, mlp_dim=1024)
        config.train.update(batch_size=32, steps=3000)
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    seq_len = get_config(variant).train.seq_len
    names, _ = _RECENT.available()
    points = product(**{"encoding.name": names, "seed": list(SEEDS[variant])})
    for point in points:
        point.update(_RECENT.encoder_point(point["encoding.name"], seq_len))
    return points
