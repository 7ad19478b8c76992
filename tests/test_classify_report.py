"""posenc.report.classify: the task table at the training length and the table by example
length, from hand-made eval.json files (two seeds of RoPE, one learned run)."""

from __future__ import annotations

import csv
import os

import pytest

from posenc.report import write_report
from posenc.workdir import write_json

MODEL = {"num_layers": 2, "model_dim": 32, "num_heads": 4, "mlp_dim": 64, "head_dim": None,
         "norm": "layernorm", "dtype": "float32", "num_params": 1000}  # fmt: skip


def _run(root, name, encoding, seed, overall, buckets):
    d = os.path.join(root, name)
    os.makedirs(d)
    results, lo = [], 0
    for (hi, label), acc in zip(((16, "<=1x"), (32, "1x-2x")), buckets, strict=True):
        row = {"length": hi, "lo": lo, "label": label, "examples": 10}
        row.update({"unrepresentable": True} if acc is None else {"accuracy": acc, "f1": acc})
        results.append(row)
        lo = hi
    write_json(
        os.path.join(d, "eval.json"),
        {"encoding": encoding, "encoding_hparams": {}, "objective": "classification",
         "task": None, "train_seq_len": 16, "train_steps": 10, "checkpoint_step": 10,
         "finished": True, "seed": seed, "model": MODEL, "mode": "nonoverlapping",
         "positions": "contiguous", "data": {"source": "tsv:/x"}, "device": "1 x cpu",
         "split": "validation", "metric": "accuracy", "classes": ["a", "b"],
         "overall": {"examples": 20, "accuracy": overall, "f1": overall / 2, "matthews": 0.1,
                     "loss": 0.5, "truncated": 3},
         "results": results},
    )  # fmt: skip


def test_tables_average_seeds_and_dash_what_an_encoder_cannot_read(tmp_path):
    root = str(tmp_path)
    _run(root, "rope_0", "rope", 0, 0.8, (0.9, 0.7))
    _run(root, "rope_1", "rope", 1, 0.6, (0.7, 0.5))
    _run(root, "learned_0", "learned", 0, 0.5, (0.5, None))
    paths = write_report(root)
    md = open(paths[0]).read()
    # RoPE: accuracy (0.8 + 0.6) / 2 x 100 = 70.00, sample sd 0.1414 x 100 = 14.14.
    assert " 70.00 ± 14.14 |" in md and " 35.00 ± 7.07 |" in md
    assert "|   <=1x (<= 16) |" in md
    by_length = md[md.index("## By example length") :]
    rows = {line.split("|")[1].strip(): line for line in by_length.splitlines() if "x (<=" in line}
    assert "0.80 ± 0.14" in rows["<=1x (<= 16)"] and "—" in rows["1x-2x (<= 32)"]
    with open(paths[1]) as f:
        table = {row["configuration"]: row for row in csv.DictReader(f)}
    assert float(table["rope"]["accuracy"]) == pytest.approx(0.7)
    assert float(table["rope"]["accuracy spread"]) == pytest.approx(0.1414, abs=1e-4)
    with pytest.raises(ValueError, match="these classification runs have accuracy, f1, matthews"):
        write_report(root, metric="pearson")
