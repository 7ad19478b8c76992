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
      params, optimizer: parameters and optimizer state (Adam's moments), per device.
      train: the training step's compiled memory (``arguments``, ``outputs``, ``aliased``,
        ``temporaries``, ``code``, ``peak``) and what it computes (``rows``, ``length``).
      eval: the same for one evaluation batch (the longest ``eval.lengths``), or None.
      device_memory: the memory one device has (None: not known, no verdict).
    """

    devices: int
    mesh: dict[str, int]
    params: int
    optimizer: int
    train: dict[str, int]
    eval: dict[str, int] | None
    device_memory: int | None = None

    @property
    def peak(self) -> int:
        """The most any of the compiled programs holds at once."""
        return max(self.train["peak"], self.eval["peak"] if self.eval else 0)

    @property
    def fits(self) -> bool | None:
        return None if self.device_memory is None else self.peak <= self.device_memory

    def table(self) -> str:
        """The plan as the lines ``posenc plan`` prints."""
        mesh = " x ".join(f"{a} {n}" for a, n in self.mesh.items() if n > 1) or "1 device"
        t = self.train
        lines = [
            f"{self.devices} device{'s' * (self.devices > 1)}, mesh {mesh}; per device:",
            f"  parameters        {_gib(self.params)}",
            f"  optimizer state   {_gib(self.optimizer)}",
            f"  train step ({t['rows']} x {t['length']} tokens): activations and temporaries "
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
) -> Plan:
    """Compiles ``config``'s training step and longest evaluation batch for ``devices`` devices
    on the mesh of ``config.mesh``, without running them.

    Args:
      config: a decoder-only run config (validated as training validates it).
      devices: the mesh's device count; None: this process's. A count other than this
        process's is planned in a child process with that many virtual CPU devices.
      device_memory: bytes per device for the verdict; None: this process's device's when
        it plans on its own devices (the host's memory on a CPU), else no verdict.

    Raises:
      ValueError: an invalid config or mesh, in one line.
    """
    import jax

    if devices is not None and devices != jax.device_count():
        result = _plan_in_child(config, devices)
    else:
        result = _compile(config)
        if device_memory is None:
            from posenc import fits

            device_memory = fits.device_memory()
    return Plan(**result, device_memory=device_memory)


def _plan_in_child(config: ml_collections.ConfigDict, devices: int) -> dict[str, Any]:
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
        f"--xla_force_host_platform_device_count={devices}".strip(),
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "posenc.plan"],
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


def _compile(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The figures of :class:`Plan` (but ``device_memory``) on this process's devices."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from posenc import fits, sharding, tasks, translation
    from posenc.config import eval_lengths, masked_lm, validate
    from posenc.evaluate import Scorer
    from posenc.models import build
    from posenc.train import Trainer

    if translation.is_translation(config):
        raise ValueError("posenc plan covers decoder-only runs; an encoder-decoder is not planned")
    mesh = sharding.make_mesh(config)
    validate(config, num_devices=sharding.batch_shards(mesh))
    trainer = Trainer(config, mesh)
    state = trainer.abstract_state()
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
    # The options the run itself compiles with (fits.CheckedJit): on a CPU, those that keep
    # model.remat's recomputation where jax.checkpoint put it.
    lowered = trainer._step.lower(state, batch, *memory)
    train = _memory(lowered.compile(fits.compiler_options()))
    result: dict[str, Any] = {
        "devices": int(mesh.devices.size),
        "mesh": dict(mesh.shape),
        "params": _bytes_per_device(state["params"]),
        "optimizer": _bytes_per_device(state["opt_state"]),
        "train": {**train, "rows": rows, "length": length},
        "eval": None,
    }
    lengths = eval_lengths(config)
    if lengths and not tasks.task_of(config):
        scorer = Scorer(nnx.eval_shape(lambda: build(config)), mesh)
        length = max(lengths)
        shards = sharding.batch_shards(mesh)
        rows = -(-max(1, config.eval.batch_tokens // length) // shards) * shards
        scored = _memory(scorer.lower(rows, length).compile())
        result["eval"] = {**scored, "rows": rows, "length": length}
    return result


def _child() -> int:
    """``python -m posenc.plan`` (config JSON on stdin): one JSON line of figures, or of the
    one-line error (exit status 2)."""
    config = ml_collections.ConfigDict(json.loads(sys.stdin.read()))
    try:
        print(json.dumps(_compile(config)))
    except ValueError as e:
        print(json.dumps({"error": str(e).strip().splitlines()[0]}))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_child())
