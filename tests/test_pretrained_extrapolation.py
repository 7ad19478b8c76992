"""experiments/pretrained_extrapolation.py (posenc.studies.pretrained_extrapolation) on the test
suite's tiny Hugging Face folders: a RoPE model under every zero-shot method, a learned-position
model as it is (its table ends at 2 x L), and the invariants the numbers must keep."""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import pytest

from posenc.studies import pretrained_extrapolation as pe

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "hf" / "golden"


def _script():
    spec = importlib.util.spec_from_file_location(
        "pretrained_extrapolation_script", REPO / "experiments" / "pretrained_extrapolation.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_tiny_variant_table_and_invariants(tmp_path, capsys):
    workdir = tmp_path / "exp"
    argv = [
        str(GOLDEN / "llama"),
        str(GOLDEN / "gpt2"),
        "--variant=tiny",
        f"--workdir={workdir}",
        f"--data-dir={tmp_path / 'data'}",
        "--multiples=1,2,4",
        "--max-tokens=256",
        "--batch-tokens=512",
    ]
    assert _script().main(argv) == 0
    with open(workdir / "extrapolation.csv") as f:
        rows = list(csv.DictReader(f))
    ppl = {(r["model"], r["method"], int(r["multiple"])): float(r["perplexity"]) for r in rows}
    llama = {method for model, method, _ in ppl if model == "llama"}
    assert llama == {"none", "PI", "NTK", "dynamic NTK", "YaRN", "Llama 3"}
    # GPT-2's learned table has 64 rows: 1x and 2x of L = 32 only, and no RoPE methods.
    assert sorted(k for k in ppl if k[0] == "gpt2") == [
        ("gpt2", "learned", 1),
        ("gpt2", "learned", 2),
    ]
    assert "| gpt2 | 32 | learned |" in (workdir / "extrapolation.md").read_text()
    # Dynamic NTK leaves lengths up to L unscaled; PI (positions / 4) does not.
    assert ppl[("llama", "dynamic NTK", 1)] == ppl[("llama", "none", 1)]
    assert ppl[("llama", "PI", 1)] != ppl[("llama", "none", 1)]
    assert ppl[("llama", "dynamic NTK", 2)] != ppl[("llama", "none", 2)]
    assert (workdir / "extrapolation.png").stat().st_size > 0

    # Run again: the imports and evaluations are reused, and the table is the same.
    reports = sorted((workdir / "llama").glob("eval*.json"))
    stamps = [p.stat().st_mtime_ns for p in reports]
    capsys.readouterr()
    assert _script().main(argv) == 0
    assert [p.stat().st_mtime_ns for p in sorted((workdir / "llama").glob("eval*.json"))] == stamps
    assert "L=" not in capsys.readouterr().out  # nothing was scored again


def test_plan_refuses_bad_fields():
    with pytest.raises(ValueError, match="unknown RoPE method 'pi'"):
        pe.Plan(methods=(None, "pi"))
    with pytest.raises(ValueError, match="multiples must be positive"):
        pe.Plan(multiples=(0, 2))
    assert pe.Plan(multiples=(1, 2, 8)).scaling_factor == 8


def test_a_missing_model_folder_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="never downloads") as error:
        pe.run([str(tmp_path / "pythia-160m")], str(tmp_path / "exp"), "pystdlib")
    assert "\n" not in str(error.value)
    assert not os.path.exists(tmp_path / "exp" / "pythia-160m")


def test_a_hugging_face_folder_needs_data(tmp_path):
    with pytest.raises(ValueError, match="is not a posenc run directory: give the text it scores"):
        pe.run([str(GOLDEN / "llama")], str(tmp_path / "exp"), None)


def test_a_model_that_is_not_a_causal_lm_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="is a t5 model, not a causal LM") as error:
        pe.run([str(GOLDEN / "t5")], str(tmp_path / "exp"), "pystdlib")
    assert "\n" not in str(error.value) and not os.path.exists(tmp_path / "exp" / "t5")


def _config(encoding: str, pattern=(), kinds=None, window="full"):
    from posenc.runs.config import load_config

    config = load_config(str(REPO / "configs" / "base.py") + ":tiny")
    config.encoding.name = encoding
    config.model.window = window
    with config.unlocked():
        config.layers.pattern = tuple(pattern)
        config.layers.kinds = kinds or {}
    return config


def test_rope_scopes_are_the_global_rope_layers():
    """Scaling goes where a published per-layer model puts it: its full-attention RoPE layers,
    not its windowed ones (which never see a distance past the window)."""
    assert pe.rope_scopes(_config("rope")) == ["encoding"]
    assert pe.rope_scopes(_config("alibi")) == []
    local = {"window": "sliding:8"}
    # Gemma 3: both kinds have their own RoPE; only the global one is scaled.
    gemma3 = {
        "sliding_attention": {**local, "encoding": "rope", "hparams": {"base": 1e4}},
        "full_attention": {"encoding": "rope", "hparams": {"base": 1e6}},
    }
    pattern = ("sliding_attention", "full_attention")
    config = _config("rope", pattern, gemma3)
    assert pe.rope_scopes(config) == ["layers.kinds.full_attention"]
    # ... and the overrides set that kind's RoPE alone.
    from posenc.runs.config import apply_overrides

    scaled = apply_overrides(config, pe.scope_overrides(pe.rope_scopes(config), "yarn", 4, 64))
    assert scaled.layers.kinds.full_attention.hparams.to_dict() == {
        "base": 1e6,
        "scaling": "yarn",
        "factor": 4,
        "original_max_len": 64,
    }
    assert scaled.layers.kinds.sliding_attention.hparams.to_dict() == {"base": 1e4}
    assert scaled.encoding.hparams.to_dict() == config.encoding.hparams.to_dict()
    plain = pe.scope_overrides(["encoding"], "linear", 2, 8)
    assert plain[0] == "encoding.hparams.scaling='linear'"
    # Cohere2: RoPE on the windowed layers, none on the global ones: nothing to scale.
    cohere2 = {"sliding_attention": local, "full_attention": {"encoding": "nope"}}
    assert pe.rope_scopes(_config("rope", pattern, cohere2)) == []
    # SmolLM3: global layers on the model's RoPE, every fourth without: the model's encoder.
    smol = {"rope": {}, "nope": {"encoding": "nope"}}
    assert pe.rope_scopes(_config("rope", ("rope", "rope", "rope", "nope"), smol)) == ["encoding"]
    # A model whose every layer is windowed (Mistral) has no global layer.
    assert pe.rope_scopes(_config("rope", window="sliding:8")) == []
    assert pe.rope_scopes(_config("rope", ("a",), {"a": {}}, window="sliding:8")) == []
