"""posenc.runs.sweep: point names, resuming an interrupted sweep, failures, child processes."""

import csv
import json
import os
import stat

import jax
import pytest

import posenc.runs.train
from posenc.runs import sweep
from posenc.runs.evaluate import load_eval

BASE = os.path.join(os.path.dirname(__file__), os.pardir, "configs", "base.py")

SWEEP_CONFIG = """
from posenc.runs.config import load_config
from posenc.runs.sweep import product


def get_config(variant="ok"):
    c = load_config({base!r} + ":tiny")
    c.model.update(num_layers=1, model_dim=16, num_heads=2, mlp_dim=32, dtype="float32")
    c.optim.warmup_steps = 1
    c.train.update(seq_len=16, batch_size=4, steps=4, log_every=2, checkpoint_every=2)
    c.train.progress = False
    c.eval.update(lengths=(16, 32), max_tokens=256, batch_tokens=256)
    return c


def get_sweep(variant="ok"):
    points = product(**{{"encoding.name": ["alibi", "nope"], "seed": [0]}})
    if variant == "broken":  # an unknown hyperparameter: fails in validation, inside the run
        points.insert(1, {{"encoding.name": "rope", "seed": 0, "encoding.hparams.bogus": 1}})
    if variant == "seeds":  # one model, two seeds: the same computations (no dropout)
        points = product(**{{"encoding.name": ["alibi"], "seed": [0, 1]}})
    return points
"""


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "sweep_config.py"
    path.write_text(SWEEP_CONFIG.format(base=os.path.abspath(BASE)))
    return str(path)


def test_product_order_and_scalars():
    points = sweep.product(**{"encoding.name": ["alibi", "rope"], "seed": [0, 1], "x": "ab"})
    assert points == [
        {"encoding.name": "alibi", "seed": 0, "x": "ab"},
        {"encoding.name": "alibi", "seed": 1, "x": "ab"},
        {"encoding.name": "rope", "seed": 0, "x": "ab"},
        {"encoding.name": "rope", "seed": 1, "x": "ab"},
    ]
    assert sweep.product() == [{}]


def test_point_names_readable_stable_distinct():
    assert sweep.point_name({"encoding.name": "alibi", "seed": 0}) == "encoding.name-alibi__seed-0"
    # Key order does not matter.
    assert sweep.point_name({"seed": 0, "encoding.name": "alibi"}) == "encoding.name-alibi__seed-0"
    points = [
        {"seed": 0},
        {"seed": "0"},  # a string that reads as the int: must not collide
        {"seed": 1},
        {"optim.learning_rate": 1e-3},
        {"optim.learning_rate": 0.001, "seed": 0},
        {"data.source": "textdir:/data/a b"},
        {"data.source": "textdir:/data/a_b"},  # sanitises to the same characters as above
        {"eval.lengths": (64, 128)},
        {"eval.lengths": (64, 1, 28)},
        {"encoding.hparams.base": "x" * 300},
        {"encoding.hparams.base": "x" * 299 + "y"},  # same truncated prefix
        {"model.tie_embeddings": True},
        {"model.tie_embeddings": "True"},
        {},
    ]
    names = [sweep.point_name(p) for p in points]
    assert len(set(names)) == len(names), names
    for name in names:
        assert len(name) <= 255 and "/" not in name and not name.startswith((".", "-"))
        assert all(c.isalnum() or c in "._+-" for c in name), name
    # Same point, same name, every time (no dependence on hashing salts or dict order).
    assert [sweep.point_name(dict(reversed(list(p.items())))) for p in points] == names


def test_duplicate_points_rejected(tmp_path, sweep_file):
    text = open(sweep_file).read() + "\n\ndef get_sweep(variant='ok'):\n"
    text += (
        "    return [{'seed': 0, 'encoding.name': 'nope'}, {'encoding.name': 'nope', 'seed': 0}]\n"
    )
    path = tmp_path / "dup.py"
    path.write_text(text)
    with pytest.raises(ValueError, match="same point twice"):
        sweep.load_sweep(str(path))
    with pytest.raises(ValueError, match="unknown config field"):
        sweep.load_sweep(sweep_file, ["train.stepz=3"])


def _mtime(path):
    return os.stat(path).st_mtime_ns


