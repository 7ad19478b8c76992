"""Memory planned before a run: ``posenc plan`` compiles a run's training step and one
evaluation batch for a mesh of any size and reports what each device would hold.

Nothing runs and nothing is allocated: the train state and the batches are shapes with their
shardings (``jax.ShapeDtypeStruct``), the step is lowered and compiled for them, and XLA's
buffer assignment (``Compiled.memory_analysis()``) gives the bytes of the arguments, outputs and
temporaries of one device's program. When the requested device count is not this process's, a
child process with that many virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``) does the compiling, so 8 accelerators'
plan is made on a laptop.

The figures are XLA:CPU's program for the mesh: parameters, optimizer state and the batch are
exact (they are the arrays' shard shapes); temporaries follow the CPU compiler's fusion and
scheduling, which may differ from a GPU's or a TPU's (``tests/test_plan.py`` compares them with
the compiled program of the run itself).

What is planned: the training step (a decoder-only run's at ``train.batch_size`` x
``train.seq_len``; a translation run's at its longest bucket of source/target pairs, read from
its data as training reads them) and the evaluation of the longest ``eval.lengths`` (decoder-only
runs; a translation run's beam search runs on one device and is not planned). ``parts`` (``posenc
plan --only``) plans one of the two: ``eval`` alone for a model that is only evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from typing import Any

import ml_collections

# What can be planned (``posenc plan --only``).
PARTS = ("train", "eval")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_bytes(text: str) -> int:
    """``"80GB"`` (10^9), ``"80GiB"`` (2^30), ``"512MB"``, ``"1e9"`` -> bytes.

    Raises:
      ValueError: one line naming the value and the accepted forms.
    """
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|B)?\s*", text, flags=re.IGNORECASE)
    try:
        value = float(match.group(1)) if match else -1.0
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(
            f"--device-memory must be a size such as 80GB (10^9 bytes) or 80GiB (2^30), got "
            f"{text!r}"
        )
    return int(value * _UNITS[(match.group(2) or "").upper()])


@dataclasses.dataclass
class Plan:
    """What one device of the mesh holds (bytes).

    Attributes:
      devices: devices of the mesh; mesh: its axis sizes.
      params, optimizer: parameters and optimizer state (Adam's moments), per device; the
        optimizer None when the training step is not planned.
      train: the training step's compiled memory (``arguments``, ``outputs``, ``aliased``,
        ``temporaries``, ``code``, ``peak``) and what it computes (``rows``, ``length``; for
        pairs also ``source``, the source length, ``length`` being the target's), or None.
      eval: the same for one evaluation batch (the longest ``eval.lengths``), or None.
      device_memory: the memory one device has (None: not known, no verdict).
    """

    devices: int
    mesh: dict[str, int]
    params: int
    optimizer: int | None
    train: dict[str, int] | None
    eval: dict[str, int] | None
    device_memory: int | None = None

    @property
    def peak(self) -> int:
        """The most any of the compiled programs holds at once."""
        return max(part["peak"] for part in (self.train, self.eval) if part)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory is None else self.peak <= self.device_memory

    def table(self) -> str:
        """The plan as the lines ``posenc plan`` prints."""
        mesh = " x ".join(f"{a} {n}" for a, n in self.mesh.items() if n > 1) or "1 device"
        lines = [
            f"{self.devices} device{'s' * (self.devices > 1)}, mesh {mesh}; per device:",
            f"  parameters        {_gib(self.params)}",
        ]
        if self.train:
            t = self.train
            shape = (
                f"{t['rows']} pairs of {t['source']} source and {t['length']} target tokens"
                if "source" in t
                else f"{t['rows']} x {t['length']} tokens"
            )
            lines += [
                f"  optimizer state   {_gib(self.optimizer)}",
                f"  train step ({shape}): activations and temporaries "
                f"{_gib(t['temporaries'])}, peak {_gib(t['peak'])}",
            ]
        if self.eval:
            e = self.eval
            lines.append(
                f"  evaluation ({e['rows']} x {e['length']} tokens): temporaries "
                f"{_gib(e['temporaries'])}, peak {_gib(e['peak'])}"
            )
        if self.device_memory is None:
            lines.append(f"  peak {_gib(self.peak)} (give --device-memory for a verdict)")
        else:
            verdict = "fits" if self.fits else "does NOT fit"
            share = 100 * self.peak / self.device_memory
            lines.append(
                f"  peak {_gib(self.peak)} of {_gib(self.device_memory)} ({share:.0f} %): {verdict}"
            )
        return "\n".join(lines)


def _gib(n: int) -> str:
    from posenc.fits import gib

    return gib(n)


def plan(
    config: ml_collections.ConfigDict,
    devices: int | None = None,
    device_memory: int | None = None,
    parts: tuple[str, ...] = PARTS,
) -> Plan:
    """Compiles ``config``'s training step and longest evaluation batch for ``devices`` devices
    on the mesh of ``config.mesh``, without running them.

    Args:
      config: a decoder-only or translation run config (validated as training validates it).
      devices: the mesh's device count; None: this process's. A count other than this
        process's is planned in a child process with that many virtual CPU devices.
      device_memory: bytes per device for the verdict; None: this process's device's when
        it plans on its own devices (the host's memory on a CPU), else no verdict.
      parts: what to plan, of :data:`PARTS` (module docstring).

    Raises:
      ValueError: an invalid config or mesh, or nothing to plan, in one line.
    """
    import jax

    parts = _check_parts(config, parts)
    if devices is not None and devices != jax.device_count():
        result = _plan_in_child(config, devices, parts)
    else:
        result = _compile(config, parts)
        if device_memory is None:
            from posenc import fits

            device_memory = fits.device_memory()
    return Plan(**result, device_memory=device_memory)


def _check_parts(config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> tuple[str, ...]:
    """``parts`` checked against :data:`PARTS` and what ``config`` can plan (one-line errors)."""
    from posenc import classify, translation

    if classify.is_classifier(config):
        raise ValueError(
            "posenc plan covers decoder-only and translation runs; a classifier is not planned"
        )
    parts = tuple(parts)
    if not parts or any(p not in PARTS for p in parts):
        raise ValueError(f"posenc plan --only must be one of {list(PARTS)}, got {list(parts)}")
    if parts == ("eval",) and translation.is_translation(config):
        raise ValueError(
            "posenc plan --only eval: a translation run's evaluation (beam search on one device) "
            "is not planned; plan its training step"
        )
    return parts


def _plan_in_child(
    config: ml_collections.ConfigDict, devices: int, parts: tuple[str, ...]
) -> dict[str, Any]:
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
        f"--xla_force_host_platform_device_count={devices}".strip(),
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "posenc.plan", *parts],
        input=config.to_json_best_effort(),
        env=env,
        capture_output=True,
        text=True,
    )
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    if proc.returncode == 2 and last:  # a refusal: one line
        raise ValueError(json.loads(last[0])["error"])
    if proc.returncode != 0 or not last:
        raise RuntimeError(f"planning on {devices} virtual devices failed:\n{proc.stderr[-3000:]}")
    return json.loads(last[0])


def _bytes_per_device(tree: Any) -> int:
    """Bytes of one device's shards of ``tree``'s shape structs (their shardings' shard
    shapes: for an evenly split array, what every device holds)."""
    import jax
    import numpy as np

    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
        for x in jax.tree.leaves(tree)
    )


def _memory(compiled: Any) -> dict[str, int]:
    m = compiled.memory_analysis()
    out = {
        "arguments": int(m.argument_size_in_bytes),
        "outputs": int(m.output_size_in_bytes),
        "aliased": int(m.alias_size_in_bytes),
        "temporaries": int(m.temp_size_in_bytes),
        "code": int(m.generated_code_size_in_bytes),
    }
    out["peak"] = sum(out[k] for k in ("arguments", "outputs", "temporaries", "code"))
    out["peak"] -= out["aliased"]
    return out


def _compile(config: ml_collections.ConfigDict, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """The figures of :class:`Plan` (but ``device_memory``) on this process's devices."""
    from flax import nnx

    from posenc import sharding, tasks, translation
    from posenc.config import eval_lengths, validate
    from posenc.evaluate import Scorer
    from posenc.models import build
    from posenc.train import Trainer

    mesh = sharding.make_mesh(config)
    validate(config, num_devices=sharding.batch_shards(mesh))
    result: dict[str, Any] = {
        "devices": int(mesh.devices.size),
        "mesh": dict(mesh.shape),
        "params": 0,
        "optimizer": None,
        "train": None,
        "eval": None,
    }
    if "train" in parts:
        trainer = Trainer(config, mesh)
        args, shape = _train_inputs(config, trainer)
        result.update(
            params=_bytes_per_device(args[0]["params"]),
            optimizer=_bytes_per_device(args[0]["opt_state"]),
            train={**_memory(_compile_step(trainer._step, args)), **shape},
        )
    lengths = eval_lengths(config)
    if (
        "eval" in parts
        and lengths
        and not (tasks.task_of(config) or translation.is_translation(config))
    ):
        scorer = Scorer(nnx.eval_shape(lambda: build(config)), mesh)
        length = max(lengths)
        shards = sharding.batch_shards(mesh)
        rows = -(-max(1, config.eval.batch_tokens // length) // shards) * shards
        scored = _memory(scorer.lower(rows, length).compile(_options()))
        result["eval"] = {**scored, "rows": rows, "length": length}
        if "train" not in parts:
            result["params"] = _bytes_per_device(scorer.state)
    if result["train"] is None and result["eval"] is None:
        raise ValueError(
            "posenc plan --only eval: this run has no evaluation to plan (an algorithmic task "
            "generates its examples); plan its training step"
        )
    return result


def _compile_step(step: Any, args: tuple[Any, ...]) -> Any:
    """The training step compiled as the run compiles it (:func:`_options`)."""
    return step.lower(*args).compile(_options())


def _options() -> dict[str, Any]:
    """XLA options of the plan's compilations: the run's own (``fits.CheckedJit``'s: on a
    CPU, those that keep ``model.remat``'s recomputation where ``jax.checkpoint`` put it), and
    LLVM at -O0. Buffer assignment is done on XLA's graph before LLVM runs, so the figures
    are the same; the machine code, never run, compiles about a third faster."""
    from posenc import fits

    return {**fits.compiler_options(), "xla_backend_optimization_level": 0}


def _train_inputs(
    config: ml_collections.ConfigDict, trainer: Any
) -> tuple[tuple[Any, ...], dict[str, int]]:
    """The training step's arguments (shapes with shardings) and what they hold: a decoder-only
    run's batch from the config alone (no data read), a translation run's longest bucket from
    its training pairs (:meth:`posenc.train.Trainer.step_inputs`)."""
    import jax
    import jax.numpy as jnp

    from posenc import sharding, tasks, translation
    from posenc.config import masked_lm
    from posenc.data.pair_batching import encode_pairs

    if translation.is_translation(config):
        source, vocab = translation.open_data(config)
        pairs = encode_pairs(source.pairs("train"), vocab)
        batches = translation.train_batches(config, pairs, sharding.batch_shards(trainer.mesh))
        args = trainer.step_inputs(batches)
        rows, s = args[1]["src"].shape
        return args, {"rows": rows, "source": s, "length": args[1]["tgt_in"].shape[1]}
    t = config.train
    rows, length = t.batch_size, t.seq_len
    fields = {"inputs": jnp.int32, "targets": jnp.int32}
    if t.positions == "randomized":
        fields["positions"] = jnp.int32
    if masked_lm(config) is not None or tasks.task_of(config):
        fields["weights"] = jnp.float32
    batch = {
        k: jax.ShapeDtypeStruct((rows, length), d, sharding=trainer.batch_sharding)
        for k, d in fields.items()
    }
    memory = [trainer.mem_len] if trainer.mem_len else []
    return (trainer.abstract_state(), batch, *memory), {"rows": rows, "length": length}


def _child() -> int:
    """``python -m posenc.plan [PART ...]`` (config JSON on stdin): one JSON line of figures, or
    of the one-line error (exit status 2)."""
    config = ml_collections.ConfigDict(json.loads(sys.stdin.read()))
    try:
        print(json.dumps(_compile(config, tuple(sys.argv[1:]) or PARTS)))
    except ValueError as e:
        print(json.dumps({"error": str(e).strip().splitlines()[0]}))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_child())
