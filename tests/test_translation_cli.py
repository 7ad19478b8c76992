"""A translation run from the command line (slow): trained, killed with SIGKILL and resumed to the
bit, evaluated, and `posenc translate` giving what the evaluation decoded."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import _train_helpers as helpers
import pytest

from posenc.models.restore import load_model
from posenc.workdir.metrics import read_metrics

pytestmark = pytest.mark.slow

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "translation.py") + ":tiny"
STEPS = 60
FLAGS = [
    "--config.model.num_layers=1",
    "--config.model.model_dim=32",
    "--config.model.num_heads=2",
    "--config.model.mlp_dim=64",
    "--config.train.tokens_per_batch=256",
    f"--config.train.steps={STEPS}",
    "--config.train.checkpoint_every=10",
    "--config.data.max_src_len=48",  # short sources: few bucket shapes, few compilations
    "--config.train.log_every=1",
    "--config.train.progress=False",
    "--config.eval.max_sentences=12",
    "--config.eval.beam_size=2",
    "--config.eval.max_len_offset=8",
]


def _train(workdir: str, data_dir: str) -> subprocess.Popen:
    env = {**os.environ, "POSENC_DATA_DIR": data_dir}
    argv = [sys.executable, "-m", "posenc.cli", "train", "--config", CONFIG, "--workdir", workdir]
    log = open(f"{workdir}.log", "ab")  # a file, not a pipe nobody reads while it runs
    return subprocess.Popen([*argv, *FLAGS, "--no-eval"], env=env, stdout=log, stderr=log)


def _log(workdir: str) -> str:
    with open(f"{workdir}.log", errors="replace") as f:
        return f.read()


def _checkpoints(workdir: str) -> list[int]:
    path = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []


def test_killed_translation_run_resumes_exactly_and_translates_as_evaluated(tmp_path):
    data_dir, full, cut = (str(tmp_path / n) for n in ("data", "full", "cut"))
    done = _train(full, data_dir)
    assert done.wait(timeout=1200) == 0, _log(full)

    killed = _train(cut, data_dir)
    deadline = time.monotonic() + 600
    while not _checkpoints(cut) and time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert read_metrics(cut)[-1]["step"] < STEPS
    resumed = _train(cut, data_dir)
    assert resumed.wait(timeout=1200) == 0, _log(cut)
    assert helpers.strip_timing(read_metrics(cut)) == helpers.strip_timing(read_metrics(full))
    helpers.assert_same_leaves(
        helpers.param_leaves(load_model(full)), helpers.param_leaves(load_model(cut))
    )

    os.environ["POSENC_DATA_DIR"] = data_dir
    try:
        code, _, err = helpers.run_cli("eval", "--workdir", cut)
        assert code == 0, err
        with open(os.path.join(cut, "eval.json")) as f:
            report = json.load(f)
        with open(os.path.join(cut, "eval.hypotheses.txt")) as f:
            hypotheses = f.read().splitlines()
        assert len(hypotheses) == 12 == sum(r["sentences"] for r in report["results"])
        assert 0.0 <= report["overall"]["bleu"] <= 100.0
        # The same sources through `posenc translate` (the run's decoding settings): the same lines.
        from posenc.data import get_parallel_source

        sources = get_parallel_source("parallel:default").sources("validation")[:12]
        (tmp_path / "src.txt").write_text("\n".join(sources) + "\n")
        code, out, err = helpers.run_cli(
            "translate", "--workdir", cut, "--input", str(tmp_path / "src.txt")
        )
        assert code == 0, err
        assert out.splitlines() == hypotheses
    finally:
        del os.environ["POSENC_DATA_DIR"]
