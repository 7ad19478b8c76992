"""Imported models give transformers' own logits (float32, relative error < 1e-5).

Each folder of ``tests/hf/golden/`` is a tiny randomly initialised model saved by
``tests/hf/make_golden.py`` with transformers' PyTorch code, with that code's logits on random
ids at a length within ``max_position_embeddings`` and one beyond it (every family, every
``rope_scaling`` type). The reference is transformers, never posenc: these tests need neither
torch nor transformers. Measured: relative errors ~1e-6 (the max absolute difference over the
largest logit).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc.attention.options import parse_window
from posenc.hf import load_pretrained
from posenc.hf.per_layer import layer_fields

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
TOLERANCE = 1e-5
# One folder per family in the default suite (about 3 s each, compiling two lengths); the other
# variants (Qwen2, Mistral, every rope_scaling type, sequential NeoX, Flan-T5, RoBERTa), OPT
# (learned positions, as GPT-2) and Phi-3 (Llama's parts, fused) in the slow step; their import
# and export are in the default suite (tests/test_hf_rundir.py).
FAST = ("llama", "gpt_neox", "gpt2", "bloom", "t5", "bert", "gemma3", "olmo3")
# issue 32: Cohere2 (RoPE and NoPE kinds, windows of 8, a shared-norm parallel block); Mistral's
# window, Qwen3, SmolLM3 in the slow step.
FAST += ("cohere2",)
FOLDERS = [
    name if name in FAST else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(os.listdir(GOLDEN))
]


def forward(model):
    """The model's ``__call__`` under one ``jax.jit`` (compiling once is faster than eager)."""
    graphdef, state = nnx.split(model)
    return jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args)).__get__(state)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", FOLDERS)
def test_logits_equal_transformers(name):
    folder = os.path.join(GOLDEN, name)
    golden = np.load(os.path.join(folder, "golden.npz"))
    model, spec = load_pretrained(folder)
    run = forward(model)
    checked = 0
    for key in golden.files:
        if key.startswith("ids_"):
            got = run(jnp.asarray(golden[key]))
        elif key.startswith("src_"):
            length = key[4:]
            got = run(jnp.asarray(golden[key]), jnp.asarray(golden[f"tgt_{length}"]))
        else:
            continue
        want = golden[f"logits_{key.split('_')[1]}"]
        assert got.shape == want.shape
        assert relative_error(np.asarray(got), want) < TOLERANCE, (name, key)
        checked += 1
    assert checked == 2
    # The longer length is beyond what the model was trained at (GPT-2's table ends there).
    lengths = [int(k.split("_")[1]) for k in golden.files if k.startswith(("ids_", "src_"))]
    assert max(lengths) > spec.train_len or spec.encoding != "rope"
    # ... and beyond every sliding window (issue 32: Mistral, Qwen3, SmolLM3, Cohere2).
    windows = [parse_window(layer["window"]) for layer in layer_fields(spec)]
    assert all(w.full or max(lengths) > w.size for w in windows)


@pytest.mark.slow
def test_bfloat16_parameters_and_compute_stay_near_transformers(tmp_path):
    """``param_dtype="bfloat16"`` keeps every parameter in bfloat16 (half the memory) and
    ``dtype="bfloat16"`` computes in it; logits stay float32 and near the float32 reference
    (bfloat16 has 8 bits of mantissa: a few percent of the largest logit)."""
    folder = os.path.join(GOLDEN, "llama")
    golden = np.load(os.path.join(folder, "golden.npz"))
    model, _ = load_pretrained(folder, dtype="bfloat16", param_dtype="bfloat16")
    dtypes = {p.dtype for p in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    got = forward(model)(jnp.asarray(golden["ids_24"]))
    assert got.dtype == jnp.float32
    error = relative_error(np.asarray(got), golden["logits_24"])
    assert 1e-4 < error < 5e-2  # bfloat16's rounding shows, and nothing else


_SHARDED = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from flax import nnx
from posenc.devices.distributed import make_mesh
from posenc.attention.options import parse_window
from posenc.hf import load_pretrained
from posenc.hf.per_layer import layer_fields
mesh = make_mesh()
assert mesh.size == 2
replicated = NamedSharding(mesh, P())
model, _ = load_pretrained({folder!r}, sharding=replicated)
params = jax.tree.leaves(nnx.state(model, nnx.Param))
assert all(p.sharding.is_equivalent_to(replicated, p.ndim) for p in params)
golden = np.load({golden!r})
got = np.asarray(model(jax.device_put(golden["ids_24"], NamedSharding(mesh, P("data")))))
print(float(np.abs(got - golden["logits_24"]).max() / np.abs(golden["logits_24"]).max()))
"""


@pytest.mark.slow
def test_loading_onto_a_mesh_places_each_parameter(tmp_path):
    """``sharding=``: parameters land replicated on a 2-device mesh as they are read, and the
    model computes transformers' logits there (a fresh process with two CPU devices)."""
    import subprocess
    import sys

    folder = os.path.join(GOLDEN, "llama")
    code = _SHARDED.format(folder=folder, golden=os.path.join(folder, "golden.npz"))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < TOLERANCE
