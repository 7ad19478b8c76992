"""Imported Hugging Face weights load straight into their shards (``load_pretrained(mesh=...)``,
``posenc import-hf`` and ``--init-from`` an imported run on a sharded config).

``tests/_hf_shards_devices.py`` runs in a fresh interpreter with 8 virtual CPU devices
(``XLA_FLAGS`` must be set before JAX starts), so the test is in the slow step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
LLAMA = TESTS / "hf" / "golden" / "llama"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "olmo3", "cohere2"])
def test_a_llama_loads_into_its_shards_on_2_fsdp_x_4_tensor(tmp_path, name):
    """The tiny Llama (width 32, 4 heads, 2 key/value heads, vocabulary 96) loaded onto a mesh of
    2 fsdp x 4 tensor: every parameter has the sharding the rules give its axis names (the
    2 key/value heads stay whole over 4 tensor shards), no device holds the whole of a sharded
    one, and the logits equal the unsharded load's; imported on that mesh and used as
    ``train.init_from``, the parameters arrive on the run's shardings, bit for bit. Likewise the
    tiny OLMo 3 (per-layer kinds; QK-norm scales over all heads, replicated) and Cohere2 (issue
    32: RoPE and NoPE kinds, one norm per block), with the golden Llama's tokenizer."""
    import shutil

    folder = LLAMA
    if name != "llama":
        folder = tmp_path / name
        shutil.copytree(LLAMA.parent / name, folder, ignore=shutil.ignore_patterns("*.npz"))
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(LLAMA / file, folder / file)
    out = tmp_path / "report.json"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    args = [sys.executable, str(TESTS / "_hf_shards_devices.py"), "--folder", str(folder)]
    args += ["--workdir", str(tmp_path / "imported"), "--out", str(out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mesh"] == {"data": 1, "fsdp": 2, "context": 1, "tensor": 4}
    params = report["params"]
    assert len(params) >= 10
    assert [k for k, p in params.items() if not p["as_rules"]] == []
    assert params["['blocks'][0]['attn']['q']"]["spec"] == "P('fsdp', 'tensor')"
    assert params["['blocks'][0]['attn']['k']"]["spec"] == "P('fsdp',)"  # 2 heads, 4 shards
    if name == "olmo3":
        assert params["['blocks'][0]['attn_params']['k_norm']"]["spec"] == "P()"
    for name, p in params.items():
        if p["spec"] != "P()":
            assert p["most_on_a_device"] < p["bytes"], name
    assert report["logits_diff"] < 1e-5
    assert report["init_from"] == {"on_target": True, "params_diff": 0.0}
