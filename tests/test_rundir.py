"""A run directory cannot be mislabelled, shared, lost or silently mixed (each case was a defect:
a relabelled evaluation, an unfinished run reported as finished, two processes in one
directory, a damaged checkpoint, an overflowing perplexity, a silent resume on other data).

Runs use the 1-layer, width-32 tiny config on ``pystdlib`` (``_train_helpers.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import _train_helpers as helpers
import jax
import numpy as np
import pytest
from flax import nnx

from posenc.models.restore import load_model
from posenc.report import write_report
from posenc.runs import sweep
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import train
from posenc.workdir import CORRUPT_DIR, RunDir, WorkdirBusyError, WorkdirError
from posenc.workdir import lock as lock_lib
from posenc.workdir.checkpoints import CHECKSUM_FILE

STEPS = ("train.steps=8", "train.checkpoint_every=4", "train.keep_checkpoints=3")


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A finished RoPE run (checkpoints at steps 4 and 8) with its eval.json."""
    workdir = str(tmp_path_factory.mktemp("trained") / "run")
    config = helpers.tiny_config(data_dir, *STEPS)
    result = train(config, workdir)
    evaluate_workdir(workdir, model=result.model, step=result.step, progress=False)
    return workdir


@pytest.fixture
def run_copy(trained, tmp_path):
    """A copy of the trained run that a test may change."""
    copy = str(tmp_path / "run")
    shutil.copytree(trained, copy)
    return copy


def _bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


_one_line_error = helpers.one_line_error


def _params(model) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


# -- B.1: evaluation cannot relabel a run ---------------------------------------------------


@pytest.mark.parametrize(
    "override, field",
    [
        ("--config.encoding.name=alibi", "encoding.name 'rope' -> 'alibi'"),
        ("--config.encoding.hparams.base=500", "encoding.hparams.base None -> 500"),
        ("--config.model.model_dim=64", "model.model_dim 32 -> 64"),
        ("--config.train.seq_len=32", "train.seq_len 16 -> 32"),
        ("--config.data.source=textdir:/x", "data.source 'pystdlib' -> 'textdir:/x'"),
    ],
)
def test_eval_refuses_settings_that_change_what_was_trained(trained, override, field):
    before = _bytes(os.path.join(trained, "eval.json"))
    code, _, err = helpers.run_cli("eval", "--workdir", trained, override)
    assert code == 2
    line = _one_line_error(err, "eval")
    assert field in line and "changes what was trained" in line
    assert _bytes(os.path.join(trained, "eval.json")) == before
    assert sorted(RunDir(trained).eval_files()) == ["eval.json"]


def test_eval_under_changed_settings_is_written_beside_the_runs_own(run_copy):
    own = json.loads(_bytes(os.path.join(run_copy, "eval.json")))
    before = _bytes(os.path.join(run_copy, "eval.json"))
    code, out, err = helpers.run_cli(
        "eval", "--workdir", run_copy, "--lengths", "16,48", "--config.model.attention_impl=blocked"
    )
    assert code == 0, err
    assert _bytes(os.path.join(run_copy, "eval.json")) == before, "eval.json is not touched"
    names = list(RunDir(run_copy).eval_files())
    assert names[0] == "eval.json" and len(names) == 2 and names[1] in out
    beside = RunDir(run_copy).read_eval(names[1])
    assert beside["changes"] == {"eval.lengths": [16, 48], "model.attention_impl": "blocked"}
    assert beside["file"] == names[1] and beside["encoding"] == "rope"
    # The blocked path and the fused one score the same tokens alike.
    assert [r["length"] for r in beside["results"]] == [16, 48]
    assert beside["results"][0]["tokens"] == own["results"][0]["tokens"]
    assert beside["results"][0]["loss"] == pytest.approx(own["results"][0]["loss"], rel=1e-5)

    code, _, err = helpers.run_cli(
        "eval", "--workdir", run_copy, "--lengths", "16", "--output", "eval.json"
    )
    assert code == 2 and "written beside it" in _one_line_error(err, "eval")
    assert _bytes(os.path.join(run_copy, "eval.json")) == before


