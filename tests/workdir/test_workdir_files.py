"""posenc.workdir.files and run: atomic writes, JSON forms, names, and the records' rules."""

from __future__ import annotations

import json
import math
import os

import ml_collections
import pytest

from posenc import workdir
from posenc.workdir import RunDir, WorkdirError


def test_atomic_write_leaves_no_partial_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "a" / "f.json"
    workdir.write_json(path, {"x": 1})
    real_replace = os.replace

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        workdir.write_json(path, {"x": 2})
    monkeypatch.setattr(os, "replace", real_replace)
    assert workdir.read_json(path) == {"x": 1}, "the old file is intact"
    assert os.listdir(path.parent) == ["f.json"], "no temporary file left behind"


def test_json_holds_infinity_and_tuples(tmp_path):
    path = tmp_path / "r.json"
    workdir.write_json(path, {"ppl": math.inf, "loss": math.nan, "lengths": (1, 2)})
    back = workdir.read_json(path)
    assert back["ppl"] == math.inf and math.isnan(back["loss"]) and back["lengths"] == [1, 2]
    assert workdir.read_json(tmp_path / "missing.json", default={}) == {}
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(WorkdirError, match="bad.json is not valid JSON"):
        workdir.read_json(tmp_path / "bad.json")


def test_jsonl_skips_and_rewrites_torn_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    with open(path, "w") as f:
        for step in (1, 2, 3):
            workdir.append_jsonl(f, {"step": step})
        f.write('{"step": 4, "lo')  # a process killed mid-line
    assert [line["step"] for line in workdir.read_jsonl(path)] == [1, 2, 3]
    workdir.rewrite_jsonl(path, lambda line: line["step"] <= 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_config_round_trips_with_its_tuples():
    config = ml_collections.ConfigDict(
        workdir.upgrade(
            {"eval": {"lengths": (16, 32), "multiples": ()}, "encoding": {"hparams": {"a": (1,)}}}
        )
    )
    back = workdir.config_from_dict(json.loads(config.to_json()))
    assert back.eval.lengths == (16, 32) and back.eval.multiples == ()
    assert back.encoding.hparams.a == (1,)
    assert workdir.config_sha256(back) == workdir.config_sha256(config)
    with pytest.raises(AttributeError):  # locked: a typo cannot add a field
        back.eval.lenghts = (1,)


def test_configs_recorded_before_a_field_existed_read_as_its_old_behaviour(tmp_path):
    old = {"train": {"seq_len": 16}, "eval": {"lengths": [16]}}
    back = workdir.config_from_dict(old)
    assert (back.train.positions, back.train.max_position) == ("contiguous", 2048)
    assert back.eval.positions == "as_trained" and back.train.seq_len == 16
    assert old == {"train": {"seq_len": 16}, "eval": {"lengths": [16]}}, "input not changed"
    run = RunDir(tmp_path / "run")
    run.create()
    workdir.write_json(run.file("config.json"), old)
    run.record_config(back)  # the same run, written by a newer posenc: resumes
    randomized = ml_collections.ConfigDict(back.to_dict())
    randomized.train.positions = "randomized"
    with pytest.raises(WorkdirError, match=r"fields \['train.positions'\]"):
        run.record_config(randomized)


def test_settings_names_are_readable_stable_and_distinct():
    name = workdir.settings_name
    assert name({"seed": 0, "encoding.name": "alibi"}) == "encoding.name-alibi__seed-0"
    assert name({"encoding.name": "alibi", "seed": 0}) == name(
        {"seed": 0, "encoding.name": "alibi"}
    )
    assert name({}) == "base"
    distinct = [{"seed": 0}, {"seed": "0"}, {"seed": 0.0}, {"x": "a/b"}, {"x": "a_b"}]
    assert len({name(s) for s in distinct}) == len(distinct)
    long = {"encoding.hparams.base": "9" * 300}
    assert len(name(long)) < 160 and name(long) != name({"encoding.hparams.base": "9" * 299})


def test_eval_file_names():
    assert workdir.eval_file_name({}) == "eval.json"
    a = workdir.eval_file_name({"eval.lengths": (64, 256)})
    b = workdir.eval_file_name({"eval.lengths": (64, 255)})
    assert a.startswith("eval-lengths-64_256") and a.endswith(".json") and a != b
    assert workdir.eval_file_name({"model.attention_impl": "blocked"}) == (
        "eval-model.attention_impl-blocked.json"
    )


def test_eval_file_names_are_short_and_distinct():
    yarn = {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 8,
        "encoding.hparams.original_max_len": 128,
        "eval.lengths": (128, 256, 512, 1024),
    }
    name = workdir.eval_file_name(yarn)
    assert name.startswith("eval-scaling-yarn__factor-8__") and len(name) <= 90
    assert name == workdir.eval_file_name(dict(reversed(yarn.items())))  # deterministic
    assert name != workdir.eval_file_name({**yarn, "encoding.hparams.factor": 4})
    # An encoder hyperparameter named like an eval field never shares its file.
    assert workdir.eval_file_name({"eval.mode": "sliding"}) == "eval-mode-sliding.json"
    assert workdir.eval_file_name({"encoding.hparams.mode": "sliding"}) != "eval-mode-sliding.json"
    both = workdir.eval_file_name({"eval.mode": "a", "encoding.hparams.mode": "a"})
    assert both.startswith("eval-encoding.hparams.mode-a__eval.mode-a")


def test_data_changes_name_the_split_and_the_hash():
    before = {"content_sha256": "a" * 64, "splits": {"train": {"tokens": 10, "stream_sha256": "b"}}}
    same = json.loads(json.dumps(before))
    assert workdir.data_changes(before, same) == []
    after = {"content_sha256": "c" * 64, "splits": {"train": {"tokens": 11, "stream_sha256": "d"}}}
    changes = workdir.data_changes(before, after)
    assert changes == [
        f"content sha256 {'a' * 12} -> {'c' * 12}",
        "train tokens 10 -> 11",
        "train stream sha256 b -> d",
    ]


def test_a_work_directory_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "run"
    path.write_text("")
    with pytest.raises(WorkdirError, match=r"work directory .*run is a file, not a directory"):
        RunDir(path)


def test_record_config_refuses_other_runs_and_allows_resumable_fields(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    config = workdir.config_from_dict(
        {"model": {"model_dim": 32}, "train": {"log_every": 1}, "eval": {"lengths": (16,)}}
    )
    run.record_config(config)
    relaxed = ml_collections.ConfigDict(config.to_dict())
    relaxed.train.log_every = 5
    relaxed.eval.lengths = (16, 64)
    run.record_config(relaxed)
    assert run.read_config().eval.lengths == (16, 64), "the new evaluation settings are kept"
    other = ml_collections.ConfigDict(config.to_dict())
    other.model.model_dim = 64
    with pytest.raises(WorkdirError, match=r"different config \(fields \['model.model_dim'\]\)"):
        run.record_config(other)


def test_checkpoints_without_records_are_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    os.makedirs(run.file("checkpoints/4"))
    config = ml_collections.ConfigDict({"model": {"model_dim": 32}})
    with pytest.raises(WorkdirError, match="has checkpoints but no config.json"):
        run.record_config(config)
    with pytest.raises(WorkdirError, match="has checkpoints but no data.json"):
        run.record_data({"splits": {}})


def test_record_data_refuses_changed_data(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    info = {"spec": "textdir:x", "splits": {"train": {"tokens": 5, "stream_sha256": "aa"}}}
    run.record_data(info)
    run.record_data({**info, "root": "/elsewhere"})  # where the cache lives does not matter
    changed = {"spec": "textdir:x", "splits": {"train": {"tokens": 6, "stream_sha256": "bb"}}}
    with pytest.raises(WorkdirError, match=r"data of .* changed since the run started"):
        run.record_data(changed)
