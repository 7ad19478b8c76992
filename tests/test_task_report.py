"""posenc.report.tasks: the length-generalisation tables (Ruoss et al.'s averages over unseen
lengths, Kazemnejad et al.'s mean reciprocal rank), from hand-made eval.json files."""

from __future__ import annotations

import csv
import os

import pytest

from posenc.report import find_runs, group_runs, write_report
from posenc.report import tasks as task_report
from posenc.workdir import write_json

MODEL = {
    "num_layers": 2,
    "model_dim": 32,
    "num_heads": 4,
    "mlp_dim": 64,
    "head_dim": None,
    "norm": "layernorm",
    "dtype": "float32",
    "num_params": 1000,
}


def _run(root, name, task, encoding, seed, accuracy_by_length, train_len=4):
    d = os.path.join(root, name)
    os.makedirs(d)
    results = [
        {"length": n, "accuracy": a, "exact_match": a / 2, "loss": 1 - a}
        for n, a in accuracy_by_length.items()
    ]
    write_json(
        os.path.join(d, "eval.json"),
        {
            "encoding": encoding,
            "encoding_hparams": {},
            "objective": "causal_lm",
            "task": task,
            "train_seq_len": train_len,
            "train_steps": 10,
            "checkpoint_step": 10,
            "finished": True,
            "seed": seed,
            "model": MODEL,
            "mode": "nonoverlapping",
            "positions": "contiguous",
            "data": {"source": f"synthetic:{task}"},
            "device": "1 x cpu",
            "results": results,
        },
    )


@pytest.fixture
def sweep(tmp_path):
    root = str(tmp_path)
    # Lengths 2 and 4 are seen (train_len 4); 8 and 16 unseen.
    _run(root, "copy_rope_0", "copy", "rope", 0, {2: 1.0, 4: 1.0, 8: 0.6, 16: 0.2})
    _run(root, "copy_rope_1", "copy", "rope", 1, {2: 1.0, 4: 1.0, 8: 0.8, 16: 0.4})
    _run(root, "copy_nope_0", "copy", "nope", 0, {2: 1.0, 4: 0.9, 8: 0.9, 16: 0.7})
    _run(root, "parity_rope_0", "parity", "rope", 0, {2: 1.0, 4: 1.0, 8: 0.5, 16: 0.5})
    _run(root, "parity_nope_0", "parity", "nope", 0, {2: 1.0, 4: 1.0, 8: 0.4, 16: 0.4})
    return root


def test_unseen_mean_averages_lengths_above_training_per_seed_then_seeds(sweep):
    runs = [r for r in find_runs(sweep) if r.eval["task"] == "copy"]
    (columns,) = group_runs(runs).values()
    rope = next(c for c in columns if c.label == "rope")
    mean, spread, n = task_report.unseen_mean(rope, "accuracy")
    # Seed 0: (0.6 + 0.2) / 2 = 0.4; seed 1: (0.8 + 0.4) / 2 = 0.6.
    assert (mean, n) == (pytest.approx(0.5), 2)
    assert spread == pytest.approx(0.1414213562)  # stdev of [0.4, 0.6]


def test_ranks_share_ties_and_mrr_averages_reciprocals():
    assert task_report.ranks({"x": 0.9, "y": 0.5, "z": 0.5}) == {"x": 1, "y": 2.5, "z": 2.5}
    assert task_report.ranks({"x": 3.0, "y": 1.0}, higher_is_better=False) == {"y": 1, "x": 2}
    mrr = task_report.mean_reciprocal_rank(
        {"a": {"x": 0.9, "y": 0.5, "z": 0.5}, "b": {"x": 0.1, "y": 0.8, "z": 0.3}}
    )
    # a: x 1, y 2.5, z 2.5; b: y 1, z 2, x 3.
    assert mrr == pytest.approx({"x": (1 + 1 / 3) / 2, "y": (0.4 + 1) / 2, "z": (0.4 + 0.5) / 2})