def test_interrupted_sweep_resumes_without_redoing_finished_points(
    tmp_path, sweep_file, monkeypatch
):
    workdir = str(tmp_path / "sweep")
    real_train = posenc.runs.train.train
    calls = []

    def interrupting_train(config, point_dir, **kwargs):
        calls.append(os.path.basename(point_dir))
        if config.encoding.name == "nope":  # the second point: Ctrl-C after step 2
            real_train(config, point_dir, stop_at=2)
            raise KeyboardInterrupt
        return real_train(config, point_dir, **kwargs)

    monkeypatch.setattr(posenc.runs.train, "train", interrupting_train)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep_file, workdir, verbose=False)
    alibi = os.path.join(workdir, "encoding.name-alibi__seed-0")
    nope = os.path.join(workdir, "encoding.name-nope__seed-0")
    assert calls == [os.path.basename(alibi), os.path.basename(nope)]
    with open(os.path.join(workdir, "sweep.json")) as f:
        recorded = {p["dir"]: p["status"] for p in json.load(f)["points"]}
    assert recorded == {os.path.basename(alibi): "done", os.path.basename(nope): "interrupted"}
    assert json.load(open(os.path.join(nope, "status.json")))["status"] == "interrupted"
    assert os.path.isdir(os.path.join(nope, "checkpoints", "2"))
    assert load_eval(nope) is None
    finished = {p: _mtime(os.path.join(alibi, p)) for p in ("eval.json", "metrics.jsonl")}

    # Run again: the finished point is skipped, the interrupted one resumes from step 2.
    calls.clear()
    resumed = []

    def counting_train(config, point_dir, **kwargs):
        calls.append(os.path.basename(point_dir))
        result = real_train(config, point_dir, **kwargs)
        resumed.append(result.resumed_from)
        return result

    monkeypatch.setattr(posenc.runs.train, "train", counting_train)
    summary = sweep.run_sweep(sweep_file, workdir, verbose=False)
    assert [(p["dir"], p["status"]) for p in summary] == [
        (os.path.basename(alibi), "skipped"),
        (os.path.basename(nope), "done"),
    ]
    assert calls == [os.path.basename(nope)] and resumed == [2]
    assert {p: _mtime(os.path.join(alibi, p)) for p in finished} == finished
    steps = [json.loads(line)["step"] for line in open(os.path.join(nope, "metrics.jsonl"))]
    assert steps == [2, 4]  # steps 1-2 were not trained twice
    assert [r["length"] for r in load_eval(nope)["results"]] == [16, 32]
    for p in summary:
        assert p["train_loss"] > 0 and p["ppl_train_len"] > 1 and p["ppl_longest"] > 1

    # A third run does nothing; a changed evaluation setting re-evaluates without retraining.
    calls.clear()
    summary = sweep.run_sweep(sweep_file, workdir, verbose=False)
    assert [p["status"] for p in summary] == ["skipped", "skipped"] and calls == []
    summary = sweep.run_sweep(
        sweep_file, workdir, overrides=["eval.lengths=(16, 48)"], verbose=False
    )
    assert [p["status"] for p in summary] == ["done", "done"]
    assert resumed[-2:] == [4, 4]
    assert [json.loads(line)["step"] for line in open(os.path.join(nope, "metrics.jsonl"))] == [
        2,
        4,
    ]
    assert [r["length"] for r in load_eval(alibi)["results"]] == [16, 48]


def test_failed_point_is_recorded_and_the_rest_run_in_child_processes(tmp_path, sweep_file):
    from posenc.report import write_report

    workdir = str(tmp_path / "sweep")
    summary = sweep.run_sweep(f"{sweep_file}:broken", workdir, jobs=2, verbose=False)
    status = {p["name"]: p["status"] for p in summary}
    broken = sweep.point_name({"encoding.name": "rope", "seed": 0, "encoding.hparams.bogus": 1})
    assert status == {
        "encoding.name-alibi__seed-0": "done",
        broken: "failed",
        "encoding.name-nope__seed-0": "done",
    }
    failed = json.load(open(os.path.join(workdir, broken, "status.json")))
    assert "bogus" in failed["error"] and "Traceback" in failed["traceback"]
    assert os.path.getsize(os.path.join(workdir, "encoding.name-nope__seed-0", "log.txt")) > 0
    with open(os.path.join(workdir, "sweep.json")) as f:
        recorded = json.load(f)
    assert [p["status"] for p in recorded["points"]] == ["done", "failed", "done"]
    assert recorded["jobs"] == 2
    # The resolved config is saved in each point (train.py's config.json).
    config = json.load(open(os.path.join(workdir, "encoding.name-nope__seed-0", "config.json")))
    assert config["encoding"]["name"] == "nope" and config["train"]["steps"] == 4

    # Running again retries only the failed point (in this process).
    summary = sweep.run_sweep(f"{sweep_file}:broken", workdir, verbose=False)
    assert [p["status"] for p in summary] == ["skipped", "failed", "skipped"]

    # The report carries exactly the numbers of the eval.json files.
    write_report(workdir)
    with open(os.path.join(workdir, "report.csv")) as f:
        rows = list(csv.DictReader(f))
    for name, column in (
        ("encoding.name-alibi__seed-0", "alibi"),
        ("encoding.name-nope__seed-0", "nope"),
    ):
        results = load_eval(os.path.join(workdir, name))["results"]
        assert [float(r[column]) for r in rows] == [r["perplexity"] for r in results]
    assert broken in open(os.path.join(workdir, "report.md")).read()


