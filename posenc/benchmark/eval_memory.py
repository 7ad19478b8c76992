"""Evaluation memory and time of a pretrained-sized model: peak resident memory against the
parameters and one window's activations, and the chunked loss (``model.loss_chunk``) against
forming every logit at once.

Each case runs in a fresh child process (``python -m posenc.benchmark.eval_memory``), as peak
resident memory (``ru_maxrss``) only grows within a process: the child builds the model with
random parameters (no download), scores windows of a random token stream with
:func:`posenc.kinds.stream.evaluate` (windows per batch as the evaluation sizes them, or as
the case forces), and reports

- ``params``: parameter bytes; ``window``: XLA's temporaries for scoring one window of the length
  with the case's loss (``Compiled.memory_analysis()``, nothing run): one window's activations;
- ``rows``: windows per batch the evaluation took; ``planned``: the compiled program's bytes for
  that batch (arguments, outputs, temporaries), what ``posenc plan --only eval`` reports;
- ``rss_before`` (after building the model), ``rss_peak`` (the process's peak resident set after
  the evaluation); ``seconds``: the evaluation's wall time after compiling (the second of two
  runs over the same windows; the first compiles), and ``tokens`` scored.

The ratio the issue asks about is ``rss_peak / (params + window)``: the whole process (Python,
JAX and XLA's runtime and code included) against what one window of the model needs.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from typing import Any

# SmolLM2-135M's shape (its config.json): Llama, 30 layers, width 576, 9 query and 3 key/value
# heads, SwiGLU MLP of 1536, RMSNorm eps 1e-5, tied embeddings, 49,152 tokens, RoPE base 1e5.
SMOLLM2_135M = {
    "vocab_size": 49_152,
    "num_layers": 30,
    "model_dim": 576,
    "num_heads": 9,
    "num_kv_heads": 3,
    "mlp_dim": 1536,
    "mlp": "swiglu",
    "mlp_bias": False,
    "norm": "rmsnorm",
    "norm_eps": 1e-5,
    "scale_embeddings": False,
    "tie_embeddings": True,
    "dtype": "float32",
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: windows of ``length`` tokens, ``windows`` of them scored, the loss's
    chunk (``model.loss_chunk``; None: the default, 0: every logit at once) and
    ``eval.batch_tokens`` (None:
    windows per batch from the budget, the default)."""

    length: int
    loss_chunk: int | None = None
    batch_tokens: int | None = None
    windows: int = 4


def config_for(case: Case) -> Any:
    """The run config of ``case``: ``configs/base.py`` with SmolLM2-135M's shape."""
    import os

    from posenc.runs.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = load_config(os.path.join(root, "configs", "base.py") + ":base")
    config.model.update(SMOLLM2_135M, loss_chunk=case.loss_chunk)
    with config.encoding.hparams.unlocked():
        config.encoding.hparams.base = 100_000.0
    config.train.seq_len = 2048  # SmolLM2's training length
    config.eval.batch_tokens = case.batch_tokens
    return config