def test_an_encoder_declares_which_hyperparameters_evaluation_may_change(data_dir, tmp_path):
    """Transformer-XL's clamp_len (clamped distances at evaluation, as in the XL code) may
    change; its base may not."""
    workdir = str(tmp_path / "xl")
    config = helpers.tiny_config(data_dir, "encoding.name=xl", "train.steps=2")
    train(config, workdir)
    code, _, err = helpers.run_cli(
        "eval", "--workdir", workdir, "--config.encoding.hparams.clamp_len=8"
    )
    assert code == 0, err
    (name,) = [n for n in RunDir(workdir).eval_files() if n != "eval.json"]
    assert RunDir(workdir).read_eval(name)["changes"] == {"encoding.hparams.clamp_len": 8}
    code, _, err = helpers.run_cli("eval", "--workdir", workdir, "--config.encoding.hparams.base=5")
    assert code == 2 and "encoding.hparams.clamp_len" in _one_line_error(err, "eval")


# -- B.2: the step scored is recorded -------------------------------------------------------


def test_an_unfinished_run_is_evaluated_as_such_and_marked_in_the_report(data_dir, tmp_path):
    workdir = str(tmp_path / "sweep" / "run")
    config = helpers.tiny_config(data_dir, *STEPS)
    train(config, workdir, stop_at=4)
    code, out, err = helpers.run_cli("eval", "--workdir", workdir)
    assert code == 0, err
    assert "scored checkpoint step 4 of 8" in out
    report = RunDir(workdir).read_eval()
    assert (report["checkpoint_step"], report["finished"], report["train_steps"]) == (4, False, 8)
    write_report(str(tmp_path / "sweep"))
    text = open(tmp_path / "sweep" / "report.md").read()
    assert "rope †" in text and "was scored at step 4 of 8 (training unfinished)" in text
    runs_csv = open(tmp_path / "sweep" / "runs.csv").read().splitlines()
    assert runs_csv[0].startswith(
        "dir,file,encoding,changes,train_seq_len,seed,checkpoint_step,train_steps"
    )
    assert runs_csv[1].split(",")[6:8] == ["4", "8"]

    result = train(config, workdir)
    evaluate_workdir(workdir, model=result.model, step=result.step, progress=False)
    report = RunDir(workdir).read_eval()
    assert (report["checkpoint_step"], report["finished"]) == (8, True)
    write_report(str(tmp_path / "sweep"))
    assert "†" not in open(tmp_path / "sweep" / "report.md").read()


# -- B.3: one process per directory ---------------------------------------------------------

