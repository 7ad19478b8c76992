"""The ``posenc`` command line: help, train/eval end to end on a ``textdir:`` folder, overrides,
and exit status 2 with a message naming the problem for bad input.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.runs.evaluate import load_eval
from posenc.workdir import RunDir, analysis_names
from posenc.workdir.metrics import read_metrics

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _write_corpus(folder: Path, files: int = 24) -> None:
    """Small deterministic text files (about 1-2 kB each)."""
    for i in range(files):
        lines = [
            f"{WORDS[(i + j) % len(WORDS)]} {j * i % 97} {WORDS[(i * j) % len(WORDS)]}."
            for j in range(60 + 5 * i)
        ]
        path = folder / f"part{i % 3}" / f"doc{i:02d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")


_cli = helpers.run_cli
_tiny_flags = helpers.tiny_flags


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    _write_corpus(root / "texts")
    return root


@pytest.fixture(scope="module")
def trained(corpus):
    """``posenc train`` on the textdir folder, with overrides in both accepted spellings."""
    workdir = corpus / "run"
    code, out, err = _cli(
        "train",
        "--config",
        helpers.TINY_SPEC,
        "--workdir",
        str(workdir),
        *_tiny_flags(corpus / "data"),
        f"--config.data.source=textdir:{corpus / 'texts'}",
        "--config.encoding.name",  # the two-argument form
        "alibi",
        "--config.train.steps=6",
        "--config.train.checkpoint_every=3",
        "--config.eval.lengths=16,32",
    )
    assert code == 0, err
    return workdir, out


def test_train_end_to_end_on_textdir(trained, corpus):
    workdir, out = trained
    config = RunDir(workdir).read_config()
    assert config.encoding.name == "alibi"
    assert config.train.steps == 6 and config.model.model_dim == 32
    assert config.data.source == f"textdir:{corpus / 'texts'}"
    assert config.eval.lengths == (16, 32)
    assert [line["step"] for line in read_metrics(str(workdir))] == [1, 2, 3, 4, 5, 6]
    assert "step 6: train loss" in out and "evaluating" in out

    report = load_eval(str(workdir))
    assert report is not None, "posenc train evaluates at the end"
    assert [r["length"] for r in report["results"]] == [16, 32]
    assert report["encoding"] == "alibi"
    assert report["data"]["source"].startswith("textdir:")
    assert report["data"]["kind"] == "textdir" and report["data"]["split"] == "validation"
    assert list((corpus / "data" / "posenc" / "textdir").iterdir()), "prepared under data_dir"
    for r in report["results"]:
        assert r["tokens"] > 0 and r["loss"] > 0
    data_json = json.loads((workdir / "data.json").read_text())
    assert data_json["spec"] == f"textdir:{corpus / 'texts'}"


def _checkpoints(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
def test_analyze_writes_attention_tables_and_plots(trained):
    """posenc analyze end to end: every file, the tables' shape, rows that sum to one."""
    workdir, _ = trained
    first_report = (workdir / "eval.json").read_text()
    code, out, err = _cli(
        "analyze", "--workdir", str(workdir), "--lengths", "16,48", "--tokens", "96"
    )
    assert code == 0, err
    names = analysis_names({}, {"lengths": (16, 48), "tokens": 96})  # not the defaults
    for name in names.values():
        assert f"wrote {workdir / name}" in out
    record = json.loads((workdir / names["json"]).read_text())
    assert [r["length"] for r in record["lengths"]] == [16, 48]
    assert record["encoding"] == "alibi" and record["num_layers"] == 1
    heads = record["num_heads"]
    for r in record["lengths"]:
        assert r["windows"] == max(1, 96 // r["length"])
        # Each row's probabilities sum to 1: weight x pairs over the distances is the rows.
        pairs = np.asarray(r["pairs"])
        for head in r["weight"][0]:
            assert float(np.dot(head, pairs)) == pytest.approx(r["tokens"], rel=1e-4)
        assert 0 < min(r["normalized_entropy"][0]) <= max(r["normalized_entropy"][0]) <= 1
    table = (workdir / names["table"]).read_text()
    assert "| 16 (train) |" in table and "## Mean attention weight by distance, L = 48" in table
    with open(workdir / names["csv"]) as f:
        rows = list(csv.reader(f))
    assert len(rows) == 1 + sum(heads * len(r["buckets"]) for r in record["lengths"])
    with open(workdir / names["entropy_csv"]) as f:
        assert len(list(csv.reader(f))) == 1 + 2 * heads
    for kind in ("plot", "entropy_plot"):
        assert (workdir / names[kind]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (workdir / "eval.json").read_text() == first_report, "the evaluation is untouched"

    # Under changed settings (another split) the files are named by the change.
    code, out, err = _cli(
        "analyze", "--workdir", str(workdir), "--lengths", "16", "--tokens", "32",
        "--split", "test",
    )  # fmt: skip
    assert code == 0, err
    other = analysis_names({"eval.split": "test"}, {"lengths": (16,), "tokens": 32})
    assert other["json"].startswith("attention-split-test__")
    assert json.loads((workdir / other["json"]).read_text())["split"] == "test"
    assert json.loads((workdir / names["json"]).read_text()) == record


def test_eval_at_new_lengths_does_not_retrain(trained):
    workdir, _ = trained
    before = (_checkpoints(workdir), (workdir / "metrics.jsonl").read_text())
    first_report = (workdir / "eval.json").read_text()

    code, out, err = _cli(
        "eval", "--workdir", str(workdir), "--lengths", "16,48", "--output", "x.json"
    )
    assert code == 0, err
    assert "wrote" in out and "x.json" in out
    report = load_eval(str(workdir), "x.json")
    assert [r["length"] for r in report["results"]] == [16, 48]
    assert (_checkpoints(workdir), (workdir / "metrics.jsonl").read_text()) == before
    assert _checkpoints(workdir) == ["3", "6"]
    assert (workdir / "eval.json").read_text() == first_report, "other reports are untouched"
    assert RunDir(workdir).read_config().eval.lengths == (16, 32), "the run's config is unchanged"
    # Same length, same model, same windows: the same number as the training run's evaluation.
    first = json.loads(first_report)["results"][0]
    assert report["results"][0]["loss"] == pytest.approx(first["loss"], rel=1e-6)

    # Overrides through --config.eval.* and the mode flags.
    code, _, err = _cli(
        "eval",
        "--workdir",
        str(workdir),
        "--config.eval.lengths=24",
        "--mode",
        "sliding",
        "--stride",
        "8",
        "--max-tokens",
        "64",
        "--output",
        "s.json",
    )
    assert code == 0, err
    report = load_eval(str(workdir), "s.json")
    assert report["mode"] == "sliding" and report["stride"] == 8
    (r,) = report["results"]
    assert r["length"] == 24 and r["tokens"] == 24 + 5 * 8  # windows: 1 + (64 - 24) // 8
    assert _checkpoints(workdir) == ["3", "6"]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["eval", "--lengths", "0"], "eval.lengths"),
        (["eval", "--mode", "sliding"], "eval.stride"),
        (["eval", "--mode", "sliding", "--stride", "64"], "eval.stride=64"),
        (["eval", "--lengths", "100000"], "eval.lengths [100000]"),
        (["eval", "--config.eval.lenghts=16"], "unknown config field 'eval.lenghts'"),
        (["eval", "--max-tokens", "-1"], "eval.max_tokens"),
    ],
)
def test_eval_bad_input_exits_2(trained, argv, match):
    workdir, _ = trained
    code, _, err = _cli(argv[0], "--workdir", str(workdir), *argv[1:])
    assert code == 2
    assert match in err and err.startswith("posenc eval: error:")
    assert _checkpoints(workdir) == ["3", "6"]


