"""posenc reads a config's rotary embedding as transformers does (issue 36): the reference is
transformers' own reading of each row of ``rope_golden.json`` (make_rope_golden.py: the
resolved ``rope_parameters``, the inverse frequencies and attention scaling its
``LlamaRotaryEmbedding`` computes), including the precedence of ``rope_scaling`` over
``rope_parameters`` when a config holds both. A row transformers raises or warns on is refused
by posenc in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from posenc.encodings.rope import attention_scale, rope_frequencies, rotary_dims
from posenc.hf.family import for_model_type
from posenc.hf.fields import HFConfig
from posenc.hf.tensors import TensorReader

HERE = Path(__file__).resolve().parent
GOLDEN = json.loads((HERE / "rope_golden.json").read_text())["rows"]
NAMES = TensorReader(str(HERE / "golden" / "llama")).names()


def _read(fields: dict):
    hf = HFConfig(fields, "llama", "config.json")
    spec = for_model_type(fields["model_type"], "config.json").read(hf, NAMES)
    hf.finish()
    return spec


def _frequencies(hparams: dict, head_dim: int) -> tuple[np.ndarray, float]:
    """posenc's inverse frequencies (at a length within training, as transformers' at
    initialisation) and the factor on queries and keys (1 when none)."""
    h = {k: v for k, v in hparams.items() if k not in ("layout", "fraction", "attention_factor")}
    theta = rope_frequencies(rotary_dims(head_dim, hparams.get("fraction", 1.0)), seq_len=1, **h)
    scale = attention_scale(
        hparams.get("scaling"),
        hparams.get("factor", 1.0),
        hparams.get("attention_factor"),
        hparams.get("original_max_len"),
    )
    return np.asarray(theta).reshape(-1), 1.0 if scale is None else scale


@pytest.mark.parametrize("name", [n for n, r in GOLDEN.items() if r["posenc"] == "reads"])
def test_posenc_reads_the_rope_transformers_reads(name):
    row = GOLDEN[name]
    want = row["transformers"]
    assert want["error"] is None
    spec = _read(row["config"])
    kind = want["rope_parameters"]["rope_type"]
    assert (spec.hparams.get("scaling") or "default") == kind
    if "factor" in want["rope_parameters"]:
        assert spec.hparams["factor"] == want["rope_parameters"]["factor"]
    assert spec.hparams["base"] == want["rope_parameters"]["rope_theta"]
    theta, scale = _frequencies(spec.hparams, spec.model.dims.head_dim)
    np.testing.assert_allclose(theta, want["inv_freq"], rtol=2e-6)
    assert scale == pytest.approx(want["attention_scaling"], rel=1e-6)


@pytest.mark.parametrize("name", [n for n, r in GOLDEN.items() if r["posenc"] == "refuses"])
def test_posenc_refuses_what_transformers_rejects_or_warns_on(name):
    row = GOLDEN[name]
    assert row["transformers"]["error"] or row["transformers"]["warnings"]
    with pytest.raises(ValueError) as info:
        _read(row["config"])
    line = str(info.value)
    assert "\n" not in line and "config.json" in line and "rope" in line, line


def test_the_golden_holds_the_disagreement_issue_36_found():
    """The row that built plain RoPE where transformers scales linearly (logits 81 % apart)."""
    row = GOLDEN["params_default_scaling_linear"]
    assert row["transformers"]["rope_parameters"]["rope_type"] == "linear"
    assert row["config"]["rope_parameters"]["rope_type"] == "default"
