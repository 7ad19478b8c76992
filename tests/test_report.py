"""posenc.report on synthetic eval.json files: numbers, layout, error entries, plots."""

import csv
import json
import math
import os
import random
import warnings

import pytest

from posenc import report
from posenc.runs.sweep import point_name

MODEL = {
    "num_layers": 1,
    "model_dim": 16,
    "num_heads": 2,
    "mlp_dim": 32,
    "head_dim": None,
    "norm": "layernorm",
    "dtype": "float32",
    "vocab_size": 257,
    "dropout": 0.0,
    "tie_embeddings": True,
    "attention_impl": "auto",
    "attention_block_size": 512,
}
DATA = {
    "source": "pystdlib",
    "split": "validation",
    "content_sha256": "ab" * 32,
    "splits": {"validation": {"tokens": 5000, "stream_sha256": "cd" * 32}},
}


def _eval_json(encoding, hparams, train_len, seed, lengths, rng, max_len=None):
    results = []
    for length in lengths:
        if max_len is not None and length > max_len:
            results.append({"length": length, "error": f"table of {max_len} < {length} tokens"})
            continue
        loss = rng.uniform(1.0, 3.0)
        results.append(
            {
                "length": length,
                "tokens": 4 * length,
                "loss": loss,
                "perplexity": math.exp(loss),
                "bits_per_byte": loss / math.log(2),
                "windows": 4,
                "dropped_tokens": 0,
                "seconds": 0.1,
                "loss_by_position": [round(rng.uniform(1, 4), 5) for _ in range(length)],
            }
        )
    return {
        "encoding": encoding,
        "encoding_hparams": hparams,
        "train_seq_len": train_len,
        "train_steps": 10,
        "seed": seed,
        "model": {**MODEL, "num_params": 1000 + len(encoding)},
        "data": DATA,
        "mode": "nonoverlapping",
        "stride": None,
        "device": "1 x cpu",
        "results": results,
    }


def _config_json(encoding, hparams, train_len, seed):
    return {
        "seed": seed,
        "model": MODEL,
        "encoding": {"name": encoding, "hparams": hparams},
        "data": {"source": "pystdlib", "data_dir": None, "text_field": None},
        "train": {"seq_len": train_len, "batch_size": 4, "steps": 10, "progress": False},
        "eval": {"lengths": [], "multiples": [1, 2, 4], "max_tokens": 0},
    }


def make_sweep(root, spec):
    """Writes a sweep directory; spec: [(overrides, encoding, hparams, train_len, seed)]."""
    rng = random.Random(0)
    points = []
    for overrides, encoding, hparams, train_len, seed in spec:
        name = point_name(overrides)
        os.makedirs(root / name)
        lengths = [train_len * m for m in (1, 2, 4)]
        max_len = hparams.get("max_len")
        with open(root / name / "eval.json", "w") as f:
            json.dump(_eval_json(encoding, hparams, train_len, seed, lengths, rng, max_len), f)
        with open(root / name / "config.json", "w") as f:
            json.dump(_config_json(encoding, hparams, train_len, seed), f)
        points.append({"name": name, "dir": name, "overrides": overrides, "status": "done"})
    points.append(
        {
            "name": "broken",
            "dir": "broken",
            "overrides": {},
            "status": "failed",
            "error": "ValueError: boom",
        }
    )
    with open(root / "sweep.json", "w") as f:
        json.dump({"config": "x.py", "points": points}, f)


def _spec():
    spec = []
    for train_len in (8, 16):
        for seed in (0, 1, 2):
            for enc, hparams in (("alibi", {}), ("rope", {})):
                spec.append(
                    (
                        {"encoding.name": enc, "seed": seed, "train.seq_len": train_len},
                        enc,
                        hparams,
                        train_len,
                        seed,
                    )
                )
        spec.append(
            (
                {
                    "encoding.name": "learned",
                    "encoding.hparams.max_len": train_len,
                    "seed": 0,
                    "train.seq_len": train_len,
                },
                "learned",
                {"max_len": train_len},
                train_len,
                0,
            )
        )
    return spec


@pytest.fixture
def sweep_dir(tmp_path):
    root = tmp_path / "sweep"
    make_sweep(root, _spec())
    return root


