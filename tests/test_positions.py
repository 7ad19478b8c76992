"""Randomized positions (Ruoss et al. 2023) in training and evaluation: the model sees exactly
the drawn positions, a resumed run draws the same ones, and evaluation with them is exact.

Runs use the 1-layer, width-32 tiny config on ``pystdlib`` (``_train_helpers.py``).
"""

from __future__ import annotations

import _train_helpers as helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import data as data_lib
from posenc.kinds.stream import Positions, evaluate
from posenc.runs.config import validate
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import train
from posenc.workdir.metrics import read_metrics

RANDOMIZED = ("train.positions=randomized", "train.max_position=64")


def _forward(model):
    """``(tokens [B, T], positions [B, T]) -> logits``: the model itself, jitted."""
    graphdef, state = nnx.split(model)
    apply = jax.jit(lambda state, tokens, positions: nnx.merge(graphdef, state)(tokens, positions))
    return lambda tokens, positions: np.asarray(
        apply(state, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32))
    )


def test_training_sees_the_positions_drawn_for_its_step(data_dir, tmp_path):
    """The loss of step 1 is the initial model's loss on batch 0 at the drawn positions."""
    config = helpers.tiny_config(data_dir, *RANDOMIZED, "train.steps=1")
    train(config, str(tmp_path / "run"))
    (line,) = read_metrics(str(tmp_path / "run"))
    windows = data_lib.TrainWindows(
        helpers.stream(data_dir, "train"), 16, config.train.batch_size, seed=config.seed
    )
    batch = windows.batch(0)
    drawn = data_lib.random_positions(config.seed, 0, 16, 64)
    assert drawn[-1] > 15, "the draw reaches past the window length"
    forward = _forward(helpers.initial_model(config))
    rows = batch["inputs"].shape[0]
    at_drawn = helpers.cross_entropy(
        forward(batch["inputs"], np.tile(drawn, (rows, 1))), batch["targets"]
    )
    at_arange = helpers.cross_entropy(
        forward(batch["inputs"], np.tile(np.arange(16), (rows, 1))), batch["targets"]
    )
    assert line["loss"] == pytest.approx(at_drawn.mean(), rel=1e-5)
    assert abs(at_arange.mean() - at_drawn.mean()) > 1e-4, "RoPE sees the positions"


@pytest.mark.parametrize("name", ["xl", pytest.param("shaw", marks=pytest.mark.slow)])
def test_a_resumed_randomized_run_is_exact(data_dir, tmp_path, name):
    """Relative-table encoders take the general path; the draws are functions of the step."""
    config = helpers.tiny_config(data_dir, *RANDOMIZED, f"encoding.name={name}", "train.steps=4")
    full = train(config, str(tmp_path / "full"))
    train(config, str(tmp_path / "cut"), stop_at=2)
    resumed = train(config, str(tmp_path / "cut"))
    assert resumed.resumed_from == 2
    helpers.assert_same_leaves(
        helpers.param_leaves(full.model), helpers.param_leaves(resumed.model)
    )
    losses = [line["loss"] for line in read_metrics(str(tmp_path / "full"))]
    assert all(np.isfinite(losses)) and len(losses) == 4


def test_randomized_evaluation_is_exact_and_recorded(data_dir, tmp_path):
    config = helpers.tiny_config(data_dir, *RANDOMIZED, "train.steps=2", "eval.lengths=16,48")
    workdir = str(tmp_path / "run")
    result = train(config, workdir)
    stream = helpers.stream(data_dir, "validation")
    positions = Positions(seed=config.seed, max_position=64)
    (got,) = evaluate(
        result.model, stream, [48], batch_tokens=96, max_tokens=200, positions=positions
    )
    # Direct: the same windows in batches of 2, each batch at its own draw.
    windows = data_lib.eval_windows(stream, 48, max_windows=got["windows"])
    forward = _forward(result.model)
    losses = []
    for number, start in enumerate(range(0, windows.num_windows, 2)):
        inputs = windows.inputs[start : start + 2]
        draw = data_lib.random_positions(config.seed, (48, number), 48, 64, purpose="eval")
        logits = forward(inputs, np.tile(draw, (len(inputs), 1)))
        losses.append(helpers.cross_entropy(logits, windows.targets[start : start + 2]))
    expected = np.concatenate(losses).mean()
    assert got["loss"] == pytest.approx(expected, rel=1e-5)
    (contiguous,) = evaluate(result.model, stream, [48], batch_tokens=96, max_tokens=200)
    assert abs(contiguous["loss"] - got["loss"]) > 1e-4

    report = evaluate_workdir(workdir, model=result.model, step=2, progress=False)
    assert (report["positions"], report["max_position"]) == ("randomized", 64), "as trained"
    changed = helpers.tiny_config(
        data_dir, *RANDOMIZED, "train.steps=2", "eval.lengths=16,48", "eval.positions=contiguous"
    )
    other = evaluate_workdir(workdir, overrides=changed, model=result.model, step=2, progress=False)
    assert other["positions"] == "contiguous" and other["changes"] == {
        "eval.positions": "contiguous"
    }
    assert other["file"] != "eval.json"


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["train.positions=shuffled"], r"train.positions must be one of \['contiguous'"),
        (["eval.positions=random"], r"eval.positions must be one of \['as_trained'"),
        ([*RANDOMIZED[:1], "train.max_position=8"], r"train.max_position=8 must be >= train"),
        ([*RANDOMIZED, "eval.lengths=16,128"], r"eval.lengths \[128\] exceed train.max_position"),
        (
            [*RANDOMIZED, "encoding.name=learned", "encoding.hparams.max_len=32"],
            r"encoding.hparams.max_len=32",
        ),
    ],
)
def test_bad_position_settings_name_the_field(data_dir, overrides, match):
    with pytest.raises(ValueError, match=match):
        validate(helpers.tiny_config(data_dir, *overrides))