def test_train_bad_input_exits_2_before_creating_anything(tmp_path, corpus):
    flags = _tiny_flags(corpus / "data")
    cases = [
        (["--config.train.stepz=3"], "unknown config field 'train.stepz'"),
        (["--config.train.steps=abc"], "config field train.steps"),
        (["--config.encoding.name=fancy"], "unknown encoding.name 'fancy'"),
        (["--config.eval.lengths=0"], "eval.lengths"),
        (["--config.model.head_dim=15"], "head dimension of 15"),
        (["--config.data.source=tfds:posenc_never_prepared_xyz"], "posenc data prepare tfds:"),
        (
            [f"--config.data.source=textdir:{corpus / 'texts'}", "--config.eval.lengths=100000"],
            "eval.lengths [100000]",
        ),
    ]
    for extra, match in cases:
        workdir = tmp_path / "run"
        args = ["train", "--config", helpers.TINY_SPEC, "--workdir", str(workdir)]
        code, _, err = _cli(*args, *flags, *extra)
        assert code == 2, (extra, err)
        assert match in err, (extra, err)
        assert err.startswith("posenc train: error:")
        assert not workdir.exists(), extra


@pytest.mark.parametrize(
    "argv, match",
    [
        ([], "COMMAND"),
        (["fly"], "invalid choice: 'fly'"),
        (["train", "--workdir", "w"], "--config"),
        (["eval", "--workdir", "w", "--lengths", "a,b"], "comma-separated integers"),
        (["eval", "--workdir", "w", "--mode", "strided"], "invalid choice: 'strided'"),
        (["data", "info", "pystdlib", "--config.train.steps=3"], "do not apply"),
        (["train", "--config", "c.py", "--workdir", "w", "--config.train.steps"], "needs a value"),
        (["eval", "--workdir", "/nonexistent/posenc-run"], "not a posenc work directory"),
        (["train", "--config", "/nonexistent/c.py", "--workdir", "w"], "no config file"),
        (
            ["data", "info", "tfds:posenc_never_prepared_xyz", "--data-dir", "/nonexistent"],
            "prepare",
        ),
    ],
)
def test_usage_errors_exit_2_with_a_message(argv, match):
    code, out, err = _cli(*argv)
    assert code == 2, (argv, err)
    assert match in err, (argv, err)
    assert "Traceback" not in err