def _load(path):
    with open(path) as f:
        return json.load(f)


def _values(root, encoding, train_len, length, metric):
    """The per-seed values of one table entry, straight from the eval.json files."""
    out = []
    for name in sorted(os.listdir(root)):
        path = root / name / "eval.json"
        if not path.exists():
            continue
        data = _load(path)
        if data["encoding"] == encoding and data["train_seq_len"] == train_len:
            (r,) = [r for r in data["results"] if r["length"] == length]
            out.append((data["seed"], r.get(metric)))
    return [v for _, v in sorted(out)]


@pytest.mark.parametrize("metric", ["perplexity", "bits_per_byte"])
def test_csv_equals_eval_json(sweep_dir, metric):
    paths = report.write_report(str(sweep_dir), metric=metric)
    assert paths[0].endswith("report.md") and paths[1].endswith("report.csv")
    with open(sweep_dir / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(int(r["train_seq_len"]), int(r["L_valid"])) for r in rows] == [
        (8, 8),
        (8, 16),
        (8, 32),
        (16, 16),
        (16, 32),
        (16, 64),
    ]
    for row in rows:
        train_len, length = int(row["train_seq_len"]), int(row["L_valid"])
        for enc in ("alibi", "rope"):
            values = _values(sweep_dir, enc, train_len, length, metric)
            assert len(values) == 3
            mean = sum(values) / 3
            assert float(row[enc]) == pytest.approx(mean, rel=1e-15, abs=0)
            var = sum((v - mean) ** 2 for v in values) / 2  # sample variance over seeds
            assert float(row[f"{enc} spread"]) == pytest.approx(math.sqrt(var), rel=1e-12)
            assert row[f"{enc} n"] == "3"
        (learned,) = _values(sweep_dir, "learned", train_len, length, metric)
        if length == train_len:
            assert float(row["learned"]) == learned  # one seed: the value itself, exactly
        else:
            assert learned is None and row["learned"] == ""


def test_runs_csv_is_exact(sweep_dir):
    report.write_report(str(sweep_dir))
    with open(sweep_dir / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * (6 * 3 + 3)
    for row in rows:
        data = _load(sweep_dir / row["dir"] / "eval.json")
        (r,) = [r for r in data["results"] if r["length"] == int(row["length"])]
        if "error" in r:
            assert row["error"] == r["error"] and row["perplexity"] == ""
        else:
            for key in ("loss", "perplexity", "bits_per_byte"):
                assert float(row[key]) == r[key]


def test_markdown_layout_dashes_and_description(sweep_dir):
    report.write_report(str(sweep_dir))
    text = (sweep_dir / "report.md").read_text()
    assert "## Trained at L = 8" in text and "## Trained at L = 16" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "L_valid"
    assert [c.strip() for c in table[0].split("|")[2:-1]] == ["alibi", "rope", "learned"]
    assert [c.strip() for c in table[2].split("|")[1:-1]] == ["n", "3", "3", "1"]
    rows = {int(line.split("|")[1]): line for line in table[3:6]}
    alibi = _values(sweep_dir, "alibi", 8, 16, "perplexity")
    mean = sum(alibi) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in alibi) / 2)
    assert f"{mean:.2f} ± {sd:.2f}" in rows[16]
    assert rows[16].split("|")[4].strip() == "—¹" and rows[32].split("|")[4].strip() == "—¹"
    assert "—" not in rows[8]
    assert "—¹ learned (trained at L = 8) cannot be evaluated at L_valid = 16, 32" in text
    assert "—² learned (trained at L = 16) cannot be evaluated at L_valid = 32, 64" in text
    assert "table of 8 < 16 tokens" in text
    # What was measured.
    assert "`pystdlib`" in text and "abababababababab" in text and "cdcdcdcdcdcdcdcd" in text
    assert "1 layer, width 16, 2 heads" in text and "alibi 1,005" in text
    assert "10 steps of 4 windows" in text and "1 x cpu" in text
    assert "mean ± sample standard deviation" in text and "where n = 1 (no spread" in text
    assert "*Error bars: ± one sample standard deviation over the runs (seeds)" in text
    assert "`broken`: failed (ValueError: boom)" in text


