"""Shared pieces of the training, evaluation and CLI tests: tiny configs, data, tree comparison.

Every run here uses the real ``configs/base.py:tiny`` config with overrides that shrink it to a
1-layer, width-32, float32 model, so that a run compiles in seconds on a laptop CPU.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import ml_collections
import numpy as np

from posenc import data as data_lib
from posenc.runs.config import apply_overrides, load_config

REPO = Path(__file__).resolve().parents[1]
BASE_CONFIG = REPO / "configs" / "base.py"
TINY_SPEC = f"{BASE_CONFIG}:tiny"
DEVICE_SCRIPT = Path(__file__).resolve().parent / "_train_helpers_devices.py"

# The shrunken tiny config, as command-line overrides (so the CLI tests can pass the same).
TINY_OVERRIDES: tuple[str, ...] = (
    "model.num_layers=1",
    "model.model_dim=32",
    "model.num_heads=2",
    "model.mlp_dim=64",
    "model.dtype=float32",
    "train.seq_len=16",
    "train.batch_size=8",
    "train.steps=8",
    "train.log_every=1",
    "train.checkpoint_every=4",
    "train.progress=False",
    "optim.warmup_steps=2",
    "optim.learning_rate=0.01",
    "eval.lengths=16,32",
    "eval.batch_tokens=128",
    "eval.max_tokens=256",
)


def tiny_config(data_dir: str | os.PathLike[str], *overrides: str) -> ml_collections.ConfigDict:
    """``configs/base.py:tiny`` shrunk by :data:`TINY_OVERRIDES`, then ``overrides``."""
    return apply_overrides(
        load_config(TINY_SPEC), [*TINY_OVERRIDES, f"data.data_dir={data_dir}", *overrides]
    )


def tiny_flags(data_dir: str | os.PathLike[str]) -> list[str]:
    """:data:`TINY_OVERRIDES` and the data directory as ``posenc`` command-line flags."""
    return [f"--config.{o}" for o in TINY_OVERRIDES] + [f"--config.data.data_dir={data_dir}"]


def run_cli(*argv: str) -> tuple[int, str, str]:
    """Runs ``posenc`` in-process; returns (exit status, stdout, stderr)."""
    from posenc.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse's --help and usage errors
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def one_line_error(err: str, command: str) -> str:
    """The one line a refused ``posenc <command>`` printed on stderr (asserting it is one;
    one-line warnings printed before it, such as a thin evaluation split, are allowed)."""
    lines = [
        line
        for line in err.splitlines()
        if line.strip() and not line.startswith("posenc: warning:")
    ]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"posenc {command}: error:"), err
    return lines[0]


def build_pystdlib(data_dir: Path) -> Path:
    """Prepares the ``pystdlib`` token streams under ``data_dir`` (about a second)."""
    data_lib.prepare("pystdlib", data_dir)
    return data_dir


def stream(data_dir: Path, split: str = "validation", spec: str = "pystdlib") -> np.ndarray:
    return np.asarray(data_lib.get_source(spec, data_dir).split_stream(split))


def param_leaves(tree: Any) -> dict[str, np.ndarray]:
    """Every array leaf of a pytree (or NNX model state), keyed by its path, as numpy."""
    from flax import nnx

    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree, nnx.Param)
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def assert_same_leaves(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], *, rtol: float = 0.0, atol: float = 0.0
) -> None:
    """Same paths, shapes and values (exactly, unless tolerances are given)."""
    assert sorted(a) == sorted(b), "parameter trees differ in structure"
    assert len(a) > 0
    for key in a:
        assert a[key].shape == b[key].shape, key
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol, err_msg=key)


def strip_timing(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metric lines without their wall-clock fields (which legitimately differ between runs)."""
    timing = {"time", "tokens_per_s", "step_time_s", "seconds"}
    return [{k: v for k, v in line.items() if k not in timing} for line in lines]


def run_device_script(devices: int, *args: str, timeout: float = 300) -> subprocess.Popen:
    """Starts ``_train_helpers_devices.py`` in a fresh interpreter with ``devices`` CPU devices.

    XLA reads ``--xla_force_host_platform_device_count`` when JAX initialises, so it has to be
    set in the environment of a new process rather than in this one.
    """
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("POSENC_TRACEBACK", None)
    return subprocess.Popen(
        [sys.executable, str(DEVICE_SCRIPT), "--devices", str(devices), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def initial_model(config: ml_collections.ConfigDict):
    """The model a run starts from (initialised under jit, as training does: much faster than
    an eager ``build``)."""
    from posenc.runs.train import Trainer

    trainer = Trainer(config)
    return trainer.model(trainer.init_state())


def jit_forward(model):
    """``tokens [B, T] -> logits [B, T, V]``: the model's own forward pass, jitted.

    Calling an NNX model eagerly compiles every primitive separately on first use; one jit is
    several times cheaper for the handful of calls a test makes.
    """
    from flax import nnx

    graphdef, state = nnx.split(model)
    apply = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
    return lambda tokens: apply(state, jax.numpy.asarray(tokens, jax.numpy.int32))


def cross_entropy(logits: Any, targets: np.ndarray) -> np.ndarray:
    """Per-token cross entropy in float64 numpy: logits ``[..., V]``, targets ``[...]``."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=-1))
    return log_z - np.take_along_axis(shifted, np.asarray(targets)[..., None], axis=-1)[..., 0]


def unigram_entropy(tokens: np.ndarray) -> float:
    """H = -sum p log p (nats) of the token frequencies of a stream."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
