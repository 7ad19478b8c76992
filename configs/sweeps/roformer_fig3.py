"""RoFormer Figure 3 (Su et al. 2021, Sec. 4.5): does RoPE make training converge faster?

Two panels, each a sweep of the same model with and without RoPE over several seeds (variant
``<scale>_<panel>``, e.g. ``tiny_mlm``):

- ``mlm`` (the figure's left panel, BERT against RoFormer): a bidirectional encoder
  (``model.causal = False``) trained with the masked-LM objective (BERT's 15 % / 80-10-10), learned
  absolute positions (BERT's) against RoPE.
- ``linear`` (the right panel, Performer with and without RoPE on Enwik8): a causal LM whose
  attention is the Performer's FAVOR+ linear attention (``model.attention_impl =
  linear_performer``; at ``tiny`` with m = 64 random features, the paper's ``d log d`` for head
  width 16), learned absolute positions against RoPE applied as in eq. (19).

Scales: ``tiny`` (2-core CPU; ALiBi Table 2's tiny model, L = 64, 800 steps, 3 seeds per line;
the whole figure in about 10 minutes) and ``gpu`` (Table 2's gpu model, L = 512, 3000 steps).
The paper trains on BookCorpus + Wikipedia (left) and Enwik8 (right); here ``pystdlib`` by
default, or any ``textdir:`` corpus with ``--config.data.source``.

Run::

    python experiments/roformer_fig3.py --variant tiny
"""

import os

from posenc.runs.config import load_module
from posenc.runs.sweep import product

_TABLE2 = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "alibi_table2.py"))

SCALES = ("tiny", "gpu")
PANELS = ("mlm", "linear")
SEEDS = (0, 1, 2)
# The byte tokenizer's 257 ids and the mask token of the masked-LM objective.
MLM_VOCAB = 258


def _split(variant: str) -> tuple[str, str]:
    scale, _, panel = variant.partition("_")
    if scale not in SCALES or panel not in PANELS:
        raise ValueError(
            f"roformer_fig3 variants are <scale>_<panel> with scale in {SCALES} and panel in "
            f"{PANELS}, e.g. tiny_mlm; got {variant!r}"
        )
    return scale, panel


def get_config(variant: str = "tiny_mlm"):
    scale, panel = _split(variant)
    config = _TABLE2.get_config(scale)
    config.eval.multiples = (1,)  # the figure is about training; one evaluation at L
    if scale == "tiny":
        config.train.update(steps=800, log_every=25, checkpoint_every=400)
        config.optim.warmup_steps = 50
    else:
        config.train.update(steps=3000, log_every=50, checkpoint_every=1000)
    if panel == "mlm":
        config.model.causal = False
        config.model.vocab_size = MLM_VOCAB
        config.train.objective = "masked_lm"
    else:
        config.model.attention_impl = "linear_performer"
        if scale == "tiny":  # the Performer's m = d log d random features: d = 16 here
            config.model.performer_features = 64
    return config


def get_sweep(variant: str = "tiny_mlm") -> list[dict]:
    seq_len = get_config(variant).train.seq_len
    points = product(**{"encoding.name": ["learned", "rope"], "seed": list(SEEDS)})
    for point in points:
        if point["encoding.name"] == "learned":  # BERT's table, as long as the window
            point["encoding.hparams.max_len"] = seq_len
    return points
