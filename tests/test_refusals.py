"""A user cannot lose a run or get a mislabelled number from the command line (issue 17's
hostile probes): every refusal is one line (exit status 2) that names what is wrong and what
to do, and leaves the work directory as it was.

Runs use the 1-layer, width-32 tiny config on ``pystdlib`` (``_train_helpers.py``).
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import subprocess
import sys
import textwrap

import _train_helpers as helpers
import pytest

from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import train
from posenc.workdir import RunDir

STEPS = ("train.steps=4", "train.checkpoint_every=2")


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A finished RoPE run (checkpoints at steps 2 and 4) with its eval.json."""
    workdir = str(tmp_path_factory.mktemp("trained") / "run")
    result = train(helpers.tiny_config(data_dir, *STEPS), workdir)
    evaluate_workdir(workdir, model=result.model, step=result.step, progress=False)
    return workdir


@pytest.fixture
def run_copy(trained, tmp_path):
    """A copy of the trained run that a test may change."""
    copy = str(tmp_path / "run")
    shutil.copytree(trained, copy)
    return copy


def _snapshot(folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes), the lock file aside."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if name != "posenc.lock":
                with open(path, "rb") as f:
                    out[os.path.relpath(path, folder)] = f.read()
    return out


_one_line_error = helpers.one_line_error


# -- 1: an evaluation's --output never replaces a file the run owns -------------------------


@pytest.mark.parametrize(
    "name, match",
    [
        ("config.json", "config.json is the run's own"),
        ("data.json", "data.json is the run's own"),
        ("init.json", "init.json is the run's own"),
        ("metrics.jsonl", "metrics.jsonl is the run's own"),
        ("posenc.lock", "posenc.lock is the run's own"),
        ("status.json", "status.json is the run's own"),
        ("point.json", "point.json is the run's own"),
        ("sweep.json", "sweep.json is the run's own"),
        ("checkpoints", "checkpoints is the run's own"),
        ("../x.json", "a file name inside the work directory"),
        ("{beside}/x.json", "a file name inside the work directory"),  # an absolute path
        ("sub/x.json", "a file name inside the work directory"),
        (".x.json", "may not start with '.'"),
        ("x.txt", "must end in .json"),
    ],
)
def test_eval_output_never_replaces_the_runs_files_or_leaves_it(run_copy, name, match):
    before = _snapshot(run_copy)
    outside = os.listdir(os.path.dirname(run_copy))
    name = name.format(beside=os.path.dirname(run_copy))
    code, _, err = helpers.run_cli(
        "eval", "--workdir", run_copy, "--lengths", "16", "--output", name
    )
    assert code == 2
    line = _one_line_error(err, "eval")
    assert "--output" in line and match in line, line
    assert _snapshot(run_copy) == before
    assert os.listdir(os.path.dirname(run_copy)) == outside
    # The run is still usable: evaluation and a resumed training accept it.
    RunDir(run_copy).read_config()


# -- 3: a refused --init-from leaves nothing behind -----------------------------------------

