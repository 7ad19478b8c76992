"""DroPE (``posenc train --init-from RUN --drop-positions``, posenc/runs/drope.py): a RoPE run
continued with NoPE starts from exactly the source's parameters, trains, resumes exactly, records
what was dropped, is labelled as such by ``posenc report``; other changes are refused in one line.
"""

from __future__ import annotations

import os

import _train_helpers as helpers
import numpy as np
import pytest

from posenc import data as data_lib
from posenc import report
from posenc.models.restore import load_model
from posenc.runs.config import apply_overrides
from posenc.runs.drope import drop_positions
from posenc.runs.train import Trainer, train
from posenc.workdir import RunDir, read_json
from posenc.workdir.metrics import read_metrics


@pytest.fixture(scope="module")
def source(data_dir, tmp_path_factory):
    """A tiny RoPE run (the source whose positions are dropped)."""
    workdir = str(tmp_path_factory.mktemp("source") / "rope")
    train(helpers.tiny_config(data_dir, "train.steps=4"), workdir)
    return workdir


def _drope_argv(data_dir, source, workdir, *extra):
    return [
        "train",
        "--config",
        helpers.TINY_SPEC,
        "--workdir",
        workdir,
        *helpers.tiny_flags(data_dir),
        "--init-from",
        source,
        "--drop-positions",
        "--config.train.steps=2",
        "--config.train.checkpoint_every=1",
        *extra,
    ]


def test_drope_starts_from_the_source_trains_resumes_exactly_and_is_recorded(
    data_dir, source, tmp_path
):
    cut = str(tmp_path / "cut")
    code, _, err = helpers.run_cli(*_drope_argv(data_dir, source, cut, "--stop-at", "1"))
    assert code == 0, err
    config = RunDir(cut).read_config()
    assert (config.encoding.name, config.train.drop_positions) == ("nope", True)
    assert config.train.init_from == os.path.abspath(source)
    record = read_json(os.path.join(cut, "init.json"))
    assert record["drop_positions"] == {"encoders": ["rope"], "parameters": []}
    assert (record["step"], record["encoding"]["name"]) == (4, "rope")

    # Its starting parameters are the source's, all of them (RoPE has none of its own) ...
    trainer = Trainer(config)
    start, _ = trainer.restore_or_init(RunDir(str(tmp_path / "fresh")).checkpoints())
    before = helpers.param_leaves(load_model(source))
    helpers.assert_same_leaves(helpers.param_leaves(start["params"]), before)
    # ... and step 1's loss is theirs under NoPE, not under RoPE: the encoder did change.
    windows = data_lib.TrainWindows(helpers.stream(data_dir, "train"), 16, 8, seed=config.seed)
    batch = windows.batch(0)
    nope_logits = helpers.jit_forward(trainer.model(start))(batch["inputs"])
    rope_logits = helpers.jit_forward(load_model(source))(batch["inputs"])
    nope_loss = helpers.cross_entropy(nope_logits, batch["targets"]).mean()
    rope_loss = helpers.cross_entropy(rope_logits, batch["targets"]).mean()
    assert read_metrics(cut)[0]["loss"] == pytest.approx(nope_loss, rel=1e-5)
    assert abs(nope_loss - rope_loss) > 1e-3

    # Interrupted and resumed, it ends where an uninterrupted DroPE run ends, bit for bit.
    resumed = train(config, cut)
    assert (resumed.resumed_from, resumed.step) == (1, 2)
    whole = str(tmp_path / "whole")
    code, _, err = helpers.run_cli(*_drope_argv(data_dir, source, whole))
    assert code == 0, err
    after = helpers.param_leaves(resumed.model)
    helpers.assert_same_leaves(after, helpers.param_leaves(load_model(whole)))
    assert any(not np.array_equal(before[k], after[k]) for k in before), "it trained"

    # posenc report names it for what it is.
    (columns,) = report.group_runs(report.find_runs(whole)).values()
    assert [c.label for c in columns] == ["nope (DroPE from rope)"]


@pytest.mark.slow  # trains a FIRE run: about 20 s on a shared CPU
def test_an_encoders_parameters_are_dropped_and_without_the_flag_refused(data_dir, tmp_path):
    """FIRE's MLP is left behind under --drop-positions; without it a NoPE run is refused with
    a pointer to the flag."""
    fire = str(tmp_path / "fire")
    train(helpers.tiny_config(data_dir, "encoding.name=fire", "train.steps=1"), fire)
    config = helpers.tiny_config(data_dir, f"train.init_from={fire!r}", "train.steps=1")
    with pytest.raises(ValueError, match=r"do not fit this model.*pass --drop-positions"):
        train(apply_overrides(config, ["encoding.name=nope"]), str(tmp_path / "refused"))
    assert not os.path.exists(tmp_path / "refused")

    config = drop_positions(apply_overrides(config, ["encoding.name=fire"]))
    trainer = Trainer(config)
    target = RunDir(str(tmp_path / "drope"))
    start, _ = trainer.restore_or_init(target.checkpoints(), target)
    source = helpers.param_leaves(load_model(fire))
    dropped = read_json(target.file("init.json"))["drop_positions"]
    assert dropped["encoders"] == ["fire"]
    assert dropped["parameters"] and all("pos_params" in k for k in dropped["parameters"])
    kept = {k: v for k, v in source.items() if k not in dropped["parameters"]}
    assert len(kept) == len(source) - len(dropped["parameters"])
    helpers.assert_same_leaves(helpers.param_leaves(start["params"]), kept)


