"""Retrieval and analysis results named by their settings (a later ``posenc retrieval`` at other
lengths, tasks or haystack, ``eval --tasks`` or ``analyze`` never replaces an earlier one's
files), the report gathering every record (old plain names included) under the name the
perplexity table gives the same evaluation, and the up-front refusals of ``posenc retrieval``
and ``posenc eval --tasks`` (threshold, lengths beyond a learned table, a non-LM run)."""

from __future__ import annotations

import json
import math
import os

import _train_helpers as helpers
import pytest

from posenc.workdir import (
    RunDir,
    analysis_names,
    eval_file_name,
    retrieval_names,
)

YARN = {
    "encoding.hparams.scaling": "yarn",
    "encoding.hparams.factor": 4,
    "encoding.hparams.original_max_len": 128,
}


def test_retrieval_names_keep_every_setting_apart():
    plain = retrieval_names({}, {})
    assert plain["json"] == "retrieval.json" and plain["trials"] == "retrieval.jsonl"
    variants = [
        {"lengths": (4096,)},
        {"lengths": (8192,)},
        {"lengths": (4096, 8192)},
        {"tasks": ("vt",)},
        {"tasks": ("passkey", "vt")},
        {"haystack": "textdir:/data/essays"},
        {"seed": 1},
        {"trials": 50},
        {"depths": (0.5,)},
        {"threshold": 50.0},
    ]
    names = [retrieval_names({}, v)["json"] for v in variants]
    names += [retrieval_names(YARN, {})["json"], retrieval_names(YARN, variants[0])["json"]]
    assert len(set(names)) == len(names) and plain["json"] not in names, names
    for name in names:
        assert name.startswith("retrieval-") and name.endswith(".json") and "/" not in name
    # The same settings, however written, name the same files (a rerun replaces its own).
    assert retrieval_names(YARN, {"seed": 1}) == retrieval_names(
        dict(reversed(YARN.items())), {"seed": 1}
    )
    # Every kind of file follows its record's name.
    named = retrieval_names({}, {"lengths": (4096,)})
    assert {
        n.removesuffix(s)
        for n, s in zip(
            named.values(), [".json", ".jsonl", ".md", ".png", "_length.png"], strict=True
        )
    } == {named["json"].removesuffix(".json")}


def test_analysis_names_keep_lengths_and_tokens_apart():
    assert analysis_names({}, {})["json"] == "attention.json"
    names = [
        analysis_names({}, {"lengths": (64,)})["json"],
        analysis_names({}, {"lengths": (1024,)})["json"],
        analysis_names({}, {"tokens": 4096})["json"],
        analysis_names({"eval.split": "test"}, {})["json"],
    ]
    assert len(set(names)) == len(names) and "attention.json" not in names, names


def test_yarn_evaluation_file_name_keeps_the_method():
    for changes in (YARN, {**YARN, "eval.lengths": (128, 256, 512, 1024, 2048, 4096)}):
        name = eval_file_name(changes)
        assert "scaling-yarn" in name, name
        assert "scaling-yarn" in retrieval_names(changes, {})["json"]
        assert "scaling-yarn" in analysis_names(changes, {})["json"]


def test_threshold_outside_0_100_is_refused_in_one_line(tmp_path):
    for bad in ("-5", "nan", "200", "inf"):
        code, _, err = helpers.run_cli("retrieval", "--workdir", str(tmp_path), "--threshold", bad)
        line = helpers.one_line_error(err, "retrieval")
        assert code == 2 and "--threshold" in line and "[0, 100]" in line, line


def test_threshold_is_checked_by_the_library_too():
    from posenc.retrieval.run import check_request

    for bad in (-5, math.nan, 200.0):
        with pytest.raises(ValueError, match=r"threshold.*\[0, 100\]"):
            check_request(["passkey"], [512], [0.5], 1, threshold=bad)


def _record(changes, lengths, scores, *, tasks=("passkey",), train_len=128):
    """A retrieval record as ``posenc retrieval`` writes it (one depth), built by hand."""
    cells = [{"length": n, "depth": 0.5, "trials": 2, "correct": 0, "score": s}
             for n, s in zip(lengths, scores, strict=True)]  # fmt: skip
    by_length = [{"length": n, "score": s} for n, s in zip(lengths, scores, strict=True)]
    task = {"cells": cells, "by_length": by_length, "effective_length": None, "metric": "x"}
    return {
        "encoding": "rope", "changes": changes, "train_seq_len": train_len,
        "tasks": {t: task for t in tasks}, "by_length": by_length, "effective_length": None,
        "threshold": 85.6, "lengths": list(lengths), "depths": [0.5], "trials": 2, "seed": 0,
    }  # fmt: skip


