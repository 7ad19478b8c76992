"""Whether a compiled computation fits in the device's memory, asked before it runs.

Once XLA has compiled a function for its argument shapes, its buffer assignment knows how many
bytes the arguments, outputs and temporaries take (``Compiled.memory_analysis()``); compiling
allocates none of them. :class:`CheckedJit` compiles ahead of time
(``jax.jit(f).lower(*args).compile()``), once per argument shapes, compares that total with the
memory of one device and refuses in one line (:class:`DoesNotFitError`) naming what does not fit
and what to change, where running it would end in a ``RESOURCE_EXHAUSTED`` traceback from the
allocator. The compiled executable is then the one that runs: nothing is compiled twice.

A device's memory is its allocator's limit (``memory_stats()["bytes_limit"]`` on GPUs and TPUs);
a CPU reports none, so the host's physical memory stands for it.
:func:`is_out_of_memory` recognises the allocator's failure itself, for what an estimate misses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

_GIB = 1 << 30


class DoesNotFitError(ValueError):
    """A computation needs more memory than its device has; the message says what to change."""


def device_memory(device: jax.Device | None = None) -> int | None:
    """Bytes one device can allocate: the allocator's limit, or for a CPU the host's physical
    memory; None when neither is known."""
    device = device or jax.local_devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without statistics raise various errors
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def required_bytes(compiled: jax.stages.Compiled) -> int | None:
    """Bytes a compiled executable holds while it runs on one device (arguments, outputs,
    temporaries and code, donated buffers counted once); None if the backend does not say."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements the analysis
        return None
    if stats is None:
        return None
    return int(
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        + stats.generated_code_size_in_bytes
        - stats.alias_size_in_bytes
    )


def gib(n: float) -> str:
    """``1.5 GiB`` (``0.001 GiB`` and up, then in scientific notation past a million GiB)."""
    value = n / _GIB
    return f"{value:.3g} GiB" if value < 1e6 else f"{value:.2e} GiB"


def check(compiled: jax.stages.Compiled, what: str, change: str) -> None:
    """Raises :class:`DoesNotFitError` if ``compiled`` needs more than one device's memory.

    Args:
      compiled: an executable compiled for its shapes.
      what: what it computes, e.g. ``"evaluating length 100000 (8 windows a batch)"``.
      change: what to change so that it fits, e.g. ``"lower eval.batch_tokens"``.
    """
    need, have = required_bytes(compiled), device_memory()
    if need is None or have is None or need <= have:
        return
    device = jax.local_devices()[0]
    where = "the host (cpu)" if device.platform == "cpu" else f"one device ({device.device_kind})"
    raise DoesNotFitError(
        f"{what} needs about {gib(need)} of memory, and {where} has {gib(have)}; {change}"
    )


def attention_change(implementation: str, block_size: int) -> str:
    """What to change in the attention path so that long windows take less memory."""
    if implementation in ("auto", "blocked"):
        return f"lower model.attention_block_size (now {block_size})"
    return (
        f"use model.attention_impl=blocked (now {implementation!r}, whose memory grows with "
        "the square of the length)"
    )


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocator's failure (XLA's ``RESOURCE_EXHAUSTED``)."""
    return isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error)


def _signature(leaf: Any) -> tuple[Any, ...]:
    """What selects a compilation: shape, dtype, sharding, weak type. The same for an array
    and a ``jax.ShapeDtypeStruct`` describing it (``posenc plan`` compiles from those)."""
    if isinstance(leaf, jax.Array):  # the common case, every step: attribute reads only
        return (leaf.shape, leaf.dtype, leaf.sharding, leaf.weak_type)
    sharding = getattr(leaf, "sharding", None)
    weak = bool(getattr(leaf, "weak_type", False))
    return (np.shape(leaf), getattr(leaf, "dtype", type(leaf)), sharding, weak)


def compiler_options() -> dict[str, str]:
    """XLA options for compiling a training step on this process's backend.

    On a CPU the rematerialisation of ``model.remat`` needs one: ``jax.checkpoint`` guards the
    recomputation with optimization barriers, which XLA:CPU removes early in its pipeline
    (``cse_barrier_expander``), and a later common-subexpression pass then merges the
    recomputed values with the forward pass's, keeping every activation alive as without
    remat (the compiled peak was unchanged). GPU and TPU compilers keep the barriers through
    scheduling. Without barriers in the program (no remat) the option changes nothing.
    """
    cpu = jax.default_backend() == "cpu"
    return {"xla_disable_hlo_passes": "cse_barrier_expander"} if cpu else {}


class CheckedJit:
    """``jax.jit(fun)``, compiled ahead of time once per argument shapes and checked against
    the device's memory (:func:`check`) before its first run.

    Args:
      fun: the function to jit.
      describe: ``describe(*args) -> (what, change)``: what a call with these arguments
        computes and what to change if it does not fit (for :func:`check`'s message).
      static_argnums, donate_argnums: as for ``jax.jit``; static arguments are part of what
        selects the compilation and are not passed to it.
    """

    def __init__(
        self,
        fun: Callable[..., Any],
        describe: Callable[..., tuple[str, str]],
        *,
        static_argnums: Sequence[int] = (),
        donate_argnums: Sequence[int] = (),
    ):
        self._jit = jax.jit(
            fun, static_argnums=tuple(static_argnums), donate_argnums=tuple(donate_argnums)
        )
        self._static = frozenset(static_argnums)
        self._describe = describe
        self._compiled: dict[Any, jax.stages.Compiled] = {}
        self._checked: set[Any] = set()

    def lower(self, *args: Any) -> jax.stages.Lowered:
        """``jax.jit(fun).lower(*args)``, unchecked (benchmarks compile for themselves)."""
        return self._jit.lower(*args)

    def compile(self, *args: Any, checked: bool = True) -> jax.stages.Compiled:
        """The executable for arguments shaped like ``args`` (arrays or
        ``jax.ShapeDtypeStruct``\\ s with their shardings), compiled on first use and checked
        before its first run; ``checked=False`` compiles without the check (to read its
        memory, :func:`required_bytes`, and choose other shapes), and a later call checks.

        Raises:
          DoesNotFitError: it needs more memory than one device has.
        """
        dynamic = [a for i, a in enumerate(args) if i not in self._static]
        leaves, tree = jax.tree.flatten(dynamic)
        static = tuple(a for i, a in enumerate(args) if i in self._static)
        key = (tree, tuple(_signature(leaf) for leaf in leaves), static)
        if key not in self._compiled:
            self._compiled[key] = self._jit.lower(*args).compile(compiler_options())
        if checked and key not in self._checked:
            check(self._compiled[key], *self._describe(*args))
            self._checked.add(key)
        return self._compiled[key]

    def __call__(self, *args: Any) -> Any:
        dynamic = [a for i, a in enumerate(args) if i not in self._static]
        return self.compile(*args)(*dynamic)
