"""The 2024-2026 positional encodings (issue 33) past the training length: p-RoPE, HoPE, Resonance
RoPE, FoPE, DAPE, stick-breaking attention, PaTH, truncated RoPE and GRAPE beside RoPE, NoPE,
ALiBi and FIRE, trained at L and evaluated on non-overlapping windows of 1, 2, 4, 8 and 16 x L
(ALiBi Table 2's protocol, ``alibi_table2.py``), two seeds each.

Each encoder runs with its defaults (the papers' settings as each module transcribes them),
except where it needs the training length: Resonance RoPE (its wavelengths are rounded below
the training length) and FoPE (its frequencies below ``2 pi / L_train`` are clipped) get
``L`` in their ``train_len`` (:func:`train_length_overrides`; a run also fills an unset one from
``train.seq_len``); FIRE its threshold ``L / 4`` (``alibi_table2.encoder_overrides``).
An encoder this installation does not register is left out (``experiments/recent_encoders.py``
names it). STRING (An et al. 2024) and DroPE (Gelberg et al. 2026) are not columns of this sweep:
STRING is an evaluation setting of the RoPE runs and DroPE a continuation of them, both made by
the script (``posenc.studies.drope``).

Variants (``--config configs/sweeps/recent_encoders.py:VARIANT``):

- ``tiny``: a 2-core CPU. 2 layers, width 64, 4 heads, float32, L = 64, 600 steps of 16 x 64
  bytes on ``pystdlib``; 16k validation tokens per length.
- ``gpu``: one GPU. 6 layers, width 512, 8 heads, bf16, L = 512, 2000 steps of 32 x 512 bytes;
  evaluated up to 16 x 512 = 8192, 128k tokens per length (not measured).

Passkey retrieval of the same encoders is ``configs/sweeps/recent_encoders_passkey.py``.

Run::

    python experiments/recent_encoders.py --variant tiny
"""

import os

import ml_collections

from posenc import encodings
from posenc.runs.config import load_module
from posenc.runs.sweep import product

_HERE = os.path.dirname(os.path.abspath(__file__))
_TABLE2 = load_module(os.path.join(_HERE, "alibi_table2.py"))

VARIANTS = ("tiny", "gpu")
MULTIPLES = (1, 2, 4, 8, 16)
SEEDS = (0, 1)
# The encoders, in its order; STRING is an evaluation option of RoPE (not a column).
NEW_ENCODERS = (
    "p_rope",
    "hope",
    "resonance",
    "fope",
    "dape",
    "stick_breaking",
    "path",
    "truncated_rope",
    "grape",
)
BASELINES = ("rope", "nope", "alibi", "fire")
# Encoders whose defaults need the training length, and the names that field may have.
NEEDS_TRAIN_LEN = ("resonance", "fope")
TRAIN_LEN_FIELDS = ("train_len", "max_train_len", "train_length")


def available(names: tuple[str, ...] = BASELINES + NEW_ENCODERS) -> tuple[list[str], list[str]]:
    """``(registered, missing)``: the encoders of ``names`` this installation has, and not."""
    known = set(encodings.names())
    return [n for n in names if n in known], [n for n in names if n not in known]


def train_length_overrides(name: str, seq_len: int) -> dict:
    """The training length in the hyperparameter encoder ``name`` takes it by (for
    :data:`NEEDS_TRAIN_LEN`; none for the others, or if it names none of
    :data:`TRAIN_LEN_FIELDS`)."""
    if name not in NEEDS_TRAIN_LEN:
        return {}
    fields = [f for f in TRAIN_LEN_FIELDS if f in encodings.hparam_names(name)]
    return {f"encoding.hparams.{fields[0]}": seq_len} if fields else {}


def encoder_point(name: str, seq_len: int) -> dict:
    """One column's overrides at training length ``seq_len``."""
    return {
        "encoding.name": name,
        **_TABLE2.encoder_overrides(name, seq_len),
        **train_length_overrides(name, seq_len),
    }


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"recent_encoders has variants {VARIANTS}, got {variant!r}")
    config = _TABLE2.get_config(variant)
    config.eval.multiples = MULTIPLES
    if variant == "tiny":
        config.train.update(steps=600, log_every=100, checkpoint_every=300)
        config.eval.max_tokens = 16_384
    else:
        config.train.steps = 2000
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    seq_len = get_config(variant).train.seq_len
    names, _ = available()
    points = product(**{"encoding.name": names, "seed": list(SEEDS)})
    for point in points:
        point.update(encoder_point(point["encoding.name"], seq_len))
    return points