HOLD = textwrap.dedent(
    """
    import sys, time
    from posenc.workdir import hold
    with hold(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_a_refused_init_from_leaves_nothing_and_the_corrected_command_runs(
    run_copy, data_dir, tmp_path
):
    target = str(tmp_path / "finetune")
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", target]
    argv += [*helpers.tiny_flags(data_dir), "--config.train.steps=1", "--no-eval"]
    refusals = [
        (["--init-from", str(tmp_path / "nowhere")], "not a posenc work directory"),
        (["--init-from", run_copy, "--config.model.model_dim=64"], "do not fit this model"),
    ]
    for extra, match in refusals:
        code, _, err = helpers.run_cli(*argv, *extra)
        assert code == 2 and match in _one_line_error(err, "train")
        assert not os.path.exists(target), f"{extra} left {os.listdir(target)}"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, run_copy], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        code, _, err = helpers.run_cli(*argv, "--init-from", run_copy)
        assert code == 2 and f"in use by pid {holder.pid}" in _one_line_error(err, "train")
        assert not os.path.exists(target), os.listdir(target)
    finally:
        holder.kill()
        holder.wait()
    code, out, err = helpers.run_cli(*argv, "--init-from", run_copy)
    assert code == 0, err
    assert RunDir(target).read_config().train.init_from == os.path.abspath(run_copy)


def test_a_refusal_after_the_directory_exists_rolls_back_what_it_wrote(data_dir, tmp_path):
    """The directory exists (empty, made by the user) and setup fails after posenc recorded the
    config: the directory is left as it was, and the corrected command is not refused as
    another run."""
    target = tmp_path / "run"
    target.mkdir()
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", str(target)]
    argv += [*helpers.tiny_flags(data_dir), "--config.train.steps=1", "--no-eval"]
    code, _, err = helpers.run_cli(*argv, "--init-from", str(tmp_path / "nowhere"))
    assert code == 2 and "not a posenc work directory" in _one_line_error(err, "train")
    assert os.listdir(target) == []
    code, _, err = helpers.run_cli(*argv)
    assert code == 0, err


# -- 4: what cannot fit in memory is refused in one line, before it runs ---------------------

# Far beyond any test machine (einsum attention holds [B, H, L, L] float32 logits): 2.5 TB.
HUGE = ("--config.model.attention_impl=einsum", "--config.train.seq_len=200000")


def test_training_that_cannot_fit_is_one_line_and_writes_nothing(data_dir, tmp_path):
    target = tmp_path / "run"
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", str(target)]
    code, _, err = helpers.run_cli(*argv, *helpers.tiny_flags(data_dir), *HUGE)
    assert code == 2
    line = _one_line_error(err, "train")
    assert "a training step on 8 windows of 200000 tokens needs about" in line, line
    assert "train.seq_len" in line and "model.attention_impl=blocked" in line
    assert not target.exists()


def test_evaluation_that_cannot_fit_is_one_line_and_writes_nothing(run_copy):
    before = _snapshot(run_copy)
    code, _, err = helpers.run_cli(
        "eval", "--workdir", run_copy, "--lengths", "200000", "--config.model.attention_impl=einsum"
    )
    assert code == 2
    line = _one_line_error(err, "eval")
    assert "evaluating length 200000 in batches of 1 window needs about" in line, line
    assert "leave 200000 out of eval.lengths" in line
    assert _snapshot(run_copy) == before


def test_a_task_length_that_cannot_fit_names_the_length(data_dir):
    from posenc.devices import fits
    from posenc.kinds import tasks

    config = helpers.tiny_config(data_dir, "model.attention_impl=einsum")
    with pytest.raises(fits.DoesNotFitError, match=r"eval.lengths entry 100000: .* needs about"):
        tasks.evaluate_task(
            helpers.initial_model(config), "reverse_string", [100000], examples=1, seed=0
        )


def test_an_allocation_failure_is_one_line(run_copy, monkeypatch):
    """What an estimate misses still ends in one line: XLA's RESOURCE_EXHAUSTED."""
    import jax

    from posenc.kinds import stream

    def exhausted(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes.")

    monkeypatch.setattr(stream, "evaluate", exhausted)
    code, _, err = helpers.run_cli("eval", "--workdir", run_copy, "--lengths", "16")
    assert code == 2
    line = _one_line_error(err, "eval")
    assert "ran out of memory" in line and "eval.batch_tokens" in line, line


# -- 5: a work directory posenc cannot write to is one line ---------------------------------


def _writes(mode: str | int) -> bool:
    if isinstance(mode, int):  # os.open flags
        return bool(mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
    return any(c in mode for c in "wax+")


@pytest.fixture
def read_only(monkeypatch):
    """Makes folders read-only (``chmod a-w``, all the way down). Root ignores permissions, so
    for root the operating system's answer to a write there (EACCES) is given by patching the
    calls that create or open files for writing."""
    folders = []

    def make(folder: str) -> None:
        for root, dirs, files in os.walk(folder):
            for name in [*dirs, *files, ""]:
                path = os.path.join(root, name)
                os.chmod(path, os.stat(path).st_mode & ~0o222)
        folders.append(os.path.abspath(folder))

    def inside(path) -> bool:
        path = os.path.abspath(os.fsdecode(path))
        return any(path == f or path.startswith(f + os.sep) for f in folders)

    def refuse(path):
        raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))

    if os.geteuid() == 0:
        real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir

        def fake_open(file, mode="r", *args, **kwargs):
            if isinstance(file, str | bytes | os.PathLike) and _writes(mode) and inside(file):
                refuse(file)
            return real_open(file, mode, *args, **kwargs)

        def fake_os_open(path, flags, *args, **kwargs):
            if _writes(flags) and inside(path):
                refuse(path)
            return real_os_open(path, flags, *args, **kwargs)

        def fake_mkdir(path, *args, **kwargs):
            if inside(path):
                refuse(path)
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(os, "open", fake_os_open)
        monkeypatch.setattr(os, "mkdir", fake_mkdir)
    yield make
    for folder in folders:  # writable again, so that tmp_path can be cleaned
        for root, dirs, files in os.walk(folder):
            for name in [*dirs, *files, ""]:
                path = os.path.join(root, name)
                os.chmod(path, os.stat(path).st_mode | 0o200)


def test_a_read_only_work_directory_is_one_line(run_copy, data_dir, read_only):
    before = _snapshot(run_copy)
    read_only(run_copy)
    flags = [*helpers.tiny_flags(data_dir), *(f"--config.{o}" for o in STEPS)]
    train_argv = ["train", "--config", helpers.TINY_SPEC, *flags]
    for argv in (
        ["eval", "--workdir", run_copy, "--lengths", "16"],
        [*train_argv, "--workdir", run_copy],
        [*train_argv, "--workdir", os.path.join(run_copy, "new")],
        ["report", run_copy],
    ):
        code, _, err = helpers.run_cli(*argv)
        assert code == 2, (argv, err)
        line = _one_line_error(err, argv[0])
        assert f"in {run_copy} (Permission denied)" in line, line
        assert f"posenc {argv[0]} writes" in line and "chmod -R u+w" in line, line
    assert _snapshot(run_copy) == before


# -- 6: a full disk while a checkpoint is saved is one line ---------------------------------


def test_a_full_disk_during_a_save_is_one_line_and_the_run_resumes(
    data_dir, tmp_path, monkeypatch, capfd
):
    workdir = str(tmp_path / "run")
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", workdir]
    argv += [*helpers.tiny_flags(data_dir), *(f"--config.{o}" for o in STEPS), "--no-eval"]
    real_open = builtins.open
    step_2 = os.path.join(workdir, "checkpoints", "4.")

    def full_disk(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike) and os.fspath(file).startswith(step_2):
            if _writes(mode):  # orbax's metadata files of step 4 (TensorStore writes the rest)
                raise OSError(errno.ENOSPC, "No space left on device", os.fspath(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_disk)
    code, _, err = helpers.run_cli(*argv)
    monkeypatch.setattr(builtins, "open", real_open)
    err += capfd.readouterr().err  # what orbax's threads log goes to the process's stderr
    assert code == 2
    line = _one_line_error(err, "train")
    assert "saving checkpoint step 4" in line and "No space left on device" in line, line
    assert "the last good checkpoint, step 2, is intact" in line and "run the same" in line
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints")))[0] == "2"

    code, out, err = helpers.run_cli(*argv)
    assert code == 0, err
    assert "resumed from step 2" in out
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]


# -- rough edges ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, match",
    [
        ("config.train.stepz = 5", "no config field 'stepz' (did you mean 'steps'?)"),
        ("config.trian.steps = 5", "no config field 'trian' (did you mean 'train'?)"),
        ("config.train.steps = 'five'", "Could not override field 'steps'"),
    ],
)
def test_a_typo_in_a_sweep_files_get_config_is_one_line(tmp_path, line, match):
    path = tmp_path / "sweep.py"
    path.write_text(
        textwrap.dedent(
            f"""
            from posenc.runs.config import load_config
            from posenc.runs.sweep import product

            def get_config():
                config = load_config({helpers.TINY_SPEC!r})
                {line}
                return config

            def get_sweep():
                return product(**{{"encoding.name": ["alibi"]}})
            """
        )
    )
    code, _, err = helpers.run_cli("sweep", "--config", str(path), "--workdir", str(tmp_path / "s"))
    assert code == 2
    error = _one_line_error(err, "sweep")
    assert f"{path}, line 7 ({line})" in error and match in error, error
    assert not (tmp_path / "s").exists()


