"""Fine-tuning from another run (``posenc train --init-from``): the new run starts from exactly
that run's parameters with a fresh optimizer, records where it came from, resumes from its own
checkpoints, and refuses parameters that do not fit."""

from __future__ import annotations

import os

import _train_helpers as helpers
import numpy as np
import pytest

from posenc import data as data_lib
from posenc.models.restore import load_model
from posenc.runs.train import train
from posenc.workdir import RunDir, read_json
from posenc.workdir.metrics import read_metrics


@pytest.fixture(scope="module")
def source(data_dir, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("source") / "run")
    train(helpers.tiny_config(data_dir, "train.steps=4"), workdir)
    return workdir


def test_fine_tuning_starts_from_the_source_parameters(data_dir, source, tmp_path):
    workdir = str(tmp_path / "longer")
    code, _, err = helpers.run_cli(
        "train",
        "--config",
        helpers.TINY_SPEC,
        "--workdir",
        workdir,
        *helpers.tiny_flags(data_dir),
        "--init-from",
        source,
        "--config.train.seq_len=32",
        "--config.train.steps=2",
        "--config.train.checkpoint_every=1",
        "--stop-at",
        "1",
    )
    assert code == 0, err
    config = RunDir(workdir).read_config()
    assert config.train.init_from == os.path.abspath(source)
    record = read_json(os.path.join(workdir, "init.json"))
    assert (record["init_from"], record["step"], record["finished"]) == (
        os.path.abspath(source),
        4,
        True,
    )
    # Step 1's loss is the source model's loss on this run's first batch (length 32).
    windows = data_lib.TrainWindows(helpers.stream(data_dir, "train"), 32, 8, seed=config.seed)
    batch = windows.batch(0)
    logits = helpers.jit_forward(load_model(source))(batch["inputs"])
    expected = helpers.cross_entropy(logits, batch["targets"]).mean()
    assert read_metrics(workdir)[0]["loss"] == pytest.approx(expected, rel=1e-5)

    # Interrupted and resumed, it continues from its own checkpoint, not from the source.
    os.remove(os.path.join(workdir, "init.json"))
    resumed = train(config, workdir)
    assert (resumed.resumed_from, resumed.step) == (1, 2)
    assert not os.path.exists(os.path.join(workdir, "init.json"))


def test_parameters_that_do_not_fit_are_refused(data_dir, source, tmp_path):
    config = helpers.tiny_config(
        data_dir, "model.model_dim=64", f"train.init_from={source!r}", "train.steps=2"
    )
    with pytest.raises(ValueError, match=r"do not fit this model .*model.model_dim"):
        train(config, str(tmp_path / "wide"))
    config = helpers.tiny_config(
        data_dir, f"train.init_from={str(tmp_path / 'nowhere')!r}", "train.steps=2"
    )
    with pytest.raises(ValueError, match="not a posenc work directory"):
        train(config, str(tmp_path / "orphan"))


def test_an_encoder_with_the_same_parameters_may_take_them(data_dir, source, tmp_path):
    """RoPE's weights under ALiBi: nothing in the shapes forbids it (a researcher's choice)."""
    config = helpers.tiny_config(
        data_dir, "encoding.name=alibi", f"train.init_from={source!r}", "train.steps=1"
    )
    result = train(config, str(tmp_path / "alibi"))
    before = helpers.param_leaves(load_model(source))
    after = helpers.param_leaves(result.model)
    assert sorted(before) == sorted(after)
    assert any(not np.array_equal(before[k], after[k]) for k in before), "it trained a step"