def test_killed_child_is_recorded_as_failed(tmp_path, sweep_file, monkeypatch):
    """A child that dies without writing a result (a signal, the OOM killer) fails its point
    only; the others still run."""
    killer = tmp_path / "killer.sh"
    killer.write_text("#!/bin/sh\nkill -9 $$\n")
    killer.chmod(killer.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sweep.sys, "executable", str(killer))
    summary = sweep.run_sweep(sweep_file, str(tmp_path / "sweep"), jobs=2, verbose=False)
    assert [p["status"] for p in summary] == ["failed", "failed"]
    for p in summary:
        assert p["error"] == "process exited with code -9"
        status = json.load(open(tmp_path / "sweep" / p["dir"] / "status.json"))
        assert status["status"] == "failed"


def test_format_summary_lists_every_point():
    entries = [
        {
            "name": "a",
            "status": "done",
            "train_loss": 1.5,
            "ppl_train_len": 4.0,
            "ppl_longest": 9.0,
            "longest": 256,
            "seconds": 3.0,
        },
        {"name": "b", "status": "failed", "error": "ValueError: boom\nmore", "seconds": 1.0},
    ]
    text = sweep.format_summary(entries, 4.0)
    assert "9.00 @256" in text and "error: ValueError: boom" in text and "more" not in text
    assert "1 done, 1 failed; 4s" in text