def test_the_report_has_the_summary_the_ranking_and_a_plot_per_task(sweep):
    paths = write_report(sweep)  # task runs: accuracy by default
    text = open(paths[0]).read()
    # copy: rope 0.5 ± 0.14 (two seeds), nope 0.8; parity: rope 0.5, nope 0.4 (percent).
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "| copy | 80.0 | 50.0 ± 14.1 |" in lines
    assert "| parity | 40.0 | 50.0 |" in lines
    assert "| average over tasks | 60.0 | 50.0 |" in lines
    # MRR: nope first on copy, rope first on parity: both (1 + 1/2) / 2 = 0.75.
    assert "| nope | 0.750 |" in lines and "| rope | 0.750 |" in lines
    with open(paths[1]) as f:
        rows = {(r["task"], r["configuration"]): r for r in csv.DictReader(f)}
    assert float(rows[("copy", "rope")]["accuracy_unseen_mean"]) == pytest.approx(0.5)
    assert float(rows[("parity", "nope")]["accuracy_unseen_mean"]) == pytest.approx(0.4)
    assert float(rows[("copy", "nope")]["mrr"]) == pytest.approx(0.75)
    assert sorted(os.path.basename(p) for p in paths[2:]) == [
        "accuracy_copy.png",
        "accuracy_parity.png",
    ]
    exact = write_report(sweep, metric="exact_match")
    with open(exact[1]) as f:
        rows = {(r["task"], r["configuration"]): r for r in csv.DictReader(f)}
    assert float(rows[("copy", "nope")]["exact_match_unseen_mean"]) == pytest.approx(0.4)


def test_a_text_metric_is_refused_for_task_runs(sweep):
    with pytest.raises(ValueError, match="for task runs"):
        write_report(sweep, metric="bits_per_byte")


def test_a_configuration_without_a_score_ranks_last_in_that_task():
    mrr = task_report.mean_reciprocal_rank(
        {"a": {"x": 1.0}, "b": {"x": 0.5, "y": 0.9, "z": 0.1}}, labels=["x", "y", "z"]
    )
    # a: x 1, y and z unscored (rank 3); b: y 1, x 2, z 3.
    assert mrr == pytest.approx({"x": 0.75, "y": (1 / 3 + 1) / 2, "z": 1 / 3})


def test_the_report_also_summarises_the_other_papers_metric(sweep):
    text = open(write_report(sweep, metric="exact_match")[0]).read()
    assert "## Summary: exact_match (%)" in text and "## Summary: accuracy (%)" in text
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "| copy | 40.0 | 25.0 ± 7.1 |" in lines  # exact match is accuracy / 2 here


def test_text_runs_beside_task_runs_are_named_as_left_out(sweep):
    """A report covers task runs or text runs; the text runs of a mixed folder are not dropped
    silently: a warning and the report say which were left out and why."""
    text_run = os.path.join(sweep, "text_rope_0")
    os.makedirs(text_run)
    write_json(
        os.path.join(text_run, "eval.json"),
        {
            "encoding": "rope",
            "encoding_hparams": {},
            "objective": "causal_lm",
            "task": None,
            "train_seq_len": 8,
            "train_steps": 10,
            "seed": 0,
            "model": MODEL,
            "mode": "nonoverlapping",
            "data": {"source": "pystdlib", "split": "validation"},
            "device": "1 x cpu",
            "results": [{"length": 8, "tokens": 8, "loss": 1.0, "perplexity": 2.7}],
        },
    )
    with pytest.warns(UserWarning, match=r"1 other run left out \(text_rope_0\)") as caught:
        paths = write_report(sweep)
    assert "posenc.report" in type(caught[0].message).__module__
    text = open(paths[0]).read()
    assert "1 other run left out (text_rope_0)" in text
    assert (
        "covers algorithmic-task runs, which a report does not mix with others; "
        "report the rest from a folder of their own"
    ) in text
