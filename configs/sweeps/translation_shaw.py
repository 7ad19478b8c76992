"""Shaw et al. 2018, *Self-Attention with Relative Position Representations*, Tables 2 and 3:
translation BLEU of an encoder-decoder with relative positions only (no sinusoids) as the clip
distance ``k`` varies (Table 2: k = 0 gives 12.5, i.e. no position information; 1 gives 25.5;
2 and more 25.8-25.9, on En-De newstest2013), and with the key and value terms ablated (Table 3:
both 25.8, keys only 25.8, values only 25.3, neither 12.5), beside absolute sinusoids.

Variants (``--config configs/sweeps/translation_shaw.py:VARIANT``):

- ``tiny`` (default): ``configs/translation.py:tiny`` on the embedded English-German corpus with
  a 512-piece SentencePiece vocabulary (sentences of about 30 pieces, as word pieces are in the
  paper), k in {0, 1, 2, 4, 16, 64}, two seeds; a 2-core CPU. Coarse length buckets
  (``data.bucket_step`` 1.5, ``eval.bucket_step`` 2.0) keep the number of compiled shapes small.
- ``paper``: the paper's base model on WMT14 En-De (``configs/translation.py:base``), k in
  {0, 1, 2, 4, 16, 64, 256} and the ablations at k = 16, one seed; prepare the data first
  (``posenc data prepare tfds:wmt14_translate/de-en``).

Run::

    python experiments/translation_shaw.py --variant tiny
"""

import os

import ml_collections

from posenc.runs.config import load_config

_TRANSLATION = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "translation.py")
VARIANTS = ("tiny", "paper")
# Table 2's clip distances, and Table 3's ablations at the paper's k = 16.
CLIP_DISTANCES = (0, 1, 2, 4, 16, 64, 256)
# The tiny variant leaves out k = 256, for time: its training sources have at most 116 pieces
# (about 31 on average), so k = 64 already clips only distances that few pairs contain.
TINY_CLIP_DISTANCES = (0, 1, 2, 4, 16, 64)
ABLATIONS = {"keys only": (True, False), "values only": (False, True), "neither": (False, False)}
SEEDS = {"tiny": (0, 1), "paper": (0,)}
TINY_STEPS = 800


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"translation_shaw has variants {VARIANTS}, got {variant!r}")
    if variant == "paper":
        config = load_config(f"{_TRANSLATION}:base")
        config.unlock()
        config.data.source = "tfds:wmt14_translate/de-en"
        config.data.src_lang, config.data.tgt_lang = "en", "de"
        return config
    config = tiny_config()
    return config


def tiny_config() -> ml_collections.ConfigDict:
    """The tiny translation run both translation sweeps share: ``configs/translation.py:tiny``
    with a 512-piece SentencePiece vocabulary and ``TINY_STEPS`` steps."""
    config = load_config(f"{_TRANSLATION}:tiny")
    config.unlock()
    config.data.vocab = "sentencepiece"
    config.data.vocab_size = 512
    config.model.vocab_size = 512
    config.train.steps = TINY_STEPS
    config.train.update(log_every=50, checkpoint_every=400)
    config.eval.max_sentences = 500
    # Compiling for each bucket shape dominated a tiny run on a 2-core CPU (measured under
    # load: 17 training shapes at data.bucket_step 1.2, about 20 s each, half of the training
    # time; 379 s of evaluation, mostly compiling 32 scoring and 32 decoding shapes of the 500
    # sentences at eval.bucket_step 1.1). data.bucket_step 1.5: 7 training shapes at 24 %
    # padding (14 % at 1.2); eval.bucket_step 2.0: 4 + 4 evaluation shapes in 9 batches (the
    # outputs do not depend on the buckets: padding is masked exactly).
    config.data.bucket_step = 1.5
    config.eval.bucket_step = 2.0
    return config


def _shaw(k: int, keys: bool = True, values: bool = True) -> dict:
    point = {"encoding.name": "shaw", "encoding.hparams.max_distance": k}
    if not (keys and values):
        point.update({"encoding.hparams.keys": keys, "encoding.hparams.values": values})
    return point


def get_sweep(variant: str = "tiny") -> list[dict]:
    points = [{"encoding.name": "sinusoidal"}]
    points += [_shaw(k) for k in (TINY_CLIP_DISTANCES if variant == "tiny" else CLIP_DISTANCES)]
    points += [_shaw(16, keys, values) for keys, values in ABLATIONS.values()]
    if variant == "tiny":
        # The most telling points first, so that a run cut short (a busy CPU) has Table 2's
        # shape (no position, k = 1, k = 16) and Table 3's costly ablation (values only).
        first = [_shaw(0), _shaw(1), _shaw(16), _shaw(16, False, True), _shaw(16, True, False)]
        points = points[:1] + first + [p for p in points[1:] if p not in first]
    return [{**p, "seed": seed} for seed in SEEDS[variant] for p in points]