def test_a_bad_override_is_refused_once_before_any_point_runs(tmp_path, sweep_file, monkeypatch):
    from _train_helpers import run_cli

    ran = []
    monkeypatch.setattr(sweep, "run_point", lambda point_dir: ran.append(point_dir))
    workdir = tmp_path / "sweep"
    # base is RoPE's hyperparameter: every point (alibi, nope) refuses it.
    with pytest.raises(ValueError, match=r"make 2 of 2 points invalid, e\.g\. point encoding"):
        sweep.run_sweep(sweep_file, str(workdir), overrides=["encoding.hparams.base=5"])
    code, out, err = run_cli(
        "sweep", "--config", sweep_file, "--workdir", str(workdir), "--config.model.norm=batch"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "model.norm" in err
    # A field the points set themselves would be replaced by each point's value: refused.
    with pytest.raises(ValueError, match="set encoding.name themselves.*--only encoding.name="):
        sweep.load_sweep(sweep_file, ["encoding.name=rope"])
    assert ran == [] and not workdir.exists()


def test_only_narrows_a_sweep_and_keeps_the_other_points(tmp_path, sweep_file, monkeypatch):
    def fake_run_point(point_dir):
        status = {"status": "done", "seconds": 0.0}
        json.dump(status, open(os.path.join(point_dir, "status.json"), "w"))
        return status

    monkeypatch.setattr(sweep, "run_point", fake_run_point)
    workdir = str(tmp_path / "sweep")
    plan = sweep.plan_sweep(sweep_file, workdir, only=["encoding.name=nope"])
    assert plan.splitlines()[0].startswith("left out  encoding.name-alibi__seed-0")
    assert plan.splitlines()[1].startswith("run       encoding.name-nope__seed-0")
    assert not os.path.exists(workdir)  # planning writes nothing
    summary = sweep.run_sweep(sweep_file, workdir, only=["encoding.name=nope", "seed=0"])
    assert [(p["name"], p["status"]) for p in summary] == [
        ("encoding.name-alibi__seed-0", "unselected"),
        ("encoding.name-nope__seed-0", "done"),
    ]
    recorded = json.load(open(os.path.join(workdir, "sweep.json")))
    assert recorded["only"] == ["encoding.name=nope", "seed=0"] and len(recorded["points"]) == 2
    assert not os.path.exists(os.path.join(workdir, "encoding.name-alibi__seed-0"))
    for only, match in (
        (["encoding.name=rope"], r"no point of the sweep is left; encoding.name takes 'alibi', "),
        (["encoding.nam=nope"], "no point's config has this field; the points set encoding.name"),
        (["encoding.name"], "not of the form field=value"),
    ):
        with pytest.raises(ValueError, match=match):
            sweep.run_sweep(sweep_file, workdir, only=only)


def test_child_processes_get_the_compile_cache_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = sweep._child_env(2, "cache")
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache")
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert "JAX_COMPILATION_CACHE_DIR" not in sweep._child_env(2)


@pytest.mark.slow
def test_compile_cache_serves_another_seed_and_changes_no_result(tmp_path, sweep_file):
    """Seed 1 repeats seed 0's computations but the parameter initialisation (the seed is a
    constant in it): with the cache it compiles nothing else, and its results are those of a
    run without the cache."""
    spec, cache = f"{sweep_file}:seeds", tmp_path / "cache"
    workdir = str(tmp_path / "cached")
    hits = []

    def listener(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    previous = jax.config.jax_compilation_cache_dir
    jax.monitoring.register_event_listener(listener)
    try:
        sweep.run_sweep(spec, workdir, only=["seed=0"], compile_cache=str(cache), verbose=False)
        entries, first_hits = set(os.listdir(cache)), len(hits)
        assert entries and jax.config.jax_compilation_cache_dir == previous  # restored
        sweep.run_sweep(spec, workdir, only=["seed=1"], compile_cache=str(cache), verbose=False)
        new = set(os.listdir(cache)) - entries
        assert len(new) == 1 and new.pop().startswith("jit__init-")
        assert len(hits) - first_hits >= len(entries) - 1  # the training step, evaluation
        sweep.run_sweep(spec, str(tmp_path / "plain"), only=["seed=1"], verbose=False)
    finally:
        jax.monitoring.unregister_event_listener(listener)
    seed1 = "encoding.name-alibi__seed-1"
    with_cache, without = (load_eval(os.path.join(tmp_path, d, seed1)) for d in ("cached", "plain"))
    assert [r["loss"] for r in with_cache["results"]] == [r["loss"] for r in without["results"]]
    assert json.load(open(os.path.join(workdir, "sweep.json")))["compile_cache"] == str(cache)


def test_a_translation_point_is_summarised_without_perplexity(tmp_path):
    """A translation run's eval.json has BLEU per source-length bucket and no perplexity (the
    summary at the end of a translation sweep raised KeyError)."""
    bucket = {"length": 32, "lo": 0, "label": "<=1x", "sentences": 3, "bleu": 50.0}
    report = {"train_seq_len": 32, "results": [bucket], "checkpoint_step": 4}
    (tmp_path / "eval.json").write_text(json.dumps(report))
    summary = sweep.summarize_point(str(tmp_path))
    assert summary["ppl_train_len"] is None and summary["ppl_longest"] is None
    assert summary["longest"] == 32 and summary["checkpoint_step"] == 4


def test_the_summary_gives_translation_points_bleu_not_perplexity_dashes(tmp_path):
    """A translation point's summary row showed ``—`` under ``ppl@train`` and ``ppl@longest``:
    it shows BLEU within the training length and in the longest bucket (from its eval.json's
    buckets), an LM point beside it keeps its perplexities, and a sweep of LM points alone
    keeps the perplexity header."""
    buckets = [
        {"length": 32, "lo": 0, "label": "<=1x", "sentences": 3, "bleu": 31.25},
        {"length": 64, "lo": 32, "label": "1x-2x", "sentences": 2, "bleu": 12.5},
    ]
    report = {"objective": "translation", "train_seq_len": 32, "results": buckets}
    (tmp_path / "eval.json").write_text(json.dumps(report))
    translation = {"name": "t", "status": "done", **sweep.summarize_point(str(tmp_path))}
    lm = {
        "name": "lm",
        "status": "done",
        "train_loss": 1.5,
        "ppl_train_len": 4.0,
        "ppl_longest": 9.0,
        "longest": 256,
        "seconds": 3.0,
    }
    lines = sweep.format_summary([lm, translation]).splitlines()
    row = next(line for line in lines if line.startswith("done        t "))
    assert "—" not in row.split()[3:5], row
    assert "BLEU 31.25" in row and "BLEU 12.50 @1x-2x" in row, row
    row = next(line for line in lines if line.startswith("done        lm"))
    assert "ppl 4.00" in row and "ppl 9.00 @256" in row, row
    assert "ppl@train" not in lines[0], lines[0]
    only_lm = sweep.format_summary([lm]).splitlines()
    assert "ppl@train" in only_lm[0] and "9.00 @256" in only_lm[1], only_lm
