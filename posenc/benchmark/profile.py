"""Where a compiled program spends its time: per-instruction self times from XLA's trace.

A ratio to NoPE says how much an encoder costs, not where. This traces a compiled program with
``jax.profiler`` (the runtime records one event per executed HLO instruction: fusions, dots,
loops, conditionals), reads the trace back with ``jax.profiler.ProfileData`` and sums each
instruction's *self* time: a ``while`` or ``conditional`` event encloses the events of its body,
which are subtracted from it, so the times add up to the program's run time instead of counting
a loop's body twice. Each instruction is named as in ``compiled.as_text()``, with the JAX
operation it came from (its ``op_name`` metadata, e.g. ``jit(step)/transpose(jvp())/reduce_sum``
for a reduction of the backward pass).

That is how CoPE's training cost on XLA:CPU was located (``experiments/README.md``): sixteen
``[B, H, T, S]`` broadcasts of constants feeding YNNPACK fusions, each its own instruction.

    rows = profile(lambda: step(state, batch), steps=20, compiled_text=compiled.as_text())
"""

from __future__ import annotations

import dataclasses
import glob
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax

# The head of an instruction line of an HLO module's text: `%name = shape opcode(`.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = (?P<shape>.+?) (?P<op>[\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One HLO instruction of the compiled program: what it is and where it came from."""

    name: str
    opcode: str
    shape: str
    op_name: str


@dataclasses.dataclass(frozen=True)
class OpTime:
    """Self time of one instruction, per call of the profiled function."""

    instruction: Instruction
    seconds: float
    calls: float  # executions per call (a loop body's instructions run once per iteration)


def instructions(compiled_text: str) -> dict[str, Instruction]:
    """Every instruction of ``compiled.as_text()`` by name (names are unique in a module)."""
    found = {}
    for line in compiled_text.splitlines():
        if m := _INSTRUCTION.match(line):
            op_name = _OP_NAME.search(line)
            found[m["name"]] = Instruction(
                m["name"], m["op"], m["shape"], op_name["op_name"] if op_name else ""
            )
    return found


def profile(run: Callable[[], Any], steps: int, compiled_text: str) -> tuple[list[OpTime], float]:
    """Traces ``steps`` calls of ``run`` and returns the self time of each instruction.

    Args:
      run: calls the compiled program once (it is blocked on after the last call).
      steps: calls to trace; times are divided by it.
      compiled_text: ``compiled.as_text()`` of the program ``run`` calls; only events naming one
        of its instructions are counted (the trace also holds Python and runtime events).

    Returns:
      ``(rows, seconds)``: the instructions' self times per call, longest first, and the wall
      time per call of the traced calls (tracing adds a little to it).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    known = instructions(compiled_text)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            start = time.perf_counter()
            out = None
            for _ in range(steps):
                out = run()
            jax.block_until_ready(out)
            wall = (time.perf_counter() - start) / steps
        (path,) = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
    seconds: dict[str, float] = {}
    calls: dict[str, int] = {}
    for plane in data.planes:
        for line in plane.lines:
            events = [
                (e.start_ns, e.start_ns + e.duration_ns, e.name)
                for e in line.events
                if e.name in known
            ]
            for name, self_ns in _self_times(events):
                seconds[name] = seconds.get(name, 0.0) + self_ns * 1e-9
                calls[name] = calls.get(name, 0) + 1
    rows = [OpTime(known[n], s / steps, calls[n] / steps) for n, s in seconds.items()]
    return sorted(rows, key=lambda r: -r.seconds), wall


def _self_times(events: list[tuple[float, float, str]]) -> list[tuple[str, float]]:
    """``(name, end - start - time of the events nested in it)`` for events of one thread.

    Events on one thread either nest (a loop and its body) or follow each other.
    """
    out = []
    stack: list[list] = []  # [end, name, self time so far]
    for start, end, name in sorted(events, key=lambda e: (e[0], -e[1])):
        while stack and stack[-1][0] <= start:
            done = stack.pop()
            out.append((done[1], done[2]))
        if stack:
            stack[-1][2] -= end - start  # the enclosing event did not spend this itself
        stack.append([end, name, end - start])
    out.extend((name, own) for _, name, own in stack)
    return out


def by_kind(rows: list[OpTime]) -> list[tuple[str, float, int]]:
    """Self time summed per kind of instruction (its name without the ``.N`` suffix:
    ``ynn_fusion``, ``dot``, ``wrapped_broadcast``, ``while`` ...), longest first."""
    totals: dict[str, list] = {}
    for r in rows:
        kind = re.sub(r"\.\d+$", "", r.instruction.name)
        entry = totals.setdefault(kind, [0.0, 0])
        entry[0] += r.seconds
        entry[1] += 1
    return sorted(((k, s, n) for k, (s, n) in totals.items()), key=lambda t: -t[1])