def test_plots_are_pngs(sweep_dir):
    paths = report.write_report(str(sweep_dir), metric="loss")
    pngs = [p for p in paths if p.endswith(".png")]
    assert sorted(os.path.basename(p) for p in pngs) == [
        "loss_by_position_L16.png",
        "loss_by_position_L8.png",
        "loss_vs_length_L16.png",
        "loss_vs_length_L8.png",
    ]
    for p in pngs:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_columns_of_one_encoder_are_told_apart(tmp_path):
    spec = [
        (
            {"encoding.name": "rope", "encoding.hparams.base": b, "seed": 0},
            "rope",
            {"base": b},
            8,
            0,
        )
        for b in (10000.0, 500000.0)
    ]
    spec.append(({"encoding.name": "alibi", "seed": 0}, "alibi", {}, 8, 0))
    make_sweep(tmp_path, spec)
    tables = report.group_runs(report.find_runs(str(tmp_path)))
    assert [c.label for c in tables[8]] == ["rope (base=10000.0)", "rope (base=500000.0)", "alibi"]


def test_bucket_averages_positions():
    curve = [float(i) for i in range(1, 101)]
    x, y = report.bucket(__import__("numpy").asarray(curve), num_buckets=10)
    assert list(x[:4]) == [1, 2, 3, 4] and list(y[:4]) == [1, 2, 3, 4]
    assert all(a < b for a, b in zip(x, x[1:], strict=False))
    assert y[-1] > 80


def test_single_workdir_and_errors(tmp_path):
    rng = random.Random(1)
    with open(tmp_path / "eval.json", "w") as f:
        json.dump(_eval_json("nope", {}, 8, 0, [8, 16], rng), f)
    paths = report.write_report(str(tmp_path))
    assert os.path.exists(paths[0])
    with pytest.raises(ValueError, match="metric"):
        report.write_report(str(tmp_path), metric="accuracy")
    with pytest.raises(FileNotFoundError):
        report.write_report(str(tmp_path / "missing"))


def test_masked_lm_runs_report_accuracy_beside_causal_runs(tmp_path):
    # Two RoPE runs, one causal LM, one masked LM (whose results have an accuracy and no bits
    # per byte): told apart by their objective; accuracy only in the masked LM's column.
    make_sweep(tmp_path, [({"encoding.name": "rope", "seed": 0}, "rope", {}, 8, 0)])
    os.makedirs(tmp_path / "mlm")
    rng = random.Random(2)
    data = _eval_json("rope", {}, 8, 0, [8, 16, 32], rng)
    data["objective"] = "masked_lm"
    for r in data["results"]:
        r.pop("bits_per_byte")
        r.update(accuracy=rng.uniform(0.1, 0.6), window_tokens=r["tokens"])
    with open(tmp_path / "mlm" / "eval.json", "w") as f:
        json.dump(data, f)
    config = _config_json("rope", {}, 8, 0)
    config["train"]["objective"] = "masked_lm"
    config["model"] = {**MODEL, "causal": False, "vocab_size": 258}
    with open(tmp_path / "mlm" / "config.json", "w") as f:
        json.dump(config, f)
    sweep = _load(tmp_path / "sweep.json")
    sweep["points"].append({"name": "mlm", "dir": "mlm", "overrides": {}, "status": "done"})
    with open(tmp_path / "sweep.json", "w") as f:
        json.dump(sweep, f)

    paths = report.write_report(str(tmp_path), metric="accuracy")
    causal = "rope (model.causal=True, model.vocab_size=257, objective=causal_lm)"
    masked = "rope (model.causal=False, model.vocab_size=258, objective=masked_lm)"
    with open(paths[1]) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["L_valid"]) for r in rows] == [8, 16, 32]
    for row, r in zip(rows, data["results"], strict=True):
        assert float(row[masked]) == r["accuracy"] and row[causal] == ""
    text = (tmp_path / "report.md").read_text()
    assert "masked-LM accuracy" in text
    assert "- Objective: masked LM (where the column says so) (BERT's" in text
    report.write_report(str(tmp_path), metric="bits_per_byte")  # the masked LM's cells empty
    with open(paths[1]) as f:
        assert all(row[masked] == "" and row[causal] for row in csv.DictReader(f))
    with open(paths[2]) as f:  # runs.csv: every run and length, accuracy where there is one
        runs = [r for r in csv.DictReader(f) if r["dir"] == "mlm"]
    assert [float(r["accuracy"]) for r in runs] == [r["accuracy"] for r in data["results"]]


