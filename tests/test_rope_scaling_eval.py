"""``posenc eval`` scores a trained RoPE run under each RoPE scaling (the encoder's
``eval_safe_hparams``), writes the result beside ``eval.json`` with the changes recorded, and
still refuses a change to what was trained (RoPE's base)."""

from __future__ import annotations

import os

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.runs.config import apply_overrides, evaluation_changes
from posenc.runs.train import train
from posenc.workdir import RunDir

MODES = ["linear", "ntk", "dynamic", "yarn"]


def test_evaluation_may_change_the_scaling_but_not_the_base():
    trained = helpers.tiny_config("/nonexistent")
    requested = helpers.tiny_config(
        "/nonexistent",
        "encoding.hparams.scaling=yarn",
        "encoding.hparams.factor=4",
        "encoding.hparams.original_max_len=16",
        "encoding.hparams.beta_fast=16",
    )
    assert evaluation_changes(trained, requested) == {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 4,
        "encoding.hparams.original_max_len": 16,
        "encoding.hparams.beta_fast": 16,
    }
    with pytest.raises(ValueError, match="encoding.hparams.base"):
        evaluation_changes(trained, helpers.tiny_config("/nonexistent", "encoding.hparams.base=5"))


# -- posenc eval on a trained run ----------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_rope(tmp_path_factory):
    data_dir = helpers.build_pystdlib(tmp_path_factory.mktemp("pystdlib"))
    workdir = str(tmp_path_factory.mktemp("rope") / "run")
    train(helpers.tiny_config(data_dir, "train.steps=2", "eval.lengths=16,64"), workdir)
    return workdir