def test_report_gathers_every_record_named_as_the_perplexity_table_names_it(tmp_path):
    """An old run's plain retrieval.json and the records named by their settings are all
    rows, and a YaRN evaluation's row says ``rope (yarn x4)``, as the perplexity column does."""
    from posenc.report.retrieval import retrieval_section
    from posenc.report.runs import describe_changes
    from posenc.workdir import write_json

    run = tmp_path / "run"
    write_json(run / "retrieval.json", _record({}, [128, 256], [100.0, 50.0]))
    write_json(run / retrieval_names({}, {"lengths": (512,)})["json"], _record({}, [512], [25.0]))
    write_json(run / retrieval_names(YARN, {})["json"], _record(YARN, [128, 512], [100.0, 75.0]))
    md, files = retrieval_section(str(tmp_path))
    rows = [line for line in md if line.startswith("| rope")]
    assert len(rows) == 3, md
    assert describe_changes("rope", YARN, 128) == "yarn x4"
    (yarn,) = [r for r in rows if "75.0" in r]
    assert yarn.startswith("| rope (yarn x4) ["), yarn
    assert sum("| 25.0 |" in r for r in rows) == 1 and sum("| 50.0 |" in r for r in rows) == 1
    assert len([f for f in files if f.startswith("retrieval_heatmap_")]) == 3


def _recorded(tmp_path, *overrides: str) -> str:
    """A work directory holding only a config: every refusal below comes before a checkpoint
    (there is none) or the perplexity evaluation is read or run."""
    run = RunDir(tmp_path / "run")
    run.create()
    run.record_config(helpers.tiny_config(tmp_path / "data", *overrides))
    return str(tmp_path / "run")


def test_retrieval_beyond_a_learned_table_is_refused_before_any_work(tmp_path):
    workdir = _recorded(tmp_path, "encoding.name=learned", "encoding.hparams.max_len=400")
    code, _, err = helpers.run_cli("retrieval", "--workdir", workdir, "--lengths", "360,420,500")
    line = helpers.one_line_error(err, "retrieval")
    assert code == 2 and "420, 500" in line and "360," not in line, line
    assert "encoding.hparams.max_len=400" in line, line


def test_retrieval_refuses_lengths_whose_prompt_does_not_fit_in_the_library(tmp_path):
    """The library's own check after planning (exact answer tokens), as a fake model sees it."""
    from posenc.retrieval.prompt import Haystack
    from posenc.retrieval.run import evaluate_retrieval

    class Bytes:
        def encode(self, text):
            import numpy as np

            return np.frombuffer(text.encode(), np.uint8).astype(np.int32)

        def decode(self, ids):
            return bytes(int(i) for i in ids).decode(errors="replace")

    def check(n):
        if n > 450:
            raise ValueError(f"table of 450 positions, got {n}")

    calls = []
    with pytest.raises(ValueError, match=r"cannot score length\(s\) 450, 500: at 450"):
        evaluate_retrieval(
            lambda prompts, k: calls.append(1) or prompts[:, :k],
            Bytes(), ["passkey"], [400, 450, 500], [0.5], trials=1,
            haystack=Haystack(Bytes()), check_length=check,
        )  # fmt: skip
    assert calls == [], "nothing is decoded before the refusal"


@pytest.mark.parametrize(
    "overrides, flags, words",
    [
        (["encoding.name=learned", "encoding.hparams.max_len=400"], ["--lengths", "420"],
         ["420", "encoding.hparams.max_len=400"]),
        ([], ["--lengths", "16"], ["too short for passkey"]),
        ([], ["--lengths", "420", "--config.encoding.hparams.scaling=pi"],
         ["encoding.hparams.scaling"]),
        ([], ["--lengths", "420", "--config.encoding.hparams.scaling=dynamic",
              "--config.encoding.hparams.factor=2"],
         ["encoding.hparams.scaling='dynamic'", "key/value cache"]),
    ],
    ids=["learned", "too_short", "bad_override", "not_cacheable"],
)  # fmt: skip
def test_eval_tasks_is_refused_before_perplexity(tmp_path, overrides, flags, words):
    workdir = _recorded(tmp_path, *overrides)
    code, out, err = helpers.run_cli("eval", "--workdir", workdir, "--tasks", "passkey", *flags)
    line = helpers.one_line_error(err, "eval")
    assert code == 2 and all(w in line for w in words), line
    assert "evaluating" not in out and not list(RunDir(workdir).eval_files())