@pytest.mark.parametrize(
    "objective, metric, have",
    [
        ("masked_lm", "exact_match", "accuracy, loss, perplexity"),
        ("masked_lm", "sequence_accuracy", "accuracy, loss, perplexity"),
        ("masked_lm", "bits_per_byte", "accuracy, loss, perplexity"),
        ("causal_lm", "exact_match", "bits_per_byte, loss, perplexity"),
    ],
)
def test_a_metric_no_run_has_is_refused_not_an_empty_table(tmp_path, objective, metric, have):
    rng = random.Random(3)
    data = _eval_json("rope", {}, 8, 0, [8, 16], rng)
    data["objective"] = objective
    if objective == "masked_lm":
        for r in data["results"]:
            r.pop("bits_per_byte")
            r["accuracy"] = rng.uniform(0.1, 0.6)
    with open(tmp_path / "eval.json", "w") as f:
        json.dump(data, f)
    with pytest.raises(ValueError, match=f"--metric {metric}: no run under .* has it") as e:
        report.write_report(str(tmp_path), metric=metric)
    assert f"these runs have {have}" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "report.md").exists()


YARN = {
    "encoding.hparams.scaling": "yarn",
    "encoding.hparams.factor": 8,
    "encoding.hparams.original_max_len": 8,
}


def _write_eval(run_dir, changes, data, step=10, time=0.0):
    """An evaluation report of ``run_dir`` under ``changes``, named as posenc eval names it."""
    from posenc.workdir import eval_file_name

    name = eval_file_name(changes)
    data = {**data, "changes": changes, "checkpoint_step": step, "finished": True, "time": time}
    with open(run_dir / name, "w") as f:
        json.dump(data, f)
    return name


def test_every_evaluation_is_a_column_and_seeds_aggregate_per_variant(tmp_path):
    # Two seeds of rope and alibi; each rope run also evaluated with YaRN (and seed 0 at a
    # longer length, under no other change); seed 1 has a YaRN report of an older step too.
    spec = [
        ({"encoding.name": enc, "seed": seed}, enc, {}, 8, seed)
        for enc in ("rope", "alibi")
        for seed in (0, 1)
    ]
    make_sweep(tmp_path, spec)
    rng = random.Random(5)
    expected = {}  # (column, seed, length) -> perplexity, straight from what was written
    for overrides, enc, _, _, seed in spec:
        run_dir = tmp_path / point_name(overrides)
        own = {**_load(run_dir / "eval.json"), "checkpoint_step": 10, "changes": {}}
        with open(run_dir / "eval.json", "w") as f:
            json.dump(own, f)
        for r in own["results"]:
            expected[(enc, seed, r["length"])] = r["perplexity"]
        if enc != "rope":
            continue
        yarn = _eval_json("rope", {}, 8, seed, [8, 16, 32], rng)
        _write_eval(run_dir, {**YARN, "eval.lengths": (8, 16, 32)}, yarn, time=2.0)
        for r in yarn["results"]:
            expected[("rope (yarn x8)", seed, r["length"])] = r["perplexity"]
        if seed == 0:
            longer = _eval_json("rope", {}, 8, seed, [64], rng)
            _write_eval(run_dir, {"eval.lengths": (64,)}, longer, time=3.0)
            expected[("rope", 0, 64)] = longer["results"][0]["perplexity"]
        else:
            old = _eval_json("rope", {}, 8, seed, [8, 16, 32, 64], rng)
            with open(run_dir / "eval-old.json", "w") as f:
                json.dump({**old, "changes": YARN, "checkpoint_step": 5, "time": 1.0}, f)

    paths = report.write_report(str(tmp_path))
    tables = report.group_runs(report.find_runs(str(tmp_path)))
    labels = [c.label for c in tables[8]]
    assert labels == ["rope", "rope (yarn x8)", "alibi"]
    with open(paths[1]) as f:
        rows = {int(r["L_valid"]): r for r in csv.DictReader(f)}
    assert sorted(rows) == [8, 16, 32, 64]
    for label in labels:
        for length, row in rows.items():
            values = [expected[k] for s in (0, 1) if (k := (label, s, length)) in expected]
            if not values:
                assert row[label] == ""
                continue
            assert float(row[label]) == pytest.approx(sum(values) / len(values), rel=1e-15)
            assert row[f"{label} n"] == str(len(values))
    assert rows[64]["rope n"] == "1"  # only seed 0 was scored at 64; the old report is left out
    text = (tmp_path / "report.md").read_text()
    assert "eval-old.json` scored an older checkpoint than step 10" in text
    with open(paths[2]) as f:
        sources = {(r["dir"], r["length"]): r["file"] for r in csv.DictReader(f) if r["changes"]}
    seed1 = point_name({"encoding.name": "rope", "seed": 1})
    assert sources[(seed1, "8")].startswith("eval-scaling-yarn__factor-8__")
    assert "old" not in str(sources)


