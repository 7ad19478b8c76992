"""The extrapolation table extended (issue 9): ALiBi Table 2's protocol (``alibi_table2.py``, the
same model, training and evaluation at every scale) for every registered encoder (the founding
eight, KERPLE, FIRE, dynamic position bias, xPos, CoPE, PoPE, the forgetting transformer,
DeBERTa, conv, CAPE and any plugin), plus RoPE and sinusoidal trained and evaluated with randomized
positions (Ruoss et al. 2023: a sorted random subset of [0, 2048) per batch, at evaluation too,
as in the paper), and Transformer-XL with its segment recurrence (``model.mem_len`` = L: trained
on consecutive segments, each evaluation window scored with the memory of the L tokens before
it).

Variants: ``tiny`` (a 2-core CPU), ``gpu``, ``paper`` (see ``alibi_table2.py``).

Run::

    python experiments/extrapolation_table.py --variant tiny     # sweep, report, table
"""

import os

from posenc.runs.config import load_module
from posenc.runs.sweep import product

_TABLE2 = load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "alibi_table2.py"))

# Encoders also trained with randomized positions (the randomized-PE paper's comparison).
RANDOMIZED = ("rope", "sinusoidal")
# The range randomized positions are drawn from (Ruoss et al. 2023).
MAX_POSITION = 2048


def get_config(variant: str = "tiny"):
    config = _TABLE2.get_config(variant)
    config.train.max_position = MAX_POSITION
    return config


def get_sweep(variant: str = "tiny") -> list[dict]:
    from posenc import encodings

    seq_len = get_config(variant).train.seq_len
    names = _TABLE2.encoder_names(tuple(_TABLE2.FOUNDING) + encodings.names())
    points = product(**{"encoding.name": names, "seed": [0]})
    points += [
        {"encoding.name": name, "seed": 0, "train.positions": "randomized"}
        for name in RANDOMIZED
        if name in names
    ]
    if "xl" in names:  # Transformer-XL with its segment recurrence (memory of one window)
        points.append({"encoding.name": "xl", "seed": 0, "model.mem_len": seq_len})
    for point in points:
        point.update(_TABLE2.encoder_overrides(point["encoding.name"], seq_len))
    return points
