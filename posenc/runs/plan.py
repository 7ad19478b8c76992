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

A mesh the config cannot use (a batch its ``data`` x ``fsdp`` rows do not divide, a ``tensor``
or ``context`` axis that splits nothing, a window past int32 positions) is refused before
anything compiles or any child starts: a child with a million virtual devices ran 452 s and took
15 GB before it failed. What does not fit in ``--device-memory`` comes with the settings that
would lower it (:func:`remedies`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import ml_collections

# What can be planned (``posenc plan --only``).
PARTS = ("train", "eval")
# The longest window: positions (and the attention's comparisons of them) are int32.
MAX_LENGTH = 2**31 - 1


class PlanFailed(RuntimeError):
    """The planning child process failed (crashed, or was killed); the message is one line
    naming the reason."""


def parse_bytes(text: str) -> int:
    """``"80GB"`` (10^9), ``"80GiB"`` (2^30), ``"512MB"``, ``"1e9"`` -> bytes
    (:func:`posenc.devices.budget.parse_bytes`).

    Raises:
      ValueError: one line naming the value and the accepted forms.
    """
    from posenc.devices.budget import parse_bytes as parse

    return parse(text, "--device-memory")


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
      paths: the attention path ``attention_impl="auto"`` takes on each backend
        (:func:`posenc.runs.paths.paths_table`, ``{length: {backend: path}}``) at the planned
        training and evaluation lengths of a decoder-only run; None for other models.
      config: the planned run's config (for the remedies of a plan that does not fit).
    """

    devices: int
    mesh: dict[str, int]
    params: int
    optimizer: int | None
    train: dict[str, int] | None
    eval: dict[str, int] | None
    device_memory: int | None = None
    paths: dict[str, dict[str, str]] | None = None
    config: ml_collections.ConfigDict | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

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
            sized = f", sized from a {_gib(e['budget'])} budget" if "budget" in e else ""
            lines.append(
                f"  evaluation ({e['rows']} x {e['length']} tokens{sized}): temporaries "
                f"{_gib(e['temporaries'])}, peak {_gib(e['peak'])}"
            )
        if self.paths:
            from posenc.runs.paths import describe

            for length, by_backend in self.paths.items():
                lines.append(f"  attention at {length} tokens: {describe(by_backend)}")
        if self.device_memory is None:
            lines.append(f"  peak {_gib(self.peak)} (give --device-memory for a verdict)")
        else:
            verdict = "fits" if self.fits else "does NOT fit"
            share = 100 * self.peak / self.device_memory
            lines.append(
                f"  peak {_gib(self.peak)} of {_gib(self.device_memory)} ({share:.0f} %): {verdict}"
            )
            if not self.fits and self.config is not None:
                lines += [f"  to fit, try {fix}" for fix in remedies(self, self.config)]
        return "\n".join(lines)


def remedies(plan: Plan, config: ml_collections.ConfigDict) -> list[str]:
    """The settings that would lower what does not fit in ``plan.device_memory``, each with
    why it applies (empty when everything fits or there is no verdict).

    The training step: ``model.remat=full`` (a block's activations recomputed in the backward
    pass) unless it is on; ``mesh.fsdp`` when the parameters and optimizer state are a real
    share of the peak (they are split over ``fsdp`` x ``tensor``); fewer rows per device (a
    smaller batch), or a shorter window when a device holds one row already. The evaluation:
    fewer windows per device (``eval.batch_tokens``), more ``mesh.context`` (each window split)
    and a smaller ``model.attention_block_size``; for a model only evaluated, ``mesh.fsdp``.
    """
    memory = plan.device_memory
    if memory is None or plan.fits:
        return []
    mesh, out = plan.mesh, []
    shards = mesh["data"] * mesh["fsdp"]
    state = plan.params + (plan.optimizer or 0)
    t, e = plan.train, plan.eval
    if (t and t["peak"] > memory) or (e and e["peak"] > memory and t is None):
        if state >= 0.1 * plan.peak:  # splitting them pays only when they are a real share
            what = "parameters and optimizer state" if t else "parameters"
            more = (
                f"mesh.fsdp={mesh['fsdp'] * mesh['data']} with mesh.data=1"
                if mesh["data"] > 1
                else "more devices on mesh.fsdp"
            )
            out.append(f"{more} ({what}: {_gib(state)} per device, split by fsdp x tensor)")
    if t and t["peak"] > memory:
        remat = config.model.get("remat", "none")
        if remat != "full":
            out.append(
                f"model.remat=full (now {remat!r}; recomputes each block's activations in the "
                "backward pass)"
            )
        rows = t["rows"] // shards
        if "source" in t:
            tokens = config.train.get("tokens_per_batch")
            out.append(f"a smaller train.tokens_per_batch (now {tokens}; {rows} pairs per device)")
        elif rows > 1:
            out.append(f"a smaller train.batch_size (now {t['rows']}; {rows} windows per device)")
        else:
            out.append(f"a shorter train.seq_len (now {t['length']}; one window per device)")
    if e and e["peak"] > memory:
        rows = e["rows"] // shards
        if rows > 1 and config.eval.batch_tokens is None:
            out.append(
                f"a smaller eval.memory_budget (now {config.eval.get('memory_budget')}; {rows} "
                f"windows of {e['length']} tokens per device)"
            )
        elif rows > 1:
            out.append(
                f"a smaller eval.batch_tokens (now {config.eval.batch_tokens}; {rows} windows of "
                f"{e['length']} tokens per device)"
            )
        from posenc.layers.config import LOSS_CHUNK_BYTES

        vocab = config.model.get("vocab_size", 0)
        chunk = config.model.get("loss_chunk")
        chunk = max(1, LOSS_CHUNK_BYTES // (4 * vocab)) if chunk is None and vocab else chunk
        tokens = e["rows"] * e["length"]
        logits = 4 * vocab * (min(chunk, tokens) if chunk else tokens) // shards  # float32
        if logits >= 0.1 * e["peak"]:
            out.append(
                f"a smaller model.loss_chunk (now {chunk}; the loss holds about {_gib(logits)} of "
                "logits at once)"
            )
        out.append(
            f"more mesh.context (now {mesh['context']}; splits each {e['length']}-token window "
            "over that many devices, a divisor of the length)"
        )
        block = config.model.get("attention_block_size")
        if block and e["length"] > block:
            out.append(f"a smaller model.attention_block_size (now {block}; queries per tile)")
    return out


def _gib(n: int) -> str:
    from posenc.devices.fits import gib

    return gib(n)


def plan(
    config: ml_collections.ConfigDict,
    devices: int | None = None,
    device_memory: int | None = None,
    parts: tuple[str, ...] = PARTS,
    progress: bool = False,
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
      progress: print a line before and after each compilation (their time grows with
        ``model.num_layers``).

    Raises:
      ValueError: an invalid config or mesh (one the device count cannot use), a window past
        :data:`MAX_LENGTH`, or nothing to plan, in one line; before anything compiles.
      PlanFailed: the planning child process failed (one line: its reason).
    """
    import jax

    parts = _check_parts(config, parts)
    config = _with_budget(config, device_memory)
    local = devices is None or devices == jax.device_count()
    _check_mesh(config, jax.device_count() if local else devices, parts)
    say = _say if progress else _quiet
    if not local:
        result = _plan_in_child(config, devices, parts, say)
    else:
        result = _compile(config, parts, say)
        if device_memory is None:
            from posenc.devices import fits

            device_memory = fits.device_memory()
    return Plan(**result, device_memory=device_memory, config=config)


def _with_budget(
    config: ml_collections.ConfigDict, device_memory: int | None
) -> ml_collections.ConfigDict:
    """``config`` with ``eval.memory_budget`` set to the share of ``device_memory`` an
    evaluation takes by default (:data:`posenc.devices.budget.DEFAULT_SHARE`), where the
    evaluation is sized from a budget and none is given: the plan then sizes the batches of
    the devices planned for, not of this machine. Unchanged otherwise."""
    e = config.get("eval")
    if device_memory is None or e is None or e.get("batch_tokens", 0) is not None:
        return config
    if e.get("memory_budget") is not None:
        return config
    from posenc.devices.budget import DEFAULT_SHARE

    config = ml_collections.ConfigDict(config.to_dict())
    config.eval.memory_budget = str(int(DEFAULT_SHARE * device_memory))
    return config


def _say(text: str) -> None:
    print(text, flush=True)


def _quiet(text: str) -> None:
    del text


def _check_parts(config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> tuple[str, ...]:
    """``parts`` checked against :data:`PARTS` and what ``config``'s kind can plan
    (:meth:`posenc.kinds.RunKind.plan_refusal`; one-line errors)."""
    from posenc import kinds

    refusal = kinds.kind_of(config).plan_refusal(config, tuple(parts))
    if refusal:
        raise ValueError(refusal)
    parts = tuple(parts)
    if not parts or any(p not in PARTS for p in parts):
        raise ValueError(f"posenc plan --only must be one of {list(PARTS)}, got {list(parts)}")
    return parts


def _check_mesh(config: ml_collections.ConfigDict, devices: int, parts: tuple[str, ...]) -> None:
    """Refuses, from the config alone, a mesh of ``devices`` devices the run cannot use and a
    window no int32 position reaches (one-line ``ValueError``), before any compilation or child
    process: the config is validated for the mesh's batch split, and a ``tensor`` or
    ``context`` axis above 1 must divide something it splits (else every device holds the
    same). The lengths are the kind's (:meth:`posenc.kinds.RunKind.plan_lengths`); a kind
    whose lengths are its data's is checked when its step is planned."""
    import jax

    from posenc import kinds
    from posenc.devices import sharding
    from posenc.runs.config import validate

    section = config.get("mesh")
    shape = sharding.mesh_shape(None if section is None else section.to_dict(), devices)
    abstract = jax.sharding.AbstractMesh(
        tuple(shape[a] for a in sharding.MESH_AXES), sharding.MESH_AXES
    )
    validate(config, num_devices=sharding.batch_shards(abstract))
    lengths = kinds.kind_of(config).plan_lengths(config, parts)
    if lengths is None:
        return  # its lengths are its data's (read when its step is planned)
    for field, length in lengths.items():
        if length > MAX_LENGTH:
            raise ValueError(
                f"{field} gives a {length}-token window, past {MAX_LENGTH} (2^31 - 1), the most "
                f"int32 positions reach; lower {field.replace(' x ', ' or ')}"
            )
    m = config.model
    splits = {
        "tensor": {
            f"model.{k}": m.get(k) for k in ("num_heads", "mlp_dim", "vocab_size") if m.get(k)
        },
        "context": lengths,
    }
    for axis, sizes in splits.items():
        n = shape[axis]
        if n > 1 and not any(size % n == 0 for size in sizes.values()):
            what = (
                f"the planned lengths ({', '.join(f'{k}={v}' for k, v in sizes.items())})"
                if axis == "context"
                else ", ".join(f"{k}={v}" for k, v in sizes.items())
            )
            raise ValueError(
                f"mesh.{axis}={n} splits none of {what}: every device would hold the same; use a "
                f"mesh.{axis} that divides one of them, or fewer --devices"
            )


def _plan_in_child(
    config: ml_collections.ConfigDict,
    devices: int,
    parts: tuple[str, ...],
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The figures compiled by ``python -m posenc.runs.plan`` with ``devices`` virtual CPU devices;
    its progress lines passed to ``say`` as they come.

    Raises:
      ValueError: the child's refusal (one line).
      PlanFailed: the child crashed or was killed: one line with the last line of its error
        output, or the signal (an out-of-memory kill prints nothing).
    """
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
        f"--xla_force_host_platform_device_count={devices}".strip(),
        "JAX_PLATFORMS": "cpu",
    }
    where = f"planning on {devices} virtual CPU devices (a child process)"
    say(f"{where} ...")
    start = time.perf_counter()
    # stderr to a file: read at the end, it cannot fill a pipe while stdout is being read.
    with tempfile.TemporaryFile("w+") as stderr:
        with subprocess.Popen(
            [sys.executable, "-m", "posenc.runs.plan", *parts],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            text=True,
        ) as proc:
            try:
                proc.stdin.write(config.to_json_best_effort())
                proc.stdin.close()
            except BrokenPipeError:  # it died before reading: its exit status says why
                pass
            last: dict[str, Any] | None = None
            for line in proc.stdout:
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a library's own print
                if isinstance(message, dict) and "progress" in message:
                    say(message["progress"])
                elif isinstance(message, dict):
                    last = message
            code = proc.wait()
        stderr.seek(0)
        errors = [line.strip() for line in stderr.read().splitlines() if line.strip()]
    seconds = time.perf_counter() - start
    if last is not None and "error" in last and code == 2:  # a refusal: one line
        raise ValueError(last["error"])
    if code == 0 and last is not None and "error" not in last and "failed" not in last:
        return last
    if last is not None and "failed" in last:
        reason = last["failed"]
    elif code < 0:
        name = signal.Signals(-code).name
        reason = f"was killed by {name} after {seconds:.0f} s" + (
            " (as the system kills a process out of memory; plan fewer --devices or a smaller "
            "model)"
            if code == -signal.SIGKILL
            else ""
        )
        raise PlanFailed(f"{where} {reason}")
    else:
        reason = errors[-1][:300] if errors else "no error output"
    raise PlanFailed(f"{where} failed (exit status {code}): {reason}")


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


def _compile(
    config: ml_collections.ConfigDict,
    parts: tuple[str, ...] = PARTS,
    say: Callable[[str], None] = _quiet,
) -> dict[str, Any]:
    """The figures of :class:`Plan` (but ``device_memory``) on this process's devices; a line
    to ``say`` before and after each compilation."""
    from flax import nnx

    from posenc import kinds
    from posenc.devices import budget as budget_lib
    from posenc.devices import sharding
    from posenc.kinds.stream import Scorer
    from posenc.models import build
    from posenc.runs.config import eval_lengths, validate
    from posenc.runs.train import Trainer

    mesh = sharding.make_mesh(config)
    validate(config, num_devices=sharding.batch_shards(mesh))
    kind = kinds.kind_of(config)
    result: dict[str, Any] = {
        "devices": int(mesh.devices.size),
        "mesh": dict(mesh.shape),
        "params": 0,
        "optimizer": None,
        "train": None,
        "eval": None,
        "paths": _paths(config, parts),
    }
    if "train" in parts:
        trainer = Trainer(config, mesh)
        args, shape = _train_inputs(config, trainer)
        what = (
            f"{shape['rows']} pairs of {shape['source']} + {shape['length']} tokens"
            if "source" in shape
            else f"{shape['rows']} x {shape['length']} tokens"
        )
        with _compiling(say, f"the training step ({what}, {_layers(config)})"):
            compiled = _compile_step(trainer._step, args)
        result.update(
            params=_bytes_per_device(args[0]["params"]),
            optimizer=_bytes_per_device(args[0]["opt_state"]),
            train={**_memory(compiled), **shape},
        )
    lengths = eval_lengths(config)
    if "eval" in parts and lengths and kind.plan_eval:
        scorer = Scorer(nnx.eval_shape(lambda: build(config)), mesh)
        length = max(lengths)
        e = config.eval
        if e.batch_tokens is not None:
            rows = scorer.rows(length, e.batch_tokens)
            with _compiling(say, f"the evaluation ({rows} x {length} tokens, {_layers(config)})"):
                scored = _memory(scorer.lower(rows, length).compile(_options()))
            sized = {}
        else:  # windows per batch from the budget, as the evaluation sizes them
            budget = budget_lib.memory_budget(e.get("memory_budget"), scorer.param_bytes)
            what = f"the evaluation ({length}-token windows sized from a budget, {_layers(config)})"
            with _compiling(say, what):
                rows = scorer.rows(length, None, budget)
                scored = _memory(scorer.compiled(rows, length))
            sized = {"budget": budget} if budget is not None else {}
        result["eval"] = {**scored, "rows": rows, "length": length, **sized}
        if "train" not in parts:
            result["params"] = _bytes_per_device(scorer.state)
    if result["train"] is None and result["eval"] is None:
        raise ValueError(
            kind.plan_refusal(config, ("eval",))
            or "posenc plan --only eval: this run has no evaluation to plan; plan its training step"
        )
    return result


def _paths(config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> dict | None:
    """The attention path of each backend at the planned lengths (:class:`Plan`'s ``paths``),
    from the model's shapes (nothing allocated); None for a model without one stack of blocks
    (an encoder-decoder)."""
    from flax import nnx

    from posenc.models import build
    from posenc.runs.config import eval_lengths
    from posenc.runs.paths import paths_table

    model = nnx.eval_shape(lambda: build(config))
    if not hasattr(model, "blocks"):
        return None
    lengths = []
    if "train" in parts and config.get("train") and config.train.get("seq_len"):
        lengths.append(config.train.seq_len)
    if "eval" in parts and eval_lengths(config):
        lengths.append(max(eval_lengths(config)))
    return paths_table(model, dict.fromkeys(lengths)) or None


@contextlib.contextmanager
def _compiling(say: Callable[[str], None], what: str) -> Iterator[None]:
    """``say`` what is compiled, then how long it took (the time grows with the layers)."""
    say(f"compiling {what} ...")
    start = time.perf_counter()
    yield
    say(f"  compiled in {time.perf_counter() - start:.1f} s")


def _layers(config: ml_collections.ConfigDict) -> str:
    n = config.model.get("num_layers")
    return f"{n} layer{'s' * (n != 1)}" if n else "the model"


def _compile_step(step: Any, args: tuple[Any, ...]) -> Any:
    """The training step compiled as the run compiles it (:func:`_options`)."""
    return step.lower(*args).compile(_options())


def _options() -> dict[str, Any]:
    """XLA options of the plan's compilations: the run's own (``fits.CheckedJit``'s: on a
    CPU, those that keep ``model.remat``'s recomputation where ``jax.checkpoint`` put it), and
    LLVM at -O0. Buffer assignment is done on XLA's graph before LLVM runs, so the figures
    are the same; the machine code, never run, compiles about a third faster."""
    from posenc.devices import fits

    return {**fits.compiler_options(), "xla_backend_optimization_level": 0}


def _train_inputs(
    config: ml_collections.ConfigDict, trainer: Any
) -> tuple[tuple[Any, ...], dict[str, int]]:
    """The training step's arguments (shapes with shardings) and what they hold: the batch the
    kind plans (:meth:`posenc.kinds.RunKind.plan_step`: from the config alone where it can, a
    translation run's longest bucket from its training pairs) and, with memory, the static
    count of a full memory."""
    import jax

    fields, shape = trainer.kind.plan_step(config, trainer.mesh)
    batch = {
        k: jax.ShapeDtypeStruct(size, dtype, sharding=trainer.batch_sharding)
        for k, (size, dtype) in fields.items()
    }
    memory = [trainer.mem_len] if trainer.mem_len else []
    return (trainer.abstract_state(), batch, *memory), shape


def _child() -> int:
    """``python -m posenc.runs.plan [PART ...]`` (config JSON on stdin): JSON lines on stdout, the
    progress (``{"progress": ...}``), then the figures, or the one-line refusal (``{"error":
    ...}``, exit status 2) or failure (``{"failed": ...}``, exit status 1)."""
    config = ml_collections.ConfigDict(json.loads(sys.stdin.read()))
    try:
        figures = _compile(config, tuple(sys.argv[1:]) or PARTS, _progress_line)
    except ValueError as e:
        print(json.dumps({"error": _first_line(e)}))
        return 2
    except Exception as e:  # noqa: BLE001 - the parent reports it in one line
        print(json.dumps({"failed": f"{type(e).__name__}: {_first_line(e)}"}))
        return 1
    print(json.dumps(figures))
    return 0


def _progress_line(text: str) -> None:
    print(json.dumps({"progress": text}), flush=True)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__


if __name__ == "__main__":
    sys.exit(_child())
