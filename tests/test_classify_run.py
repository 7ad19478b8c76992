"""Classification runs from the command line: one-line refusals (fast), and end to end from a
masked-LM run with --init-from, interrupted and resumed, evaluated per length bucket and
reported (slow)."""

from __future__ import annotations

import json
import os
import re

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.workdir import RunDir

CONFIG = str(helpers.REPO / "configs" / "classify.py")
# configs/classify.py's tiny and mlm_tiny shrunk to 1 layer of width 32, rows of 16 tokens.
SHRINK = (
    "model.num_layers=1",
    "model.model_dim=32",
    "model.num_heads=2",
    "model.mlp_dim=64",
    "train.seq_len=16",
    "train.batch_size=4",
    "train.log_every=1",
    "train.checkpoint_every=2",
    "train.progress=False",
    "optim.warmup_steps=1",
    "eval.batch_tokens=256",
)


def _flags(*overrides: str) -> list[str]:
    return [f"--config.{o}" for o in (*SHRINK, *overrides)]


def _pairs_folder(folder, rows=24):
    """A tsv: folder of sentence pairs, labels 'same' when the two texts are equal."""
    rng = np.random.default_rng(0)
    lines = {"train": ["text\ttext_b\tlabel"], "validation": ["text\ttext_b\tlabel"]}
    for split, n in (("train", rows), ("validation", rows // 2)):
        for i in range(n):
            a = "x" * int(rng.integers(1, 30))
            b = a if i % 2 else "y" * int(rng.integers(1, 30))
            lines[split].append(f"{a}\t{b}\t{'same' if i % 2 else 'other'}")
    folder.mkdir(exist_ok=True)
    for split, text in lines.items():
        (folder / f"{split}.tsv").write_text("\n".join(text) + "\n")
    return f"tsv:{folder}"


@pytest.mark.parametrize(
    "overrides,match",
    [
        (("model.num_labels=3",), r"has 2 classes \['other', 'same'\]; set model.num_labels=2"),
        (("model.causal=True",), r"model.causal must be False for model.assembly='classifier'"),
        (("model.vocab_size=258",), r"model.vocab_size >= 259"),
        (("model.pool='max'",), r"model.pool must be one of \['first', 'mean'\]"),
        (("train.objective='masked_lm'",), r"use train.objective=classification"),
        (("model.num_segments=1",), r"holds sentence pairs .*use model.num_segments=2"),
    ],
)
def test_bad_classification_configs_are_one_line(tmp_path, overrides, match):
    spec = _pairs_folder(tmp_path / "data")
    workdir = tmp_path / "run"
    code, _, err = helpers.run_cli(
        "train",
        "--config",
        f"{CONFIG}:tiny",
        "--workdir",
        str(workdir),
        *_flags(f"data.source={spec!r}", *overrides),
    )
    assert code == 2
    assert re.search(match, helpers.one_line_error(err, "train"))
    assert not workdir.exists(), "a refusal writes nothing"


def test_a_malformed_row_is_one_line_naming_file_and_line(tmp_path):
    spec = _pairs_folder(tmp_path / "data")
    with open(tmp_path / "data" / "train.tsv", "a") as f:
        f.write("only one field\n")
    code, _, err = helpers.run_cli(
        "train", "--config", f"{CONFIG}:tiny", "--workdir", str(tmp_path / "run"),
        *_flags(f"data.source={spec!r}"),
    )  # fmt: skip
    assert code == 2
    assert "train.tsv, line 26: 1 tab-separated fields" in helpers.one_line_error(err, "train")


def test_a_validation_label_the_training_split_lacks_is_refused_before_training(tmp_path):
    spec = _pairs_folder(tmp_path / "data")
    with open(tmp_path / "data" / "validation.tsv", "a") as f:
        f.write("a\tb\tthird\n")
    workdir = tmp_path / "run"
    code, _, err = helpers.run_cli(
        "train", "--config", f"{CONFIG}:tiny", "--workdir", str(workdir),
        *_flags(f"data.source={spec!r}", "train.steps=2"),
    )  # fmt: skip
    assert code == 2
    line = helpers.one_line_error(err, "train")
    assert "validation.tsv, line 14: label 'third' is not among" in line
    assert not workdir.exists(), "refused before the first step: nothing written"


@pytest.mark.parametrize(
    "rows, match",
    [
        (["a\tb\tsame"] * 4, r"has one class \['same'\]: a classifier needs two or more"),
        (["a\tb\t3"] * 4, r"has one class \['3'\]: .*model.num_labels=1 for a regression"),
    ],
)
def test_a_single_class_training_split_gets_the_right_advice(tmp_path, rows, match):
    folder = tmp_path / "data"
    folder.mkdir()
    for split in ("train", "validation"):
        (folder / f"{split}.tsv").write_text("\n".join(["text\ttext_b\tlabel", *rows]) + "\n")
    code, _, err = helpers.run_cli(
        "train", "--config", f"{CONFIG}:tiny", "--workdir", str(tmp_path / "run"),
        *_flags(f"data.source={f'tsv:{folder}'!r}"),
    )  # fmt: skip
    line = helpers.one_line_error(err, "train")
    assert code == 2 and re.search(match, line), line
    if "'same'" in line:
        assert "num_labels=1" not in line  # names are no regression target


@pytest.mark.slow
def test_fine_tune_from_a_masked_lm_run_resumes_evaluates_and_reports(tmp_path):
    data_dir = helpers.build_pystdlib(tmp_path / "pystdlib")
    mlm = str(tmp_path / "mlm")
    code, _, err = helpers.run_cli(
        "train", "--config", f"{CONFIG}:mlm_tiny", "--workdir", mlm, "--no-eval",
        *_flags("train.steps=2", f"data.data_dir={str(data_dir)!r}"),
    )  # fmt: skip
    assert code == 0, err
    spec = _pairs_folder(tmp_path / "data")
    common = ["--config", f"{CONFIG}:tiny", "--init-from", mlm, "--no-eval"]
    flags = _flags(f"data.source={spec!r}", "train.steps=4", "eval.lengths=16,32")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    assert helpers.run_cli("train", *common, "--workdir", straight, *flags)[0] == 0
    assert helpers.run_cli("train", *common, "--workdir", resumed, "--stop-at", "2", *flags)[0] == 0
    code, out, err = helpers.run_cli("train", *common, "--workdir", resumed, *flags)
    assert code == 0 and "resumed from step 2" in out, err

    # The shared parts started from the masked-LM run; the head and segments started fresh.
    init = json.load(open(os.path.join(resumed, "init.json")))
    assert init["step"] == 2 and any(k.startswith("['head']") for k in init["fresh"])
    config = RunDir(straight).read_config()
    from posenc.models.restore import load_model

    tuned = helpers.param_leaves(load_model(straight, config))
    assert helpers.param_leaves(load_model(resumed, config)).keys() == tuned.keys()
    helpers.assert_same_leaves(
        helpers.param_leaves(load_model(resumed, config)), tuned, rtol=1e-6, atol=1e-7
    )

    code, out, err = helpers.run_cli("eval", "--workdir", straight)
    assert code == 0, err
    report = json.load(open(os.path.join(straight, "eval.json")))
    assert report["objective"] == "classification" and report["classes"] == ["other", "same"]
    assert [r["label"] for r in report["results"]] == ["<=1x", "1x-2x"]
    assert sum(r["examples"] for r in report["results"]) == report["overall"]["examples"] == 12
    assert "accuracy" in out and "1x-2x" in out
    code, out, err = helpers.run_cli("report", str(straight))
    assert code == 0, err
    md = open(os.path.join(straight, "report.md")).read()
    assert "## By example length, trained at 16 tokens: accuracy" in md


def test_analyze_refuses_a_classifier_in_one_line():
    from posenc.analysis.run import check_analyzable
    from posenc.runs.config import load_config

    with pytest.raises(ValueError, match=r"is a classifier \(model.assembly='classifier'\)"):
        check_analyzable(load_config(f"{CONFIG}:tiny"), "runs/cls")