HOLD = textwrap.dedent(
    """
    import sys, time
    from posenc.workdir import hold
    with hold(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_a_second_process_cannot_train_evaluate_or_sweep_in_a_used_directory(run_copy, data_dir):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, run_copy], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        metrics = _bytes(RunDir(run_copy).metrics_path)
        config = helpers.tiny_config(data_dir, *STEPS)
        with pytest.raises(WorkdirBusyError, match=f"in use by pid {holder.pid}"):
            train(config, run_copy)
        code, _, err = helpers.run_cli("eval", "--workdir", run_copy)
        assert code == 2 and f"in use by pid {holder.pid}" in _one_line_error(err, "eval")
        assert _bytes(RunDir(run_copy).metrics_path) == metrics, "nothing was written"
        with pytest.raises(WorkdirBusyError):
            sweep.run_sweep(_sweep_config(os.path.dirname(run_copy), 4), run_copy, verbose=False)
    finally:
        holder.kill()
        holder.wait()
    result = train(config, run_copy)  # the holder died: its lock is taken over
    assert (result.resumed_from, result.step) == (8, 8)


def _sweep_config(folder: str, steps: int) -> str:
    path = os.path.join(folder, f"sweep_{steps}.py")
    with open(path, "w") as f:
        f.write(
            textwrap.dedent(
                f"""
                from posenc.runs.config import apply_overrides, load_config
                from posenc.runs.sweep import product

                def get_config():
                    config = load_config({helpers.TINY_SPEC!r})
                    overrides = {list(helpers.TINY_OVERRIDES)!r}
                    return apply_overrides(config, overrides + ["train.steps={steps}"])

                def get_sweep():
                    return product(**{{"encoding.name": ["alibi", "nope"]}})
                """
            )
        )
    return path


def test_sweep_children_end_when_the_sweep_is_killed(data_dir, tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    env = {**os.environ, "POSENC_DATA_DIR": str(data_dir)}
    command = [sys.executable, "-m", "posenc.cli", "sweep", "--jobs", "2", "--workdir", sweep_dir]
    parent = subprocess.Popen(
        [*command, "--config", _sweep_config(str(tmp_path), 100_000)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    points = [os.path.join(sweep_dir, f"encoding.name-{n}") for n in ("alibi", "nope")]
    children = []
    deadline = time.monotonic() + 300  # two fresh interpreters importing JAX on a busy machine
    while len(children) < 2 and time.monotonic() < deadline:
        time.sleep(0.25)
        children = [h["pid"] for p in points if (h := lock_lib.holder(p)) and h.get("pid")]
    assert len(children) == 2, "the point processes did not start"
    assert lock_lib.holder(sweep_dir)["pid"] == parent.pid
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not any(_alive(pid) for pid in children), "a point process outlived its sweep"
    # A multithreaded process's leader shows as a zombie while its other threads still exit and
    # hold its files: the locks go a moment after.
    dirs = [sweep_dir, *points]
    while any(lock_lib.holder(p) for p in dirs) and time.monotonic() < deadline + 30:
        time.sleep(0.25)
    assert all(lock_lib.holder(p) is None for p in dirs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as ended.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ctrl_c_in_a_sweep_is_one_line(tmp_path, monkeypatch):
    def interrupted(point_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_point", interrupted)
    sweep_dir = str(tmp_path / "sweep")
    code, _, err = helpers.run_cli(
        "sweep", "--config", _sweep_config(str(tmp_path), 4), "--workdir", sweep_dir
    )
    assert code == 130
    assert err.strip() == (
        "posenc sweep: interrupted; run the same command again to resume from the last checkpoint"
    )
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        assert {p["status"] for p in json.load(f)["points"]} == {"interrupted"}


# -- B.4: damaged checkpoints ---------------------------------------------------------------


def _damage(step_dir: str, how: str) -> None:
    files = [
        os.path.join(folder, name)
        for folder, _, names in os.walk(step_dir)
        for name in names
        if name != CHECKSUM_FILE
    ]
    path = max(files, key=os.path.getsize)
    data = bytearray(_bytes(path))
    if how == "truncate":
        data = data[: len(data) // 3]
    else:
        data[len(data) // 2] ^= 0x40
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_a_damaged_checkpoint_is_reported_and_the_newest_intact_one_used(
    trained, run_copy, data_dir, how
):
    _damage(os.path.join(run_copy, "checkpoints", "8"), how)
    code, _, err = helpers.run_cli("eval", "--workdir", run_copy, "--lengths", "16")
    assert code == 0, err
    warning = [line for line in err.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("posenc: warning: checkpoint step 8")
    assert "using step 4" in warning[0] and "Traceback" not in err
    (name,) = [n for n in RunDir(run_copy).eval_files() if n != "eval.json"]
    assert RunDir(run_copy).read_eval(name)["checkpoint_step"] == 4

    # Resuming moves the damaged step aside and trains steps 5-8 again, exactly.
    with pytest.warns(UserWarning, match="moved it to"):
        result = train(helpers.tiny_config(data_dir, *STEPS), run_copy)
    assert (result.resumed_from, result.step) == (4, 8)
    assert os.listdir(os.path.join(run_copy, CORRUPT_DIR))[0].startswith("8-")
    for got, want in zip(_params(result.model), _params(load_model(trained)), strict=True):
        np.testing.assert_array_equal(got, want)


def test_no_intact_checkpoint_is_one_line(run_copy):
    for step in ("4", "8"):
        _damage(os.path.join(run_copy, "checkpoints", step), "truncate")
    code, _, err = helpers.run_cli("eval", "--workdir", run_copy)
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("posenc eval: error:")]
    assert len(errors) == 1 and "no intact checkpoint" in errors[0] and "Traceback" not in err


# -- B.5: an overflowing perplexity is a value ----------------------------------------------


def test_a_huge_loss_gives_an_infinite_perplexity_not_a_crash(trained, run_copy):
    model = load_model(trained)
    embedding = model.embed.embedding
    embedding[...] = embedding[...] * 3e3  # tied: the logits grow by the same factor
    report = evaluate_workdir(run_copy, model=model, step=8, progress=False)
    losses = [r["loss"] for r in report["results"]]
    assert all(np.isfinite(losses)) and min(losses) > 710, losses  # exp(710) overflows
    assert all(r["perplexity"] == float("inf") for r in report["results"])
    assert RunDir(run_copy).read_eval()["results"][0]["perplexity"] == float("inf")
    write_report(run_copy)
    table = open(os.path.join(run_copy, "report.md")).read()
    assert "| inf |" in table.replace("  ", " ").replace("  ", " ")
    summary = sweep.format_summary(
        [{"name": "p", "status": "done", **sweep.summarize_point(run_copy)}]
    )
    assert "inf" in summary


# -- B.6: nothing resumes silently on another run or other data ------------------------------


def test_checkpoints_without_config_json_are_not_resumed_by_another_encoder(run_copy, data_dir):
    os.remove(os.path.join(run_copy, "config.json"))
    config = helpers.tiny_config(data_dir, *STEPS, "encoding.name=alibi")
    with pytest.raises(WorkdirError, match="has checkpoints but no config.json"):
        train(config, run_copy)


def test_an_edited_textdir_is_not_resumed_on(tmp_path):
    texts = tmp_path / "texts"
    for split in ("train", "validation"):
        for i in range(2):
            path = texts / split / f"doc{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{split} {i} " * 400)
    config = helpers.tiny_config(tmp_path / "data", *STEPS, f"data.source=textdir:{texts}")
    workdir = str(tmp_path / "run")
    train(config, workdir, stop_at=4)
    (texts / "train" / "doc0.txt").write_text("something else entirely " * 300)
    with pytest.raises(WorkdirError, match=r"changed since the run started \(.*train"):
        train(config, workdir)
    assert os.listdir(os.path.join(workdir, "checkpoints")) == ["4"]


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--stop-at", "-5"], "argument --stop-at: expected a step >= 1, got '-5'"),
        (["--config.model.vocab_size=100"], "model.vocab_size=100 is smaller than the 257"),
    ],
)
def test_bad_train_input_is_one_line_before_anything_is_written(tmp_path, data_dir, extra, match):
    workdir = tmp_path / "run"
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", str(workdir)]
    code, _, err = helpers.run_cli(*argv, *helpers.tiny_flags(data_dir), *extra)
    assert code == 2 and match in err and "Traceback" not in err, err
    assert not workdir.exists()


def test_a_work_directory_that_is_a_file_is_one_line(tmp_path, data_dir):
    path = tmp_path / "run"
    path.write_text("notes")
    for argv in (
        ["train", "--config", helpers.TINY_SPEC, "--workdir", str(path)],
        ["eval", "--workdir", str(path)],
    ):
        code, _, err = helpers.run_cli(*argv)
        assert code == 2 and "is a file, not a directory" in _one_line_error(err, argv[0])
    assert path.read_text() == "notes"
