"""ALiBi Table 2 (Press et al. 2022, "Train Short, Test Long"): the founding eight encoders
trained at one length L and evaluated on non-overlapping windows of 1, 2, 3, 5, 8 and 16 x L.
(``configs/sweeps/extrapolation.py`` adds every later encoder and randomized positions.)

Variants (``--config configs/sweeps/alibi_table2.py:VARIANT``):

- ``tiny`` (default): a 2-core CPU, about 5 minutes for all encoders including evaluation
  (measured with ``--jobs 2`` on an otherwise idle 2-core machine).
  2 layers, width 64, 4 heads, float32, L = 64, 1500 steps of 16 x 64 bytes on ``pystdlib``;
  64k validation tokens per length (the same bytes at every length).
- ``gpu``: one GPU, all encoders in about 10 minutes (estimated, see experiments/README.md).
  6 layers, width 512, 8 heads, bf16, L = 512, 1000 steps of 32 x 512 bytes on ``pystdlib``;
  evaluated up to 16 x 512 = 8192, 128k tokens per length.
- ``paper``: the paper's model shape (16 layers, width 1024, 8 heads, MLP 4096; ~200M parameters
  with bytes instead of the paper's 267k-word adaptive input) trained at L = 512 and evaluated at
  Table 2's lengths 512 ... 15512 on the whole validation split. Needs a real corpus:
  ``--config.data.source=textdir:/path/to/wikitext-103`` (a folder with ``train/``,
  ``validation/`` and ``test/`` text files) or ``--config.data.source=tfds:pg19
  --config.data.text_field=book_text``. Days on one GPU.

Per-encoder settings (the same at every scale, see ``encoder_overrides``):

- ``learned``: ``encoding.hparams.max_len = L``. A learned table cannot embed positions it has
  no row for, so its column shows "—" beyond L, as the paper leaves it out.
- ``t5``: buckets that reach L / 4, as T5's defaults (32 buckets up to distance 128) do at the
  paper's L = 512: ``max_distance = L // 4`` and ``num_buckets = min(32, L // 4)`` for L < 512,
  the defaults from 512 on. With the defaults at a small L, the buckets for distances L..127 would
  never be trained and every longer distance would share one of them (an artefact, not T5).
- ``fire`` and ``xpos`` (in the extended table): their length constants at the ratio their
  papers use to the training length: FIRE's threshold ``L`` starts at 512 for windows of 2048
  (``init_L = seq_len // 4``), xPos's ``scale_base`` is 512 for windows of 1024 (``seq_len //
  2``); the defaults from those lengths on. At L = 64 with the defaults, FIRE's threshold would
  lie beyond every trained position (no normalisation ever learned) and xPos would barely decay.
- ``deberta`` (in the extended table): its clip distance at the paper's ratio, ``k = 512`` for
  windows of 512: ``max_distance = seq_len`` below 512.

Run::

    posenc sweep --config configs/sweeps/alibi_table2.py:tiny --workdir runs/alibi_table2_tiny
    posenc report runs/alibi_table2_tiny

or ``python experiments/alibi_table2.py --variant tiny`` (both, then prints the table).
"""

import os

import ml_collections

from posenc import encodings
from posenc.runs.config import load_config
from posenc.runs.sweep import product

_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "base.py")

# The paper's four columns first (Table 2 order), then the other founding encoders.
PAPER_ORDER = ("sinusoidal", "rope", "t5", "alibi")
FOUNDING = (*PAPER_ORDER, "learned", "nope", "shaw", "xl")
# Evaluation lengths as multiples of the training length.
MULTIPLES = (1, 2, 3, 5, 8, 16)
# Table 2's L_valid for L = 512.
PAPER_LENGTHS = (512, 1012, 1512, 2512, 3512, 5512, 8512, 12512, 15512)
VARIANTS = ("tiny", "gpu", "paper")


def encoder_names(names: tuple[str, ...] = FOUNDING) -> list[str]:
    """The registered encoders among ``names`` (default: the founding eight), the paper's four
    first, then the others in the order given."""
    known = encodings.names()
    ordered = [n for n in PAPER_ORDER if n in names] + [n for n in names if n not in PAPER_ORDER]
    return [n for n in dict.fromkeys(ordered) if n in known]


def encoder_overrides(name: str, seq_len: int) -> dict:
    """Hyperparameters an encoder needs at training length ``seq_len`` (see the docstring)."""
    if name == "learned":
        return {"encoding.hparams.max_len": seq_len}
    if name == "t5" and seq_len < 512:
        reach = max(seq_len // 4, 2)
        return {
            "encoding.hparams.max_distance": reach,
            "encoding.hparams.num_buckets": min(32, reach),
        }
    # The later encoders' length constants, at the paper's ratio to its training length.
    if name == "fire" and seq_len < 2048:  # threshold L = 512 for windows of 2048
        return {"encoding.hparams.init_L": float(seq_len // 4)}
    if name == "xpos" and seq_len < 1024:  # scale_base = 512 for windows of 1024
        return {"encoding.hparams.scale_base": float(seq_len // 2)}
    if name == "deberta" and seq_len < 512:  # k = 512 for windows of 512
        return {"encoding.hparams.max_distance": seq_len}
    return {}


def get_config(variant: str = "tiny") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"alibi_table2 has variants {VARIANTS}, got {variant!r}")
    config = load_config(f"{_BASE}:base")  # configs/base.py; fields are set, never added
    # Non-overlapping windows, every token scored once (the paper's Tables 2-3).
    config.eval.mode = "nonoverlapping"
    config.eval.multiples = MULTIPLES
    if variant == "tiny":
        config.model.update(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32")
        config.optim.update(learning_rate=3e-3, warmup_steps=50)
        # 1500 steps: enough for sinusoidal, learned and ALiBi to agree within 1% at L (the
        # paper's "within a few percent"); 600 steps left them 20% apart.
        config.train.update(seq_len=64, batch_size=16, steps=1500, log_every=100)
        config.train.checkpoint_every = 500
        # 65536 tokens per length: 1024 windows of 64, ..., 64 windows of 1024.
        config.eval.update(batch_tokens=16_384, max_tokens=65_536)
    elif variant == "gpu":
        config.model.update(num_layers=6, model_dim=512, num_heads=8, mlp_dim=2048)
        config.model.dtype = "bfloat16"
        config.optim.update(learning_rate=1e-3, warmup_steps=100)
        config.train.update(seq_len=512, batch_size=32, steps=1000, log_every=100)
        config.train.checkpoint_every = 500
        config.eval.update(batch_tokens=65_536, max_tokens=131_072)
    else:  # paper
        config.model.update(num_layers=16, model_dim=1024, num_heads=8, mlp_dim=4096)
        config.model.dtype = "bfloat16"
        config.optim.update(learning_rate=3e-4, warmup_steps=4000)
        config.train.update(seq_len=512, batch_size=64, steps=100_000, log_every=200)
        config.train.checkpoint_every = 5000
        config.eval.lengths = PAPER_LENGTHS
        config.eval.update(batch_tokens=65_536, max_tokens=0)
        config.data.source = "textdir:data/wikitext-103"
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    seq_len = get_config(variant).train.seq_len
    points = product(**{"encoding.name": encoder_names(), "seed": [0]})
    for point in points:
        point.update(encoder_overrides(point["encoding.name"], seq_len))
    return points
