"""Sharding over a named mesh (posenc/devices/sharding.py): the rules, the mesh config, and training
on 8 virtual CPU devices over data, FSDP and tensor-parallel meshes.

The fast tests work on abstract meshes (no devices needed); the 8-device runs start
``tests/_sharding_devices.py`` in a fresh interpreter (``XLA_FLAGS`` must be set before JAX
starts) and are in the slow step.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from posenc import encodings
from posenc.devices import sharding
from posenc.layers.config import ModelConfig
from posenc.layers.params import EncoderParam
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer
from posenc.runs.config import apply_overrides, load_config
from posenc.runs.train import Trainer

SCRIPT = Path(__file__).resolve().parent / "_sharding_devices.py"
TINY = str(Path(__file__).resolve().parents[1] / "configs" / "base.py") + ":tiny"


def _mesh(**sizes: int) -> AbstractMesh:
    shape = sharding.mesh_shape(sizes, 8)
    return AbstractMesh(tuple(shape.values()), tuple(shape))


def test_mesh_shape_fills_the_rest_and_names_bad_fields():
    assert sharding.mesh_shape(None, 8) == {"data": 8, "fsdp": 1, "context": 1, "tensor": 1}
    assert sharding.mesh_shape({"data": 2, "fsdp": -1}, 8)["fsdp"] == 4
    assert sharding.mesh_shape({"fsdp": 2, "tensor": 4, "data": 1}, 8)["tensor"] == 4
    with pytest.raises(ValueError, match=r"mesh\.data=3 x mesh\.fsdp=2 = 6 devices does not "):
        sharding.mesh_shape({"data": 3, "fsdp": 2}, 8)
    with pytest.raises(ValueError, match=r"mesh\.fsdp=4 x mesh\.tensor=4 = 16 .* the 8 devices"):
        sharding.mesh_shape({"data": 1, "fsdp": 4, "tensor": 4}, 8)
    with pytest.raises(ValueError, match=r"^mesh\.tensor=3 = 3 devices does not divide the 8 "):
        sharding.mesh_shape({"tensor": 3}, 8)
    with pytest.raises(ValueError, match=r"only one mesh field may be -1"):
        sharding.mesh_shape({"data": -1, "fsdp": -1}, 8)
    with pytest.raises(ValueError, match=r"mesh\.tensor must be a positive integer or -1"):
        sharding.mesh_shape({"tensor": 0}, 8)
    with pytest.raises(ValueError, match=r"mesh has no field 'model'"):
        sharding.mesh_shape({"model": 2}, 8)


def test_rules_map_logical_axes_to_mesh_axes():
    fsdp_tp = _mesh(data=1, fsdp=2, tensor=4)
    assert sharding.spec(("embed", "heads", "head_dim"), (32, 4, 8), fsdp_tp) == P("fsdp", "tensor")
    assert sharding.spec(("heads", "head_dim", "embed"), (4, 8, 32), fsdp_tp) == P(
        "tensor", None, "fsdp"
    )
    assert sharding.spec(("mlp", "embed"), (64, 32), fsdp_tp) == P("tensor", "fsdp")
    # A vocabulary of 257 does not split 4 ways: that axis stays whole.
    assert sharding.spec(("vocab", "embed"), (257, 32), fsdp_tp) == P(None, "fsdp")
    # Mesh axes of size 1 are left out: the default mesh replicates every parameter.
    assert sharding.spec(("embed", "mlp"), (32, 64), _mesh()) == P()
    assert sharding.batch_spec(_mesh()) == P("data")
    assert sharding.batch_spec(_mesh(data=2, fsdp=4)) == P(("data", "fsdp"))
    assert sharding.batch_shards(_mesh(data=1, fsdp=2, tensor=4)) == 2
    with pytest.raises(ValueError, match="no sharding rule for logical axis 'rows'"):
        sharding.spec(("rows",), (8,), fsdp_tp)


def _config(*overrides: str):
    return apply_overrides(load_config(TINY), list(overrides))


def test_every_parameter_is_named():
    """Every parameter of a model with every optional part (biases, untied output, gated MLP,
    embedding norm, an encoder-decoder's cross-attention) carries axis names, so FSDP and
    tensor parallelism reach it, and so do the encoder parameters their encoder names (XL's
    ``u``, ``v``, ``W_kR``; T5's table)."""
    config = ModelConfig(
        num_layers=1,
        model_dim=32,
        num_heads=4,
        mlp_dim=64,
        tie_embeddings=False,
        mlp="swiglu",
        qkv_bias=True,
        out_bias=True,
        mlp_bias=True,
        embed_norm=True,
    )
    models = [
        nnx.eval_shape(lambda: Transformer(config, encodings.get("xl"), rngs=nnx.Rngs(0))),
        nnx.eval_shape(
            lambda: EncoderDecoder(
                dataclasses.replace(config, embed_norm=False), encodings.get("t5"), rngs=nnx.Rngs(0)
            )
        ),
    ]
    for model in models:
        params = nnx.state(model, nnx.Param)
        leaves = jax.tree_util.tree_leaves_with_path(
            params, is_leaf=lambda x: isinstance(x, nnx.Variable)
        )
        unnamed = [
            jax.tree_util.keystr(p) for p, v in leaves if sharding.AXES not in v.get_metadata()
        ]
        assert unnamed == []
        assert any(isinstance(v, EncoderParam) for _, v in leaves)


def test_the_default_mesh_replicates_the_train_state():
    """On the default mesh of 8 devices every array of the train state is replicated and the
    batch split by rows: the placement of plain data parallelism, so the default run is the
    one posenc has always run; with FSDP most arrays are split."""
    trainer = Trainer(_config("encoding.name=t5"))
    abstract = jax.eval_shape(trainer._init)
    specs = jax.tree.leaves(sharding.tree_shardings(abstract, _mesh()))
    assert {s.spec for s in specs} == {P()}
    fsdp = jax.tree.leaves(sharding.tree_shardings(abstract, _mesh(data=2, fsdp=4)))
    assert sum(s.spec != P() for s in fsdp) > len(fsdp) // 2


def _run_devices(tmp_path: Path, encodings: str, meshes: list[dict], checkpoint: bool) -> dict:
    out = tmp_path / "report.json"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    args = [sys.executable, str(SCRIPT), "--devices", "8", "--encodings", encodings]
    args += ["--meshes", json.dumps(meshes), "--steps", "20", "--out", str(out)]
    if checkpoint:
        args += ["--checkpoint", str(tmp_path / "checkpoints")]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


MESHES = [{"data": 8}, {"data": 2, "fsdp": 4}, {"data": 1, "fsdp": 2, "tensor": 4}]
SHRINK = {"data8": 1, "data2xfsdp4": 4, "data1xfsdp2xtensor4": 8}


@pytest.mark.slow
def test_meshes_train_like_one_device_and_shrink_the_state(tmp_path):
    """20 steps on (8 data), (2 data x 4 fsdp), (2 fsdp x 4 tensor) give one device's losses
    (float32; the sums are reordered, so to 1e-5) for RoPE, ALiBi (a bias), Transformer-XL
    (per-layer parameters) and T5 (a bias table shared by the layers); each device holds
    parameters and Adam moments smaller by fsdp x tensor (measured on the arrays' shards: the
    only whole arrays are the encoders' small tables and Adam's step counts). The first
    encoder's state, saved from the 8-way data-parallel mesh, restores bit for bit onto every
    mesh and onto one device, on the target's shardings."""
    report = _run_devices(tmp_path, "rope,alibi,xl,t5", MESHES, checkpoint=True)
    for name, entry in report.items():
        single = entry["single"]
        for mesh, factor in SHRINK.items():
            assert entry[mesh]["losses"] == pytest.approx(single["losses"], rel=1e-5, abs=1e-5), (
                name,
                mesh,
            )
            total, per_device = entry[mesh]["bytes"]["total"], entry[mesh]["bytes"]["per_device"]
            assert total == single["bytes"]["total"]
            assert 0.9 * factor <= total / per_device <= factor, (name, mesh, total / per_device)
    assert report["rope"]["data1xfsdp2xtensor4"]["specs"]["['blocks'][0]['attn']['q'].value"] == (
        "P('fsdp', 'tensor')"
    )
    restored = report["rope"]["restored"]
    assert set(restored) == {*SHRINK, "single"}
    for mesh, result in restored.items():
        assert result["step"] == 20 and result["bit_exact"] and result["on_target"], mesh
    assert restored["data1xfsdp2xtensor4"]["per_device"] < restored["single"]["per_device"] / 6


@pytest.mark.slow
def test_encoders_with_parameter_axes_train_on_fsdp_and_tensor_meshes(tmp_path):
    """DeBERTa (a relative table and projections per layer), the forgetting transformer (a gate
    projection) and PoPE (a phase bias per head) declare axes for their parameters: 20 steps on
    (2 fsdp x 4 tensor), the mesh that splits a parameter of each, give one device's losses, and
    each encoder parameter lies split as its declared axes say on that mesh."""
    names, meshes = ("deberta", "forgetting", "pope"), MESHES[2:]
    report = _run_devices(tmp_path, ",".join(names), meshes, checkpoint=False)
    dims = ModelConfig(model_dim=32, num_heads=4).dims  # _sharding_devices.OVERRIDES
    split = set()
    for name in names:
        enc = encodings.get(name)
        axes, shapes = enc.param_axes(), enc.param_shapes(dims)
        for mesh in meshes:
            key = "x".join(f"{a}{n}" for a, n in mesh.items())
            entry = report[name][key]
            assert entry["losses"] == pytest.approx(
                report[name]["single"]["losses"], rel=1e-5, abs=1e-5
            ), (name, key)
            expected = {
                param: str(sharding.spec(axes[param], shapes[param], _mesh(**mesh)))
                for param in shapes
            }
            for layer in (0, 1):
                held = {
                    param: entry["specs"][f"['blocks'][{layer}]['pos_params']['{param}'].value"]
                    for param in shapes
                }
                assert held == expected, (name, key, layer)
            split |= {(name, key) for spec in expected.values() if spec != "P()"}
    # Not a comparison of replicated with replicated: what each mesh splits.
    assert split == {
        ("deberta", "data1xfsdp2xtensor4"),
        ("forgetting", "data1xfsdp2xtensor4"),
        ("pope", "data1xfsdp2xtensor4"),
    }


@pytest.mark.slow
def test_context_parallel_evaluation_equals_one_device_for_every_encoder(tmp_path):
    """The encoder battery's ``context_parallel`` check (posenc.testing), on 8 virtual devices
    for every registered encoder: 32-token windows on the blocked path in tiles of 8, split over
    4 context devices (a tile each), score one device's loss (to 1e-5). A battery check, so an
    encoder registered later is covered with no edit here."""
    out = tmp_path / "context.json"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    args = [sys.executable, str(SCRIPT), "--devices", "8", "--encodings", "all"]
    args += ["--context-parallel", "--out", str(out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report) == set(encodings.names())
    assert {name: r for name, r in report.items() if r != "ok"} == {}


@pytest.mark.slow
def test_context_parallel_check_fails_when_the_windows_are_not_split(tmp_path):
    """The check's teeth: with the evaluation's window sharding switched off (every device scores
    whole windows, ``mesh.context`` ignored) RoPE and T5 still score one device's loss, so a check
    of losses alone passes; the check must see that the step's windows are not split."""
    out = tmp_path / "split_off.json"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    args = [sys.executable, str(SCRIPT), "--devices", "8", "--encodings", "rope,t5"]
    args += ["--context-parallel", "--split-off", "--out", str(out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for name in ("rope", "t5"):
        assert report[name]["losses_only"] == "ok", (name, report[name])
        assert report[name]["check"].startswith("AssertionError: "), (name, report[name])
        assert "are not split over the 4 context devices" in report[name]["check"], report[name]
