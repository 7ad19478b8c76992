"""Trains tiny models on several meshes of one process's CPU devices; used by test_sharding.py.

Started in a fresh interpreter whose ``XLA_FLAGS`` force ``--devices`` host devices. For each
encoder it steps :class:`posenc.runs.train.Trainer` by hand on the same random token batches, first
on one device, then on each mesh, and writes ``<out>.json``: per encoder and mesh the losses, and
the bytes of parameters and optimizer state one device holds (from the arrays' own shards) and
in all. With ``--checkpoint DIR`` it also saves the first encoder's trained state on the first
mesh there and restores it onto every mesh and onto one device, recording whether every array
came back bit for bit and on the target mesh's shardings.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from posenc import encodings, testing
from posenc.devices import fits, sharding
from posenc.runs.config import apply_overrides, load_config
from posenc.runs.train import Trainer
from posenc.workdir import Checkpoints

# 2 layers, width 32, 4 heads, vocabulary 264 (divisible by 8): every parameter matrix can
# split over 8 devices, so the saving is the mesh's, not the config's.
OVERRIDES = (
    "model.num_layers=2",
    "model.model_dim=32",
    "model.num_heads=4",
    "model.mlp_dim=64",
    "model.vocab_size=264",
    "model.dtype=float32",
    "train.seq_len=16",
    "train.batch_size=8",
    "optim.warmup_steps=2",
    "optim.learning_rate=0.01",
)


def config_for(encoding: str, mesh: dict[str, int], *extra: str):
    path = __file__.rsplit("/", 2)[0] + "/configs/base.py"
    fields = [f"mesh.{axis}={size}" for axis, size in mesh.items()]
    return apply_overrides(
        load_config(f"{path}:tiny"), [*OVERRIDES, f"encoding.name={encoding}", *fields, *extra]
    )


def batches(steps: int, config) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    t = config.train
    tokens = rng.integers(0, 257, (steps, t.batch_size, t.seq_len + 1), dtype=np.int32)
    return [{"inputs": b[:, :-1], "targets": b[:, 1:]} for b in tokens]


def train_on(config, devices, steps: int):
    """(trainer, final state, per-step mean losses) on a mesh over ``devices``."""
    trainer = Trainer(config, sharding.make_mesh(config, devices))
    state = trainer.init_state()
    losses = []
    for batch in batches(steps, config):
        batch = trainer.global_batch(batch)
        state, metrics = trainer.step(state, batch)
        losses.append(float(metrics["loss_sum"]) / float(metrics["tokens"]))
    # The program that ran: its bytes per device, by XLA's buffer assignment.
    trainer.compiled_bytes = fits.required_bytes(trainer._step.compile(state, batch))
    return trainer, state, losses


def _bytes(state) -> dict[str, int]:
    tree = {"params": state["params"], "opt_state": state["opt_state"]}
    return {
        "per_device": sharding.shard_bytes(tree),
        "total": sum(int(x.nbytes) for x in jax.tree.leaves(tree)),
    }


def _specs(state) -> dict[str, str]:
    leaves = jax.tree_util.tree_leaves_with_path(state["params"])
    return {jax.tree_util.keystr(p): str(x.sharding.spec) for p, x in leaves}


def _restored_like(trainer, saved, directory: str) -> dict:
    ckpt = Checkpoints(directory, writer=False)
    abstract = trainer.abstract_state()
    train_state = {k: v for k, v in abstract.items() if k != "params"}
    step, params, rest = ckpt.restore_latest(abstract["params"], train_state)
    ckpt.close()
    restored = {"params": params, **rest}
    pairs = zip(jax.tree.leaves(saved), jax.tree.leaves(restored), strict=True)
    targets = jax.tree.leaves(abstract)
    return {
        "step": step,
        "bit_exact": all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs),
        "on_target": all(
            r.sharding.is_equivalent_to(t.sharding, r.ndim)
            for r, t in zip(jax.tree.leaves(restored), targets, strict=True)
        ),
        "per_device": _bytes(restored)["per_device"],
    }


def _verdict(check, name: str) -> str:
    try:
        check(name)
        return "ok"
    except (AssertionError, testing.NotApplicable) as e:
        return f"{type(e).__name__}: {e}"


def context_parallel(names: list[str]) -> dict[str, str]:
    """The battery's ``context_parallel`` check of each encoder (windows split over 4 context
    devices against one device): ``{name: "ok" | why it failed | why it does not apply}``."""
    return {name: _verdict(testing.check_context_parallel, name) for name in names}


def context_parallel_split_off(names: list[str]) -> dict[str, dict[str, str]]:
    """The check's teeth: with the evaluation's window sharding ignoring ``mesh.context`` (every
    device scores whole windows), per encoder the check's verdict (``"check"``) and the verdict
    of the check without its split assertion (``"losses_only"``, what it used to be)."""
    from posenc.kinds.stream import Scorer
    from posenc.testing import context

    Scorer._window_sharding = lambda self, shape: self.batch_sharding  # the split switched off
    out = {name: {"check": _verdict(testing.check_context_parallel, name)} for name in names}
    context._split = lambda shape, where, size: True  # the split assertion switched off too
    for name in names:
        out[name]["losses_only"] = _verdict(testing.check_context_parallel, name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--encodings", required=True)
    parser.add_argument("--meshes", default="[]", help="json list of {axis: size}")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--context-parallel", action="store_true", help="the battery's context_parallel check"
    )
    parser.add_argument(
        "--split-off", action="store_true", help="with --context-parallel: the check's teeth"
    )
    args = parser.parse_args()
    if jax.device_count() != args.devices:
        raise SystemExit(f"expected {args.devices} devices, JAX has {jax.device_count()}")
    if args.context_parallel:
        names = encodings.names() if args.encodings == "all" else args.encodings.split(",")
        report = (context_parallel_split_off if args.split_off else context_parallel)(names)
        with open(args.out, "w") as f:
            json.dump(report, f)
        return
    meshes = json.loads(args.meshes)
    report: dict = {}
    names = args.encodings.split(",")
    for name in names:
        one = config_for(name, {"data": 1})
        _, single, losses = train_on(one, jax.devices()[:1], args.steps)
        entry = {"single": {"losses": losses, "bytes": _bytes(single)}}
        for mesh in meshes:
            trainer, state, losses = train_on(config_for(name, mesh), jax.devices(), args.steps)
            key = "x".join(f"{a}{n}" for a, n in mesh.items())
            entry[key] = {
                "losses": losses,
                "bytes": _bytes(state),
                "specs": _specs(state),
                "compiled_bytes": trainer.compiled_bytes,
            }
            if args.checkpoint and mesh is meshes[0] and name == names[0]:
                ckpt = Checkpoints(args.checkpoint)
                trainer.save(ckpt, state, args.steps)
                ckpt.close()
                saved = jax.device_get(state)
                entry["restored"] = {}
                for target in meshes:
                    other = Trainer(config_for(name, target))
                    label = "x".join(f"{a}{n}" for a, n in target.items())
                    entry["restored"][label] = _restored_like(other, saved, args.checkpoint)
                one_device = Trainer(one, sharding.make_mesh(one, jax.devices()[:1]))
                entry["restored"]["single"] = _restored_like(one_device, saved, args.checkpoint)
        report[name] = entry
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
