"""Positional encodings in the translation Transformer: Vaswani et al. 2017 Table 3 row (E)
(learned absolute positions 25.7 against sinusoids 25.8 BLEU, newstest2013), RoFormer's WMT14
En-De table (Transformer-base 27.3, RoFormer 27.5) and Shaw et al.'s Table 1 (absolute 26.5,
relative 26.8), together with the rest of the founding encoders, trained short and evaluated by
source length.

Every encoder serves both stacks of the encoder-decoder: the bidirectional encoder and the
causal decoder (cross-attention carries no positional term, as in tensor2tensor).

Variants (``--config configs/sweeps/translation_encoders.py:VARIANT``):

- ``tiny`` (default): ``configs/translation.py:tiny`` on the embedded English-German corpus
  with a 512-piece SentencePiece vocabulary, trained only on pairs whose source has at most
  ``TINY_MAX_SRC_LEN`` pieces and evaluated on every validation pair, so BLEU by source length
  reads within the training lengths, up to 2x and up to 4x; two seeds; a 2-core CPU.
- ``paper``: the base model on WMT14 En-De (``configs/translation.py:base``), every length,
  one seed; prepare the data first (``posenc data prepare tfds:wmt14_translate/de-en``).

Run::

    python experiments/translation_encoders.py --variant tiny
"""

import os

import ml_collections

from posenc.runs.config import load_module

ENCODERS = {
    "sinusoidal": {},  # Vaswani et al.
    "learned": {},  # Table 3 row (E)
    "rope": {},  # RoFormer
    "shaw": {"max_distance": 16},  # Shaw et al. (relative positions only, k = 16)
    "t5": {},  # Raffel et al.'s bucketed bias
    "alibi": {},
    "nope": {},
    # The rest of the registry that serves both stacks (CoPE and the forgetting transformer are
    # causal-only and refused for the encoder), in order of how often they are compared.
    "xl": {},  # Dai et al.'s relative logits
    "kerple_log": {},
    "fire": {},
    "xpos": {},
    "deberta": {},
}
VARIANTS = ("tiny", "paper")
SEEDS = {"tiny": (0, 1), "paper": (0,)}
# Sources of at most this many pieces in training (the embedded corpus's sources have about 31
# pieces on average, at most about 110): validation buckets <= 32, <= 64 and <= 128.
TINY_MAX_SRC_LEN = 32


def _shaw_sweep():
    # The translation_shaw sweep defines the shared tiny run; loaded by path, as sweeps are.
    return load_module(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "translation_shaw.py")
    )


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"translation_encoders has variants {VARIANTS}, got {variant!r}")
    if variant == "paper":
        return _shaw_sweep().get_config("paper")
    config = _shaw_sweep().tiny_config()
    config.data.max_src_len = TINY_MAX_SRC_LEN
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    points = []
    for name, hparams in ENCODERS.items():
        point = {"encoding.name": name}
        point.update({f"encoding.hparams.{k}": v for k, v in hparams.items()})
        points.append(point)
    return [{**p, "seed": seed} for seed in SEEDS[variant] for p in points]