def test_eval_tasks_on_an_encoder_decoder_is_refused_before_perplexity(tmp_path):
    config = helpers.load_config(str(helpers.REPO / "configs" / "translation.py:tiny"))
    run = RunDir(tmp_path / "run")
    run.create()
    run.record_config(config)
    code, out, err = helpers.run_cli("eval", "--workdir", str(run.path), "--tasks", "passkey")
    line = helpers.one_line_error(err, "eval")
    assert code == 2 and "model.assembly='encoder_decoder'" in line, line
    assert "evaluating" not in out


@pytest.mark.slow
def test_later_retrievals_and_analyses_keep_the_earlier_ones(tmp_path):
    """Retrieval at other lengths, tasks, under YaRN and from eval --tasks, and analyses at
    other lengths: every record stays, each says what it measured, and the report has a row for
    each, an old plain-named record of an earlier posenc included."""
    data = tmp_path / "data"
    helpers.build_pystdlib(data)
    workdir = tmp_path / "run"
    from posenc.runs.train import train

    train(helpers.tiny_config(data, "train.steps=2", "eval.lengths=16,32"), str(workdir))
    small = ["--depths", "1", "--trials", "1"]
    for flags in (
        ["--lengths", "420"],
        ["--lengths", "500"],
        ["--lengths", "420", "--tasks", "niah_single_1"],
        ["--lengths", "420", "--config.encoding.hparams.scaling=yarn",
         "--config.encoding.hparams.factor=4"],
    ):  # fmt: skip
        code, _, err = helpers.run_cli("retrieval", "--workdir", str(workdir), *small, *flags)
        assert code == 0, err
    code, _, err = helpers.run_cli(
        "eval", "--workdir", str(workdir), "--lengths", "420", "--tasks", "passkey"
    )
    assert code == 0, err
    run = RunDir(workdir)
    records = {name: run.read_eval(name) for name in run.retrieval_files()}
    assert len(records) == 5, sorted(records)
    measured = sorted(
        (tuple(r["lengths"]), tuple(r["tasks"]), r["trials"], bool(r["changes"]))
        for r in records.values()
    )
    assert measured == [
        ((420,), ("niah_single_1",), 1, False),
        ((420,), ("passkey",), 1, False),
        ((420,), ("passkey",), 1, True),
        ((420,), ("passkey",), 10, False),  # eval --tasks: the default depths and trials
        ((500,), ("passkey",), 1, False),
    ]
    for name, record in records.items():  # every trial file is its own record's
        trials = [json.loads(x) for x in open(workdir / record["files"]["trials"])]
        assert len(trials) == len(record["depths"]) * record["trials"], name
        assert {t["length"] for t in trials} == set(record["lengths"]), name
    eval_report = run.read_eval(next(n for n in run.eval_files() if "420" in n))
    assert eval_report["retrieval"]["files"]["record"] in records
    # An earlier posenc's plain name is still read by the report.
    os.replace(workdir / eval_report["retrieval"]["files"]["record"], workdir / "retrieval.json")
    code, _, err = helpers.run_cli("report", str(workdir))
    assert code == 0, err
    report = (workdir / "report.md").read_text()
    assert report.count("[train 16;") == 5 and "rope (yarn x4)" in report, report
    assert "run/retrieval.json" in report or "retrieval.json]" in report
    # posenc analyze at two lengths: two sets of files.
    for lengths in ("16", "32"):
        code, _, err = helpers.run_cli(
            "analyze", "--workdir", str(workdir), "--lengths", lengths, "--tokens", "64"
        )
        assert code == 0, err
    analyses = sorted(
        n for n in os.listdir(workdir) if n.startswith("attention") and n.endswith(".json")
    )
    assert len(analyses) == 2, analyses


def test_eval_output_may_not_take_a_retrieval_or_analysis_name(tmp_path):
    """``eval --output`` names a report; a retrieval record's or an analysis's name would
    replace hours of results (those are named by their settings, as below)."""
    from posenc.workdir import WorkdirError

    run = RunDir(tmp_path)
    for name in (
        retrieval_names({}, {"lengths": (4096,)})["json"],
        retrieval_names(YARN, {})["json"],
        analysis_names({}, {"tokens": 64})["json"],
        "retrieval.json",
        "attention.json",
    ):
        with pytest.raises(WorkdirError, match="--output"):
            run.eval_output(name, {})
    assert run.eval_output("eval-mine.json", {}) == "eval-mine.json"
