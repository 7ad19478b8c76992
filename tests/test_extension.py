"""posenc.studies.rope_extension: the RoPE context-extension experiment end to end on a tiny
model."""

from __future__ import annotations

import csv
import os

import _train_helpers as helpers
import pytest

from posenc.studies import rope_extension as extension
from posenc.workdir import RunDir, read_json


@pytest.mark.slow
def test_zero_shot_and_fine_tuned_columns(data_dir, tmp_path):
    config = helpers.tiny_config(data_dir, "train.steps=4", "eval.lengths=16,64")
    plan = extension.Plan(factor=2, finetune_steps=2, finetune_warmup=1)
    workdir = str(tmp_path / "extension")
    paths = extension.run(config, workdir, plan, progress=False)
    base = RunDir(os.path.join(workdir, "base"))
    zero_shot = {name: base.read_eval(name) for name in base.eval_files()}
    assert len(zero_shot) == 5, sorted(zero_shot)
    changes = sorted(
        r["changes"].get("encoding.hparams.scaling", "none") for r in zero_shot.values()
    )
    assert changes == ["dynamic", "linear", "none", "ntk", "yarn"]
    for report in zero_shot.values():
        if report["changes"]:
            assert report["changes"]["encoding.hparams.factor"] == 2
            assert report["changes"]["encoding.hparams.original_max_len"] == 16

    def ppl(report, length):
        return next(r["perplexity"] for r in report["results"] if r["length"] == length)

    by_scaling = {r["changes"].get("encoding.hparams.scaling"): r for r in zero_shot.values()}
    # Dynamic NTK does not scale windows up to the training length (its definition); PI does.
    assert ppl(by_scaling["dynamic"], 16) == pytest.approx(ppl(by_scaling[None], 16), rel=1e-6)
    assert ppl(by_scaling["linear"], 16) != pytest.approx(ppl(by_scaling[None], 16), rel=1e-6)

    for scaling in ("linear", "yarn"):
        tuned = RunDir(os.path.join(workdir, f"finetune-{scaling}"))
        config_tuned = tuned.read_config()
        assert config_tuned.train.seq_len == 32 and config_tuned.encoding.hparams.factor == 2
        assert config_tuned.encoding.hparams.scaling == scaling
        assert read_json(tuned.file("init.json"))["init_from"] == os.path.abspath(base.path)
        assert [r["length"] for r in tuned.read_eval()["results"]] == [16, 64]

    with open(paths[1]) as f:
        header = next(csv.reader(f))
    assert header[2:] == [
        "none",
        "PI",
        "NTK",
        "dynamic NTK",
        "YaRN",
        "PI fine-tuned",
        "YaRN fine-tuned",
    ]
    assert os.path.exists(paths[2])

    # Run again: everything is found, nothing recomputed.
    stamps = {p: os.stat(os.path.join(base.path, p)).st_mtime_ns for p in base.eval_files()}
    extension.run(config, workdir, plan, progress=False)
    assert {p: os.stat(os.path.join(base.path, p)).st_mtime_ns for p in base.eval_files()} == stamps


def test_the_base_run_must_be_plain_rope(data_dir, tmp_path):
    config = helpers.tiny_config(data_dir, "encoding.name=alibi")
    with pytest.raises(ValueError, match="plain RoPE"):
        extension.run(config, str(tmp_path / "x"), progress=False)
    with pytest.raises(ValueError, match="factor must be an integer >= 2"):
        extension.Plan(factor=1)


def test_the_report_of_an_imported_bpe_model_names_its_tokens(tmp_path):
    """The extension report's heading said "tokens are bytes" whatever the runs' tokenizer (the
    LM report names them since issue 36); an imported BPE model's perplexity is per BPE token."""
    import json
    import random
    from pathlib import Path

    from test_report import _config_json, _eval_json

    from posenc.report.runs import Column, Run

    golden = Path(__file__).resolve().parent / "hf" / "golden" / "llama"
    run_dir = tmp_path / "llama"
    (run_dir / "tokenizer").mkdir(parents=True)
    (run_dir / "tokenizer" / "tokenizer.json").write_text((golden / "tokenizer.json").read_text())
    report = _eval_json("rope", {"base": 10000.0}, 32, 0, [32, 64], random.Random(0))
    report["data"] = {**report.get("data", {}), "tokenizer": "hf:tokenizer"}
    (run_dir / "eval.json").write_text(json.dumps(report))
    (run_dir / "config.json").write_text(json.dumps(_config_json("rope", {"base": 10000.0}, 32, 0)))
    run = Run(str(run_dir), report, {})
    assert run.tokens == "BPE"
    plan = extension.Plan(factor=2, finetune_steps=2, finetune_warmup=1)
    extension.write_report(str(tmp_path), [Column("RoPE", [run])], 32, plan)
    md = (tmp_path / "report.md").read_text()
    assert "tokens are bytes" not in md and "BPE tokens" in md, md