def test_posenc_eval_scores_a_trained_rope_run_under_each_scaling(trained_rope):
    run = RunDir(trained_rope)
    code, _, err = helpers.run_cli("eval", "--workdir", trained_rope)
    assert code == 0, err
    with open(os.path.join(trained_rope, "eval.json"), "rb") as f:
        own_bytes = f.read()
    own = {r["length"]: r["loss"] for r in run.read_eval("eval.json")["results"]}
    losses, seen = {}, {"eval.json"}
    for mode in MODES:
        flags = [
            f"--config.encoding.hparams.scaling={mode}",
            "--config.encoding.hparams.factor=4",
            "--config.encoding.hparams.original_max_len=16",
        ]
        code, out, err = helpers.run_cli("eval", "--workdir", trained_rope, *flags)
        assert code == 0, err
        (name,) = [n for n in run.eval_files() if n not in seen]
        result = run.read_eval(name)
        assert name in out and name.startswith("eval-")
        assert result["changes"] == {
            "encoding.hparams.scaling": mode,
            "encoding.hparams.factor": 4,
            "encoding.hparams.original_max_len": 16,
        }
        assert result["encoding"] == "rope"
        losses[mode] = {r["length"]: r["loss"] for r in result["results"]}
        seen.add(name)
    with open(os.path.join(trained_rope, "eval.json"), "rb") as f:
        assert f.read() == own_bytes, "eval.json is not touched"
    # At the training length dynamic NTK changes nothing; position interpolation does.
    assert losses["dynamic"][16] == pytest.approx(own[16], rel=1e-6)
    assert losses["linear"][16] != pytest.approx(own[16], rel=1e-4)
    assert all(np.isfinite(losses[m][n]) for m in MODES for n in (16, 64))

    code, _, err = helpers.run_cli(
        "eval", "--workdir", trained_rope, "--config.encoding.hparams.base=5"
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "encoding.hparams.base" in lines[0] and "encoding.hparams.scaling" in lines[0]
    code, _, err = helpers.run_cli(
        "eval", "--workdir", trained_rope, "--config.encoding.hparams.scaling=pi"
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert (
        code == 2 and len(lines) == 1 and "encoding.hparams.scaling must be one of" in lines[0]
    ), err


def test_scaling_errors_name_the_field_a_user_types():
    """The flag is --config.encoding.hparams.<name>; a message naming encoding.<name> sends the
    user to a field that does not exist."""
    from posenc import encodings

    for hparams, field in (
        ({"scaling": "pi"}, "encoding.hparams.scaling"),
        ({"scaling": "yarn", "factor": 0.5}, "encoding.hparams.factor"),
        ({"factor": 2.0}, "encoding.hparams.factor"),
        (
            {"scaling": "yarn", "beta_fast": 1.0, "original_max_len": 8},
            "encoding.hparams.beta_fast",
        ),
    ):
        with pytest.raises(ValueError) as info:
            encodings.get("rope", **hparams)
        message = str(info.value)
        assert field in message, message
        assert "encoding." not in message.replace("encoding.hparams.", ""), message
    with pytest.raises(ValueError, match="encoding.hparams.max_len"):
        encodings.get("learned", max_len=0)
    with pytest.raises(ValueError, match="encoding.hparams.max_len=8"):
        encodings.get("learned", max_len=8).check_length(9)


def test_original_max_len_defaults_to_the_training_length():
    """YaRN, dynamic NTK and Llama 3 need the training length; a run knows it (train.seq_len,
    an imported model's too), so an evaluation that leaves it out uses it."""
    trained = helpers.tiny_config("/nonexistent")
    for scaling in ("yarn", "dynamic", "llama3"):
        requested = helpers.tiny_config(
            "/nonexistent", f"encoding.hparams.scaling={scaling}", "encoding.hparams.factor=4"
        )
        changes = evaluation_changes(trained, requested)
        assert changes["encoding.hparams.original_max_len"] == trained.train.seq_len == 16
        assert requested.encoding.hparams.original_max_len == 16
    # Given, it is kept; linear scaling does not use it and gets none.
    requested = helpers.tiny_config(
        "/nonexistent", "encoding.hparams.scaling=yarn", "encoding.hparams.original_max_len=64"
    )
    assert evaluation_changes(trained, requested)["encoding.hparams.original_max_len"] == 64
    requested = helpers.tiny_config("/nonexistent", "encoding.hparams.scaling=linear")
    assert "encoding.hparams.original_max_len" not in evaluation_changes(trained, requested)


def test_documented_yarn_eval_runs_without_original_max_len(trained_rope):
    """docs/retrieval.md's and docs/evaluation.md's YaRN example as written: no
    original_max_len."""
    code, out, err = helpers.run_cli(
        "eval", "--workdir", trained_rope, "--config.encoding.hparams.scaling=yarn",
        "--config.encoding.hparams.factor=4",
    )  # fmt: skip
    assert code == 0, err
    (path,) = [line.removeprefix("wrote ") for line in out.splitlines() if "wrote" in line]
    report = RunDir(trained_rope).read_eval(os.path.basename(path))
    assert report["changes"] == {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 4,
        "encoding.hparams.original_max_len": 16,
    }


def test_checks_at_binding_name_the_field_a_user_types():
    """Checks that need the model's shape (NTK's four rotated channels) run when the encoder is
    bound, outside the registry; validate names the field as it is set too."""
    from posenc.runs.config import validate

    config = helpers.tiny_config(
        "/nonexistent",
        "encoding.hparams.fraction=0.125",
        "encoding.hparams.scaling=ntk",
        "encoding.hparams.factor=2",
    )
    with pytest.raises(ValueError, match=r"encoding\.hparams\.scaling='ntk'.*at least 4") as info:
        validate(config)
    assert "encoding." not in str(info.value).replace("encoding.hparams.", "")


def _layered(*overrides: str):
    """The tiny run with a local kind on the model's RoPE and a global kind with its own."""
    config = helpers.tiny_config("/nonexistent")
    with config.unlocked():
        config.layers.pattern = ("local", "global")
        config.layers.kinds = {
            "local": {"window": "sliding:8"},
            "global": {"encoding": "rope", "hparams": {"base": 1000.0}},
        }
    return apply_overrides(config, overrides)


def test_evaluation_may_scale_one_layer_kinds_rope_alone():
    """A layer kind with its own RoPE takes the scaling overrides under
    layers.kinds.<kind>.hparams (a model that scales only its global layers); its base, and any
    other field of a kind, stays what was trained."""
    trained = _layered()
    requested = _layered(
        "layers.kinds.global.hparams.scaling=yarn", "layers.kinds.global.hparams.factor=4"
    )
    assert evaluation_changes(trained, requested) == {
        "layers.kinds.global.hparams.scaling": "yarn",
        "layers.kinds.global.hparams.factor": 4,
        "layers.kinds.global.hparams.original_max_len": 16,
    }
    assert requested.layers.kinds["global"].hparams.original_max_len == 16
    with pytest.raises(ValueError, match=r"layers\.kinds\.global\.hparams\.base 1000\.0 -> 5"):
        evaluation_changes(trained, _layered("layers.kinds.global.hparams.base=5"))
    with pytest.raises(ValueError, match=r"layers\.kinds\.local\.window 'sliding:8' -> 'full'"):
        evaluation_changes(trained, _layered("layers.kinds.local.window=full"))