def test_drope_refusals_are_one_line_and_write_nothing(data_dir, source, tmp_path):
    target = str(tmp_path / "target")
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", target]
    argv += [*helpers.tiny_flags(data_dir), "--config.train.steps=1", "--no-eval"]
    refusals = [
        (["--drop-positions"], "name that run with --init-from"),
        # Parameters the source lacks (QK-norm's scales) are not DroPE's to make up.
        (
            ["--init-from", source, "--drop-positions", "--config.model.qk_norm=rms"],
            "do not fit this model",
        ),
    ]
    for extra, match in refusals:
        code, _, err = helpers.run_cli(*argv, *extra)
        assert code == 2 and match in helpers.one_line_error(err, "train"), err
        assert not os.path.exists(target), extra
    config = helpers.tiny_config(
        data_dir, f"train.init_from={source!r}", "train.drop_positions=True", "train.steps=1"
    )
    with pytest.raises(ValueError, match=r"encoding 'nope', got encoding.name='rope'"):
        train(config, target)
    assert not os.path.exists(target)


def test_the_studys_recalibration_is_the_papers_recipe_on_the_source(source):
    """posenc.studies.drope (experiments/drope.py): 2 % of the source's steps (at least one), a
    third of its peak learning rate, a warmup of 3 % (at least a step), its data and length."""
    from posenc.studies.drope import Plan, recalibration_config

    src = RunDir(source).read_config()
    config = recalibration_config(source, Plan(fraction=0.5))
    assert (config.train.steps, config.optim.warmup_steps) == (2, 1)
    assert config.optim.learning_rate == pytest.approx(src.optim.learning_rate / 3)
    assert (config.encoding.name, config.train.drop_positions) == ("nope", True)
    assert config.train.init_from == os.path.abspath(source)
    assert (config.train.seq_len, config.data.to_dict()) == (src.train.seq_len, src.data.to_dict())
    assert recalibration_config(source).train.steps == 1  # 2 % of 4 steps, at least one
    with pytest.raises(ValueError, match="fraction must be in"):
        Plan(fraction=0.0)


@pytest.mark.slow  # imports a golden Gemma 3 and trains it a step: about 30 s
def test_an_imported_per_layer_model_is_drope_continued_from_its_own_config(tmp_path):
    """posenc import-hf of the golden Gemma 3 (local RoPE layers and global ones naming their
    own RoPE with another base), then --drop-positions with its own config.json: every kind is
    NoPE and the run starts from exactly the imported weights."""
    import shutil

    golden = helpers.REPO / "tests" / "hf" / "golden"
    folder = tmp_path / "gemma3_hf"
    shutil.copytree(golden / "gemma3", folder, ignore=shutil.ignore_patterns("*.npz"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        if not (folder / file).exists():
            shutil.copyfile(golden / "llama" / file, folder / file)
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(9):  # whole files split 90/5/5 by name: enough for each split
        (texts / f"doc{i}.txt").write_text(f"def add{i}(a, b):\n    return a + b\n" * 100)
    imported, data_dir = str(tmp_path / "imported"), str(tmp_path / "data")
    code, _, err = helpers.run_cli(
        "import-hf", str(folder), "--workdir", imported, f"--data=textdir:{texts}",
        f"--config.data.data_dir={data_dir}",
    )  # fmt: skip
    assert code == 0, err
    source = RunDir(imported).read_config()
    assert "rope" in {k.get("encoding") for k in source.layers.kinds.values()}
    target = str(tmp_path / "drope")
    code, _, err = helpers.run_cli(
        "train", "--config", f"{imported}/config.json", "--init-from", imported,
        "--drop-positions", "--workdir", target, "--no-eval", "--config.train.steps=1",
        "--config.train.batch_size=2", "--config.train.progress=False",
        "--config.optim.warmup_steps=1",
    )  # fmt: skip
    assert code == 0, err
    config = RunDir(target).read_config()
    assert config.encoding.name == "nope" and config.encoding.hparams.to_dict() == {}
    kinds = config.layers.kinds.values()
    assert {k.get("encoding") for k in kinds} <= {"nope", None}  # None: the model's (NoPE)
    assert all(not k.get("hparams") for k in kinds if k.get("encoding"))
    record = read_json(os.path.join(target, "init.json"))
    assert record["drop_positions"] == {"encoders": ["rope"], "parameters": []}
    start, _ = Trainer(config).restore_or_init(RunDir(str(tmp_path / "fresh")).checkpoints())
    helpers.assert_same_leaves(
        helpers.param_leaves(start["params"]), helpers.param_leaves(load_model(imported))
    )