def test_an_empty_evaluation_split_is_called_empty(tmp_path, data_dir):
    from posenc.runs.config import check_eval_lengths

    for tokens in (0, 1):  # nothing, or one document separator (an empty file)
        with pytest.raises(ValueError, match="the validation split is empty") as e:
            check_eval_lengths(tokens, [16, 32], "validation")
        assert "lengths <=" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"use lengths <= 9 or"):  # short, not empty
        check_eval_lengths(10, [16], "validation")
    # From the command line: a textdir folder whose validation file is empty.
    (tmp_path / "texts" / "train").mkdir(parents=True)
    (tmp_path / "texts" / "validation").mkdir()
    (tmp_path / "texts" / "train" / "a.txt").write_text("alpha beta gamma. " * 200)
    (tmp_path / "texts" / "validation" / "b.txt").write_text("")
    argv = ["train", "--config", helpers.TINY_SPEC, "--workdir", str(tmp_path / "run")]
    argv += [*helpers.tiny_flags(data_dir), f"--config.data.source=textdir:{tmp_path / 'texts'}"]
    code, _, err = helpers.run_cli(*argv)
    assert code == 2 and "the validation split is empty" in err.splitlines()[-1], err


@pytest.mark.parametrize("extra", [(), ("eval.stride=4",)])
def test_sliding_evaluation_of_a_task_run_says_it_does_not_apply(data_dir, extra):
    from posenc.runs.config import validate

    config = helpers.tiny_config(
        data_dir,
        "data.source=synthetic:reverse_string",
        "train.seq_len=8",
        "eval.lengths=4,8",
        "eval.mode=sliding",
        *extra,
    )
    with pytest.raises(ValueError, match="sliding evaluation does not apply to") as e:
        validate(config)
    assert "eval.mode='sliding'" in str(e.value) and "synthetic:reverse_string" in str(e.value)
