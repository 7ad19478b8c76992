"""posenc.workdir.checkpoints: checksums recorded at save, verified before restore, fallback to
the newest intact step, and one clear error when none is intact."""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc.workdir import CheckpointError, Checkpoints, CheckpointWarning
from posenc.workdir.checkpoints import CHECKSUM_FILE, verify


def _state(step: int):
    params = {"w": jnp.full((4, 8), float(step)), "b": jnp.arange(8.0) + step}
    train_state = {"opt": {"mu": jnp.full((4, 8), step / 10)}, "step": jnp.asarray(step)}
    return params, train_state


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@pytest.fixture
def saved(tmp_path):
    """Steps 1, 2, 3 saved (all kept)."""
    directory = str(tmp_path / "checkpoints")
    checkpoints = Checkpoints(directory)
    for step in (1, 2, 3):
        checkpoints.save(step, *_state(step))
    checkpoints.close()
    return directory


def _largest_file(step_dir: str) -> str:
    files = [
        os.path.join(folder, name)
        for folder, _, names in os.walk(step_dir)
        for name in names
        if name != CHECKSUM_FILE
    ]
    return max(files, key=os.path.getsize)


def _restore(directory, **kwargs):
    params, train_state = _state(0)
    checkpoints = Checkpoints(directory, writer=False)
    try:
        return checkpoints.restore_latest(_abstract(params), _abstract(train_state), **kwargs)
    finally:
        checkpoints.close()


def test_intact_checkpoints_restore_exactly(saved):
    step, params, train_state = _restore(saved)
    expected_params, expected_state = _state(3)
    assert step == 3
    for got, want in zip(
        jax.tree.leaves((params, train_state)),
        jax.tree.leaves((expected_params, expected_state)),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    for s in (1, 2, 3):
        assert verify(os.path.join(saved, str(s))) is None
    params_only = Checkpoints(saved, writer=False).restore_latest(_abstract(_state(0)[0]))
    assert params_only[0] == 3 and params_only[2] is None


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_step_falls_back_to_the_newest_intact_one(saved, damage):
    path = _largest_file(os.path.join(saved, "3"))
    data = bytearray(open(path, "rb").read())
    if damage == "truncate":
        data = data[: len(data) // 2]
        expected = "bytes"
    else:
        data[len(data) // 2] ^= 0xFF  # the same size: only the hash can tell
        expected = "sha256"
    open(path, "wb").write(bytes(data))
    assert expected in verify(os.path.join(saved, "3"))
    with pytest.warns(CheckpointWarning, match=r"step 3 .* is damaged .*; using step 2"):
        step, params, _ = _restore(saved)
    assert step == 2
    np.testing.assert_array_equal(params["w"], _state(2)[0]["w"])
    assert os.path.isdir(os.path.join(saved, "3")), "evaluation leaves the directory alone"


def test_training_moves_damaged_steps_aside_and_can_save_them_again(saved):
    os.remove(_largest_file(os.path.join(saved, "3")))
    with pytest.warns(CheckpointWarning, match="moved it to"):
        checkpoints = Checkpoints(saved)
        params, train_state = _state(0)
        step, _, _ = checkpoints.restore_latest(
            _abstract(params), _abstract(train_state), set_aside=True
        )
    assert step == 2 and checkpoints.steps() == [1, 2]
    corrupt = os.path.join(os.path.dirname(saved), "corrupt_checkpoints")
    assert [name.split("-")[0] for name in os.listdir(corrupt)] == ["3"]
    checkpoints.save(3, *_state(3))  # the step can be written again
    assert checkpoints.steps() == [1, 2, 3] and verify(os.path.join(saved, "3")) is None
    checkpoints.close()


def test_no_intact_step_is_one_clear_error(saved):
    for s in (1, 2, 3):
        path = _largest_file(os.path.join(saved, str(s)))
        open(path, "wb").write(b"")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        with pytest.raises(CheckpointError) as info:
            _restore(saved)
    message = str(info.value)
    assert "no intact checkpoint" in message and "step 1:" in message and "\n" not in message


def test_a_step_without_a_record_is_restored_unverified_and_falls_back_if_unreadable(saved):
    os.remove(os.path.join(saved, "3", CHECKSUM_FILE))
    assert _restore(saved)[0] == 3
    open(_largest_file(os.path.join(saved, "3")), "wb").write(b"garbage")
    with pytest.warns(CheckpointWarning, match=r"step 3 .*orbax cannot read it"):
        assert _restore(saved)[0] == 2


def test_steps_written_by_posenc_0_1_still_restore(tmp_path):
    """posenc 0.1 saved one orbax item, ``state = {params, opt_state, step}``."""
    import orbax.checkpoint as ocp

    directory = str(tmp_path / "checkpoints")
    params, train_state = _state(5)
    manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False),
    )
    legacy = {"params": params, **train_state}
    manager.save(5, args=ocp.args.Composite(state=ocp.args.StandardSave(legacy)))
    manager.wait_until_finished()
    manager.close()
    step, got_params, got_state = _restore(directory)
    assert step == 5
    for got, want in zip(
        jax.tree.leaves((got_params, got_state)),
        jax.tree.leaves((params, train_state)),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)
    step, only_params, none = Checkpoints(directory, writer=False).restore_latest(_abstract(params))
    assert (step, none) == (5, None)
    np.testing.assert_array_equal(only_params["w"], params["w"])