HELP = {
    (): ["train", "eval", "data", "sweep", "report", "--config.<field>=<value>"],
    ("train",): ["--config", "--workdir", "--no-eval", "--stop-at"],
    ("eval",): [
        "--workdir",
        "--lengths",
        "--split",
        "--mode",
        "--stride",
        "--max-tokens",
        "--output",
    ],
    ("data",): ["prepare", "info"],
    ("data", "prepare"): ["spec", "--data-dir", "--text-field"],
    ("data", "info"): ["spec", "--data-dir", "--text-field"],
    ("sweep",): [
        "--config",
        "--workdir",
        "--jobs",
        "--only",
        "--list",
        "--compile-cache",
        "--config.<field>=<value>",
    ],
    ("report",): ["sweep_dir", "--metric"],
    ("plan",): ["--config", "--devices", "--device-memory"],
}


@pytest.mark.parametrize("command", list(HELP), ids=lambda c: " ".join(c) or "posenc")
def test_help_exits_0_and_lists_the_flags(command):
    code, out, err = _cli(*command, "--help")
    assert code == 0, err
    assert out.startswith("usage: posenc")
    for flag in HELP[command]:
        assert flag in out, (command, flag)


def test_console_script_help():
    script = Path(sys.executable).with_name("posenc")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "posenc.cli"]
    done = subprocess.run(
        [*argv, "--help"], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    assert "usage: posenc" in done.stdout and "eval" in done.stdout
    done = subprocess.run([*argv, "fly"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_divergence_exits_3_with_one_line_and_keeps_the_checkpoint(tmp_path, corpus):
    workdir = tmp_path / "run"
    code, _, err = _cli(
        "train",
        "--config",
        helpers.TINY_SPEC,
        "--workdir",
        str(workdir),
        *_tiny_flags(corpus / "data"),
        f"--config.data.source=textdir:{corpus / 'texts'}",
        "--config.train.steps=8",
        "--config.train.checkpoint_every=2",
        "--config.train.log_every=1",
        "--config.optim.warmup_steps=0",
        "--config.optim.grad_clip=0",
        "--config.optim.learning_rate=1e9",
    )
    assert code == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("posenc train: training diverged:"), err
    assert "Traceback" not in err
    # Diverged before its first checkpoint: the message must not claim a checkpoint was kept.
    assert "no checkpoint is kept" in err and not (workdir / "checkpoints" / "2").exists()
    assert not (workdir / "eval.json").exists()