def _rss() -> int:
    """This process's peak resident set in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure(case: Case) -> dict[str, Any]:
    """Runs ``case`` in this process (call it in a fresh one: see the module docstring)."""
    import numpy as np

    from posenc import data as data_lib
    from posenc.devices import budget as budget_lib
    from posenc.devices import fits
    from posenc.kinds import stream
    from posenc.models.build import build

    config = config_for(case)
    model = build(config)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.model.vocab_size, case.windows * case.length + 1)
    windows = data_lib.eval_windows(tokens.astype(np.int32), case.length, stride=case.length)
    rss_before = _current_rss()
    # As stream.evaluate scores one length: the batch's rows, then every window.
    scorer = stream.Scorer(model)
    params = scorer.param_bytes
    budget = None
    if case.batch_tokens is None:
        budget = budget_lib.memory_budget(None, params)
    start = time.perf_counter()
    rows = scorer.rows(case.length, case.batch_tokens, budget, windows=windows.num_windows)
    scorer.score(windows, rows)  # compiles, then runs
    first = time.perf_counter() - start
    start = time.perf_counter()
    loss_sum, count = scorer.score(windows, rows)
    seconds = time.perf_counter() - start
    rss_peak = _rss()
    # Compiled after the peak was read: one window's program, and the batch's figures.
    window = scorer.compiled(1, case.length).memory_analysis().temp_size_in_bytes
    planned = fits.required_bytes(scorer.compiled(rows, case.length))
    return {
        **dataclasses.asdict(case),
        "params": params,
        "window": int(window),
        "rows": rows,
        "budget": budget,
        "planned": planned,
        "rss_before": rss_before,
        "rss_peak": rss_peak,
        "compile_and_run_seconds": first,
        "seconds": seconds,
        "tokens": int(count.sum()),
        "loss": float(loss_sum.sum() / count.sum()),
    }


def run_case(case: Case, timeout: float = 1800) -> dict[str, Any]:
    """``case`` measured in a child process."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "posenc.benchmark.eval_memory",
            json.dumps(dataclasses.asdict(case)),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {**dataclasses.asdict(case), "error": f"exit {proc.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def loss_times(length: int, rounds: int = 5, grad: bool = False) -> dict[str, Any]:
    """Seconds of the loss alone over one window of SmolLM2-135M's head (final RMSNorm, tied
    49,152 x 576 projection), chunked by default and unchunked, from random hidden states:
    both compiled first, then ``rounds`` interleaved rounds each timing both (the order rotated),
    so that a shared machine's drift falls on both. ``grad``: the loss and its gradient (the
    training step's share) instead of the loss alone (evaluation's).

    Returns:
      ``{"length", "grad", "chunk", "chunked": [s, ...], "unchunked": [s, ...], "ratio"}``,
      ``ratio`` the median chunked over the median unchunked.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    from posenc.devices import fits
    from posenc.layers.config import ModelConfig
    from posenc.models.losses import chunked_token_losses

    shape = {k: SMOLLM2_135M[k] for k in ("vocab_size", "model_dim", "norm_eps")}
    chunk = ModelConfig(**shape, num_heads=9, mlp_dim=1536).loss_chunk_tokens
    rng = np.random.default_rng(0)
    v, d = shape["vocab_size"], shape["model_dim"]
    table = jnp.asarray(rng.standard_normal((v, d)) * 0.02, jnp.float32)
    scale = jnp.ones(d, jnp.float32)
    hidden = jnp.asarray(rng.standard_normal((1, length, d)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, v, (1, length)), jnp.int32)

    def head(table, scale, x):  # RMSNorm, then the tied projection
        x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5) * scale
        return jnp.einsum("btd,vd->btv", x, table)

    def loss(table, scale, hidden, size):
        f = lambda x: head(table, scale, x)  # noqa: E731
        return chunked_token_losses(hidden, targets, f, chunk=size).loss.sum()

    programs = {}
    for name, size in (("chunked", chunk), ("unchunked", 0)):
        fn = jax.value_and_grad(loss, argnums=(0, 2)) if grad else loss
        jitted = jax.jit(lambda t, s, h, fn=fn, size=size: fn(t, s, h, size))
        programs[name] = jitted.lower(table, scale, hidden).compile(fits.compiler_options())
    times = {name: [] for name in programs}
    for r in range(rounds):
        for name in sorted(programs, reverse=bool(r % 2)):
            start = time.perf_counter()
            jax.block_until_ready(programs[name](table, scale, hidden))
            times[name].append(time.perf_counter() - start)
    ratio = float(np.median(times["chunked"]) / np.median(times["unchunked"]))
    return {"length": length, "grad": grad, "chunk": chunk, **times, "ratio": ratio}


def _chunk(value: int | None) -> str:
    return "default" if value is None else "0 (unchunked)" if value == 0 else str(value)


def table(results: list[dict[str, Any]]) -> str:
    """The results as a markdown table (GiB, seconds)."""
    gib = 2**30
    head = (
        "| length | loss_chunk | batch_tokens | rows | params | one window | planned | RSS peak "
        "| RSS / (params + window) | seconds | tokens/s |\n" + "|---" * 11 + "|"
    )
    rows = [head]
    for r in results:
        if "error" in r:
            rows.append(
                f"| {r['length']} | {r['loss_chunk']} | {r['batch_tokens']} | {r['error']} |"
            )
            continue
        ratio = r["rss_peak"] / (r["params"] + r["window"])
        rows.append(
            f"| {r['length']} | {_chunk(r['loss_chunk'])} | {r['batch_tokens'] or 'auto'} "
            f"| {r['rows']} "
            f"| {r['params'] / gib:.2f} | {r['window'] / gib:.2f} | {r['planned'] / gib:.2f} "
            f"| {r['rss_peak'] / gib:.2f} | {ratio:.2f} | {r['seconds']:.1f} "
            f"| {r['tokens'] / r['seconds']:.0f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(json.dumps(measure(Case(**json.loads(sys.argv[1])))), flush=True)


def loss_table(results: list[dict[str, Any]]) -> str:
    """:func:`loss_times` results as a markdown table (median milliseconds)."""
    import numpy as np

    rows = [
        "| length | pass | chunk (tokens) | chunked ms | unchunked ms | chunked / unchunked |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        what = "loss and gradient" if r["grad"] else "loss"
        rows.append(
            f"| {r['length']} | {what} | {r['chunk']} | {1e3 * np.median(r['chunked']):.0f} "
            f"| {1e3 * np.median(r['unchunked']):.0f} | {r['ratio']:.2f} |"
        )
    return "\n".join(rows)
