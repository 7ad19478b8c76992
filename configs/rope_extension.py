"""Extending RoPE's context (YaRN, Peng et al. 2023; position interpolation, Chen et al. 2023):
the base RoPE run and the fine-tunes of ``posenc.studies.rope_extension``.

Variants (``--variant``): ``tiny`` (2-core CPU, a few minutes: ALiBi Table 2's tiny model at
L = 64, 1500 steps; fine-tunes of 200 steps at 4 x 64 = 256) and ``gpu`` (Table 2's gpu model
at L = 512; fine-tunes of 400 steps at 2048, as YaRN's 400).

Run::

    python experiments/rope_extension.py --variant tiny
"""

import os

from posenc.runs.config import load_module

_TABLE2 = load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweeps", "alibi_table2.py")
)
VARIANTS = ("tiny", "gpu")


def get_config(variant: str = "tiny"):
    """The base run: plain RoPE, trained and evaluated as in ALiBi Table 2's sweep."""
    if variant not in VARIANTS:
        raise ValueError(f"rope_extension has variants {VARIANTS}, got {variant!r}")
    config = _TABLE2.get_config(variant)
    config.encoding.name = "rope"
    return config


def get_plan(variant: str = "tiny") -> dict:
    """``posenc.studies.rope_extension.Plan`` fields: the extension factor and the fine-tunes."""
    if variant == "tiny":
        return {"factor": 4, "finetune_steps": 200, "finetune_warmup": 20}
    return {"factor": 4, "finetune_steps": 400, "finetune_warmup": 20}