def test_columns_name_what_an_evaluation_changed():
    name = report.runs.describe_changes
    yarn = {f"encoding.hparams.{k}": v for k, v in (("scaling", "yarn"), ("factor", 8.0))}
    assert name("rope", {**yarn, "encoding.hparams.original_max_len": 128}, 128) == "yarn x8"
    assert name("xpos", {**yarn, "encoding.hparams.original_max_len": 64}, 128) == (
        "yarn x8, original_max_len=64"
    )
    assert name("xl", {"encoding.hparams.clamp_len": 64, "eval.split": "test"}, 16) == (
        "clamp_len=64, split=test"
    )
    assert name("my_plugin", {"encoding.hparams.k": 2}, 16) == "k=2"  # not registered here


def _write_metrics(run_dir, losses):
    """metrics.jsonl with a line per step whose loss is not None."""
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step, loss in enumerate(losses, start=1):
            if loss is not None:
                f.write(json.dumps({"step": step, "loss": loss}) + "\n")


def test_weak_evidence_is_flagged(tmp_path):
    spec = [
        ({"encoding.name": enc, "seed": seed}, enc, {}, 8, seed)
        for enc in ("rope", "alibi")
        for seed in (0, 1)
    ]
    make_sweep(tmp_path, spec)
    dirs = {(o["encoding.name"], o["seed"]): tmp_path / point_name(o) for o, *_ in spec}
    # rope seed 1 still falls: the last 10 steps average 3 - 0.01 * 95.5, the 10 before
    # 3 - 0.01 * 85.5, a fall of 0.1 / 2.145 = 4.7 %. The others fall 0.5 %: not flagged.
    _write_metrics(dirs[("rope", 1)], [3 - 0.01 * s for s in range(1, 101)])
    for key in (("rope", 0), ("alibi", 0), ("alibi", 1)):
        _write_metrics(dirs[key], [2.0] * 80 + [2.01] * 10 + [2.0] * 10)
    # alibi seed 1 was not scored at the longest length; every run scored 2 windows there.
    for (enc, seed), run_dir in dirs.items():
        data = _load(run_dir / "eval.json")
        if (enc, seed) == ("alibi", 1):
            data["results"] = data["results"][:2]
        else:
            data["results"][2]["tokens"] = 2 * 32
        data["results"][0]["unscored_by_max_tokens"] = 12345
        with open(run_dir / "eval.json", "w") as f:
            json.dump(data, f)

    report.write_report(str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert [c.strip() for c in table[2].split("|")[1:-1]] == ["n", "2‡", "2"]
    longest = [c.strip() for c in table[5].split("|")[1:-1]]
    assert longest[0] == "32" and longest[2].endswith(" (n=1)") and "(n=" not in longest[1]
    assert (
        "‡ 1 run still learning at the last step (mean training loss over "
        "the last 10% of the steps (at least one logging interval) more than 1% below its mean "
        "over as many steps before): "
        f"`{dirs[('rope', 1)].name}` (-4.7 %)"
    ) in text
    # Logged every 25 steps of 100: the windows widen to one interval (steps 100 vs 75).
    assert report.evidence.loss_drop(str(dirs[("alibi", 0)])) == pytest.approx(0.01 / 2.01)
    _write_metrics(
        dirs[("alibi", 0)], [3 - 0.01 * s if s % 25 == 0 else None for s in range(1, 101)]
    )
    assert report.evidence.loss_drop(str(dirs[("alibi", 0)])) == pytest.approx(0.25 / 2.25)
    assert "Few windows: the fewest windows' worth of tokens scored by a run were 2 at " in text
    assert "L_valid = 32 (fewer than 4)" in text
    assert "up to 12,345 tokens of the split are left unscored" in text


def test_an_imported_model_is_reported_as_imported_with_its_tokenizer(tmp_path):
    """The report of an imported BPE model said "tokens are bytes" and "Training: L = 32, 1
    steps of 64 windows" (the import's one checkpoint step and the base config's batch) for a
    checkpoint posenc never trained: it says imported, from where (``pretrained.json``), and
    the tokenizer's kind (its ``tokenizer.json``); a posenc-trained run beside it keeps its
    training line, and the table's heading no longer says bytes."""
    from pathlib import Path

    rng = random.Random(0)
    golden = Path(__file__).resolve().parent / "hf" / "golden" / "llama"
    imported = tmp_path / "llama"
    (imported / "tokenizer").mkdir(parents=True)
    (imported / "tokenizer" / "tokenizer.json").write_text((golden / "tokenizer.json").read_text())
    report_ = _eval_json("rope", {"base": 10000.0}, 32, 0, [32, 64], rng)
    report_["train_steps"] = 1
    report_["data"] = {**DATA, "tokenizer": f"hf:{imported / 'tokenizer'}", "vocab_size": 84}
    (imported / "eval.json").write_text(json.dumps(report_))
    config = _config_json("rope", {"base": 10000.0}, 32, 0)
    config["train"].update(batch_size=64, steps=1)
    config["data"]["tokenizer"] = f"hf:{imported / 'tokenizer'}"
    (imported / "config.json").write_text(json.dumps(config))
    record = {"family": "llama", "source": "/models/TinyLlama", "hf_config": {}}
    (imported / "pretrained.json").write_text(json.dumps(record))

    report.write_report(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "tokens are bytes" not in md and "1 steps" not in md and "64 windows" not in md, md
    assert "imported" in md and "/models/TinyLlama" in md and "llama" in md, md
    assert "BPE" in md, md

    trained = tmp_path / "trained"  # a posenc-trained byte-level run beside it
    trained.mkdir()
    (trained / "eval.json").write_text(json.dumps(_eval_json("alibi", {}, 32, 0, [32, 64], rng)))
    (trained / "config.json").write_text(json.dumps(_config_json("alibi", {}, 32, 0)))
    report.write_report(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "10 steps of 4 windows" in md and "/models/TinyLlama" in md, md
    assert "bytes" in md and "BPE" in md, md


def _retrieval_record(encoding, changes, scores, tasks):
    """A retrieval record (the fields the report reads) with ``scores`` by length."""
    lengths, depths = [128, 256, 512, 1024, 2048, 4096], [0.0, 0.5, 1.0]
    by_length = [{"length": n, "score": s} for n, s in zip(lengths, scores, strict=True)]
    cells = [
        {"length": n, "depth": d, "score": s}
        for n, s in zip(lengths, scores, strict=True)
        for d in depths
    ]
    task = {"metric": "first_integer", "cells": cells, "by_length": by_length}
    return {
        "encoding": encoding,
        "changes": changes,
        "train_seq_len": 128,
        "lengths": lengths,
        "depths": depths,
        "trials": 10,
        "seed": 0,
        "threshold": 85.0,
        "tasks": {name: {**task, "effective_length": 256} for name in tasks},
        "effective_length": 256,
        "by_length": by_length,
    }


def test_every_plot_the_report_writes_keeps_its_texts_inside_and_no_offset(tmp_path, monkeypatch):
    """Plots were clipped: ``retrieval_vs_length.png``'s legend ran off the left edge, the heat
    maps' titles were cut, and the perplexity axis read ``+1.01e3`` (offset notation). Every
    figure the report draws (caught as it is closed) is drawn again here: each title, axis
    label, tick label and legend lies inside the figure, and no axis has an offset text.
    The labels are as long as a YaRN evaluation's, the perplexities all near 1010."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = random.Random(0)
    for encoding in ("rope", "alibi"):
        run = tmp_path / encoding
        run.mkdir()
        report_ = _eval_json(encoding, {}, 128, 0, [128, 256, 512], rng)
        for r in report_["results"]:
            r["perplexity"] = 1010 + rng.uniform(0, 0.9)
        (run / "eval.json").write_text(json.dumps(report_))
        (run / "config.json").write_text(json.dumps(_config_json(encoding, {}, 128, 0)))
    yarn = {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 4,
        "encoding.hparams.original_max_len": 128,
        "encoding.hparams.beta_fast": 32,
    }
    records = {
        "rope/retrieval.json": _retrieval_record("rope", {}, [100, 95, 40, 10, 0, 0], ["passkey"]),
        "rope/retrieval-scaling-yarn-factor-4-original-max-len-128.json": _retrieval_record(
            "rope", yarn, [100, 100, 98, 90, 60, 20], ["passkey"]
        ),
        "alibi/retrieval.json": _retrieval_record(
            "alibi", {}, [100, 60, 30, 20, 10, 5], ["passkey", "niah_single_2"]
        ),
    }
    for name, record in records.items():
        (tmp_path / name).write_text(json.dumps(record))

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    paths = report.write_report(str(tmp_path))
    monkeypatch.setattr(plt, "close", close)
    written = sorted(os.path.basename(p) for p in paths if p.endswith(".png"))
    assert "retrieval_vs_length.png" in written and "perplexity_vs_length_L128.png" in written
    assert len(figures) == len(written) == 6, written
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        texts = [fig._suptitle] if fig._suptitle is not None else []
        texts += list(fig.legends)
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            texts += [ax.title, ax.xaxis.label, ax.yaxis.label, ax.get_legend()]
            for axis in (ax.xaxis, ax.yaxis):  # the ticks drawn: those within the view
                lo, hi = sorted(axis.get_view_interval())
                ticks = [t for t in axis.get_major_ticks() if lo <= t.get_loc() <= hi]
                texts += [t.label1 for t in ticks] + [t.label2 for t in ticks]
                assert axis.get_offset_text().get_text() == "", (fig, axis.get_offset_text())
        for text in texts:
            if text is None or not text.get_visible():
                continue
            if hasattr(text, "get_text") and not text.get_text():
                continue
            extent = text.get_window_extent(renderer)
            inside = (
                extent.x0 >= box.x0 - 1
                and extent.y0 >= box.y0 - 1
                and extent.x1 <= box.x1 + 1
                and extent.y1 <= box.y1 + 1
            )
            what = text.get_text() if hasattr(text, "get_text") else "legend"
            assert inside, (fig.get_suptitle() or fig.axes[0].get_title(), what, extent, box)
        close(fig)


def _translation_eval(seed=0):
    """A translation run's eval.json (the fields of one written by ``posenc train`` on
    ``configs/translation.py:tiny``, four buckets)."""
    buckets = []
    for i, (label, hi) in enumerate([("<=1x", 48), ("1x-2x", 96), ("2x-4x", 192)]):
        bleu = 30.0 - 10 * i + seed
        buckets.append(
            {"lo": hi // 2 if i else 0, "hi": hi, "label": label, "max_multiple": 2**i}
            | {"src_tokens": 100, "sentences": 3, "bleu": bleu, "bleu_intl": bleu}
            | {"chrf": 50.0, "length_ratio": 1.0, "brevity_penalty": 1.0, "length": hi}
        )
    return {
        "encoding": "sinusoidal",
        "encoding_hparams": {},
        "objective": "translation",
        "train_seq_len": 48,
        "max_src_len": 48,
        "train_steps": 4,
        "checkpoint_step": 4,
        "finished": True,
        "seed": seed,
        "mode": "nonoverlapping",
        "stride": None,
        "device": "1 x cpu",
        "changes": {},
        "model": {**MODEL, "num_params": 29408, "num_encoder_layers": 1},
        "data": {
            "source": "parallel:default",
            "split": "validation",
            "src_lang": "en",
            "tgt_lang": "de",
            "content_sha256": "fb" * 32,
            "splits": {"validation": {"pairs": 1000}},
        },
        "vocab": {"kind": "bytes", "vocab_size": 259},
        "split": "validation",
        "sentences": 9,
        "train_max_src_len": 48,
        "decoding": {"beam_size": 2, "alpha": 0.6, "max_len_offset": 8},
        "teacher_forced": {"tokens": 988, "loss": 5.7, "perplexity": 299.0, "accuracy": 0.1},
        "overall": {"sentences": 9, "bleu": 20.0, "bleu_intl": 20.0, "chrf": 50.0}
        | {"length_ratio": 1.0, "signatures": {"bleu": "tok:13a", "bleu_intl": "tok:intl"}},
        "results": buckets,
    }


def test_a_folder_of_translation_and_language_model_runs_reports_both(tmp_path):
    """A sweep mixing translation and LM points: the report dropped the LM point ("left out:
    a report does not mix"). Both kinds are reported: the translation tables, then the LM
    runs' perplexity table (its own CSV files), with the LM values from its eval.json."""
    rng = random.Random(0)
    (tmp_path / "translation").mkdir()
    (tmp_path / "translation" / "eval.json").write_text(json.dumps(_translation_eval()))
    lm = tmp_path / "lm"
    lm.mkdir()
    (lm / "eval.json").write_text(json.dumps(_eval_json("rope", {}, 16, 0, [16, 32], rng)))
    (lm / "config.json").write_text(json.dumps(_config_json("rope", {}, 16, 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out, so no warning says so
        paths = report.write_report(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "left out" not in md, md
    assert "## BLEU" in md and "sinusoidal" in md, md
    assert "perplexity" in md and "| rope |" in md.replace("  ", " ").replace("  ", " "), md
    lm_report = _load(lm / "eval.json")
    for r in lm_report["results"]:
        assert f"{r['perplexity']:.2f}" in md, (r, md)
    names = {os.path.basename(p) for p in paths}
    assert {"report.md", "report-lm.csv", "runs-lm.csv", "perplexity_vs_length_L16.png"} <= names
    with open(tmp_path / "report-lm.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["rope"]) for r in rows] == [r["perplexity"] for r in lm_report["results"]]


_TOY_CALLS = []


def _toy_report(sweep_dir, runs, metric):
    """The toy kind's section writer (named by its ``report_writer``, imported by the report)."""
    _TOY_CALLS.append(([os.path.basename(r.dir) for r in runs], metric))
    path = os.path.join(sweep_dir, "report.md")
    with open(path, "w") as f:
        f.write(f"# toy: {metric or 'toy_score'}\n")
    return [path]


def test_a_kind_registered_by_a_plugin_is_reported_by_its_own_writer(tmp_path):
    """A run kind posenc.report has never heard of (registered as a plugin registers one) owns
    its runs' eval.json, names its writer, offers its metric; the LM runs beside it follow."""
    from posenc.kinds import registry
    from posenc.kinds.base import RunKind

    class ToyKind(RunKind):
        name = "toy_report_kind"
        objective = "toy"
        precedence = 5
        report_writer = f"{__name__}:_toy_report"
        report_runs = "toy"
        report_metrics = ("toy_score",)

    rng = random.Random(0)
    toy = _eval_json("rope", {}, 16, 0, [16], rng)
    toy["objective"] = "toy"
    for name, data in (("toy", toy), ("lm", _eval_json("rope", {}, 16, 0, [16, 32], rng))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval.json").write_text(json.dumps(data))
        (tmp_path / name / "config.json").write_text(json.dumps(_config_json("rope", {}, 16, 0)))
    registry.register(ToyKind)
    try:
        _TOY_CALLS.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing is left out
            paths = report.write_report(str(tmp_path))
        assert _TOY_CALLS == [(["toy"], None)]  # --metric left at its default: the writer's
        md = (tmp_path / "report.md").read_text()
        assert md.startswith("# toy: toy_score\n") and "# Language-model runs: " in md, md
        assert {"report-lm.csv", "runs-lm.csv"} <= {os.path.basename(p) for p in paths}
        report.write_report(str(tmp_path), metric="toy_score")
        assert _TOY_CALLS[-1] == (["toy"], "toy_score")
    finally:
        registry.unregister(ToyKind.name)
    with pytest.raises(ValueError, match="--metric must be one of"):
        report.write_report(str(tmp_path), metric="toy_score")
