"""Loads a tiny Hugging Face Llama straight into its shards on a mesh of this process's CPU
devices; used by tests/hf/test_sharded_load.py.

Started in a fresh interpreter whose ``XLA_FLAGS`` force 8 host devices. It loads the folder
with ``posenc.hf.load_pretrained`` once onto the default device and once onto the mesh
``MESH`` (2 fsdp x 4 tensor), imports it as a run directory on that mesh (``import_hf``) and
starts a run from that import on the same mesh (``train.init_from``), and writes ``<out>``:
for each parameter its sharding against the rules', the most bytes one device holds of it, and
the largest difference of logits (and of every parameter after the restore) from the
unsharded load.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np
from flax import nnx

from posenc.devices import sharding
from posenc.hf import load_pretrained
from posenc.hf.rundir import import_hf
from posenc.runs.config import apply_overrides
from posenc.runs.train import Trainer
from posenc.workdir import Checkpoints, RunDir

MESH = ("mesh.data=1", "mesh.fsdp=2", "mesh.tensor=4")


def _placements(params, mesh) -> dict[str, dict]:
    """Per parameter: whether its sharding is the rules' for its axis names, its spec, and the
    most bytes of it on one device."""
    out = {}
    leaves = jax.tree_util.tree_leaves_with_path(
        params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    for path, var in leaves:
        array = var.get_value()
        rules = sharding.named_sharding(var.get_metadata().get(sharding.AXES), array.shape, mesh)
        out[jax.tree_util.keystr(path)] = {
            "as_rules": array.sharding.is_equivalent_to(rules, array.ndim),
            "spec": str(rules.spec),
            "bytes": int(array.nbytes),
            "most_on_a_device": max(int(s.data.nbytes) for s in array.addressable_shards),
        }
    return out


def _flat(params) -> dict[str, np.ndarray]:
    return {
        jax.tree_util.keystr(p): np.asarray(x)
        for p, x in jax.tree_util.tree_leaves_with_path(params)
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if jax.device_count() != 8:
        raise SystemExit(f"expected 8 devices, JAX has {jax.device_count()}")
    tokens = np.random.default_rng(0).integers(0, 96, (2, 24)).astype(np.int32)
    plain, _ = load_pretrained(args.folder)
    want = np.asarray(plain(tokens))

    import_hf(args.folder, args.workdir, overrides=MESH)
    config = RunDir(args.workdir).read_config()
    mesh = sharding.make_mesh(config)
    sharded, _ = load_pretrained(args.folder, mesh=mesh)
    report = {
        "mesh": dict(mesh.shape),
        "params": _placements(nnx.state(sharded, nnx.Param), mesh),
        "logits_diff": float(np.abs(np.asarray(sharded(tokens)) - want).max()),
    }

    # A run started from the import on the same mesh (--init-from an imported run).
    config.unlock()
    config = apply_overrides(config, [f"train.init_from={args.workdir}"])
    trainer = Trainer(config, mesh)
    state, _ = trainer.restore_or_init(Checkpoints(os.path.join(args.workdir, "..", "fine")))
    restored = jax.tree.leaves(state["params"])
    targets = jax.tree.leaves(trainer.state_shardings["params"])
    plain_params = _flat(nnx.state(plain, nnx.Param))
    report["init_from"] = {
        "on_target": all(
            r.sharding.is_equivalent_to(t, r.ndim) for r, t in zip(restored, targets, strict=True)
        ),
        "params_diff": max(
            float(np.abs(v - plain_params[k]).max()) for k, v in _flat(state["params"]).items()
        ),
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
