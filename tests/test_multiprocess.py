"""Two processes (``jax.distributed`` on localhost, 2 CPU devices each) train like one process
with 4 devices: same loss curve, one writer, and a checkpoint a single process can load.

The children run ``tests/_mp_train.py`` (``posenc.runs.train.train`` then ``evaluate_workdir`` on
the tiny config, float32). Cross-process collectives on CPU use gloo, JAX's default CPU collectives
implementation since 0.4.x; it is set explicitly in the children's environment all the same.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from posenc.data import get_source
from posenc.models import build
from posenc.models.restore import load_model
from posenc.workdir import RunDir
from posenc.workdir.metrics import read_metrics

HELPER = pathlib.Path(__file__).resolve().parent / "_mp_train.py"
STEPS = 6
TIMEOUT_S = 300
# Only process 0 may write these (the workers' own checkpoint shards are orbax's business).
MAIN_PROCESS_FILES = ("config.json", "data.json", "metrics.jsonl", "eval.json")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _overrides(data_dir: pathlib.Path) -> list[str]:
    return [
        f"data.data_dir={data_dir}",
        f"train.steps={STEPS}",
        "train.log_every=1",
        "train.checkpoint_every=3",
        "train.progress=False",
        "model.dtype=float32",
        "eval.lengths=(32,64)",
        "eval.max_tokens=2048",
    ]


def _start(tmp: pathlib.Path, name: str, devices: int, overrides: list[str], env=None):
    spec = {
        "workdir": str(tmp / name.split("_")[0]),
        "report": str(tmp / f"{name}.json"),
        "overrides": overrides,
    }
    child_env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        **(env or {}),
    }
    log = open(tmp / f"{name}.log", "w+")  # noqa: SIM115 - closed in _wait
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), json.dumps(spec)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env,
    )
    return proc, log, pathlib.Path(spec["report"])


def _wait(children) -> list[dict]:
    """Waits for every child (killing all on a timeout); fails with their output."""
    failed = []
    deadline = time.monotonic() + TIMEOUT_S
    for proc, _, _ in children:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            failed.append(f"timed out after {TIMEOUT_S} s; all children killed")
            for other, _, _ in children:
                other.kill()
                other.wait()
    for proc, log, report in children:
        log.seek(0)
        output = log.read()
        log.close()
        if proc.returncode != 0 or not report.exists():
            failed.append(f"--- {report.stem} (exit {proc.returncode}) ---\n{output[-4000:]}")
    if failed:
        pytest.fail("child process failed:\n" + "\n".join(failed))
    return [json.loads(report.read_text()) for _, _, report in children]


def _train_both_ways(tmp: pathlib.Path, multi_overrides: tuple[str, ...] = ()) -> dict:
    data_dir = tmp / "data"
    source = get_source("pystdlib", data_dir=str(data_dir))
    for split in ("train", "validation"):  # built once here, not raced by the children
        source.split_stream(split)
    overrides = _overrides(data_dir)

    port = _free_port()
    distributed = overrides + [
        "distributed.initialize=True",
        f"distributed.coordinator_address='127.0.0.1:{port}'",
        "distributed.num_processes=2",
        *multi_overrides,
    ]
    # The config is the same for both processes; each learns its id from the environment.
    children = [
        _start(tmp, f"multi_p{i}", 2, distributed, {"POSENC_PROCESS_ID": str(i)}) for i in (0, 1)
    ]
    # The reference: one process with the same four devices, run at the same time.
    children.append(_start(tmp, "single", 4, overrides))
    *multi, single = _wait(children)
    return {"tmp": tmp, "single": single, "multi": multi}


@pytest.mark.slow
def test_two_processes_train_like_one_process(tmp_path):
    """One test, not four: the runs take most of a minute and must not repeat per xdist worker."""
    runs = _train_both_ways(tmp_path)
    _check_processes(runs)
    _check_loss_curve(runs)
    _check_single_writer(runs)
    _check_checkpoint(runs)


@pytest.mark.slow
def test_two_processes_with_fsdp_train_like_one_data_parallel_process(tmp_path):
    """The same with the parameters and Adam moments sharded over all four devices of the two
    processes (``mesh.fsdp=4``): the same losses and evaluation as one data-parallel process,
    and each process's shards make a checkpoint one single-device process restores."""
    runs = _train_both_ways(tmp_path, ("mesh.data=1", "mesh.fsdp=4"))
    _check_processes(runs)
    _check_loss_curve(runs)
    _check_single_writer(runs)
    _check_checkpoint(runs)


def _check_processes(runs):
    single, (p0, p1) = runs["single"], runs["multi"]
    assert (single["process_count"], single["device_count"]) == (1, 4)
    assert [p0["process_index"], p1["process_index"]] == [0, 1]
    for p in (p0, p1):
        assert (p["process_count"], p["device_count"], p["local_device_count"]) == (2, 4, 2)
        assert p["step"] == STEPS


def _check_loss_curve(runs):
    single = read_metrics(str(runs["tmp"] / "single"))
    multi = read_metrics(str(runs["tmp"] / "multi"))
    # One line per step: a second writer would have appended a second copy of each.
    assert [m["step"] for m in multi] == list(range(1, STEPS + 1))
    assert [m["step"] for m in single] == list(range(1, STEPS + 1))
    for key in ("loss", "grad_norm", "learning_rate"):
        np.testing.assert_allclose(
            [m[key] for m in multi], [m[key] for m in single], rtol=1e-5, err_msg=key
        )
    losses = [m["loss"] for m in multi]
    assert losses[-1] < losses[0]  # it trains


def _check_single_writer(runs):
    p0, p1 = runs["multi"]
    for name in MAIN_PROCESS_FILES:
        assert name in p0["written"]
        assert name not in p1["written"]
    assert not [f for f in p1["written"] if not f.startswith("checkpoints/")]
    single_eval = json.loads((runs["tmp"] / "single" / "eval.json").read_text())
    multi_eval = json.loads((runs["tmp"] / "multi" / "eval.json").read_text())
    assert [r["length"] for r in multi_eval["results"]] == [32, 64]
    for a, b in zip(multi_eval["results"], single_eval["results"], strict=True):
        assert a["tokens"] == b["tokens"] > 0
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-5)


def _check_checkpoint(runs):
    multi_dir, single_dir = str(runs["tmp"] / "multi"), str(runs["tmp"] / "single")
    multi = jax.tree.leaves(jax.device_get(nnx.state(load_model(multi_dir), nnx.Param)))
    single = jax.tree.leaves(jax.device_get(nnx.state(load_model(single_dir), nnx.Param)))
    assert len(multi) == len(single) > 0
    for a, b in zip(multi, single, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The parameters are the trained ones, not a fresh initialisation.
    fresh = jax.tree.leaves(nnx.state(build(RunDir(multi_dir).read_config()), nnx.Param))
    assert any(not np.allclose(a, f) for a, f in zip(multi, fresh, strict=True))
