"""The measurements of one encoder: training steps and long-window scoring, FLOPs and memory.

Each function runs in the calling process; :mod:`posenc.benchmark.worker` runs them in a fresh
one where the allocator's peak must belong to one measurement.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import flax
import jax
import numpy as np
from flax import nnx

from posenc import data as data_lib
from posenc.attention.core import choose_implementation
from posenc.benchmark.settings import Settings, make_config, train_windows
from posenc.decoding.lm import layer_encodings
from posenc.devices import sharding
from posenc.kinds.stream import Scorer
from posenc.layers.params import EncoderParam
from posenc.models import build
from posenc.models.lm import Transformer
from posenc.runs.config import open_source
from posenc.runs.paths import paths_by_backend
from posenc.runs.train import Trainer

# bf16 dense peak TFLOP/s per device (datasheet figures with sparsity, halved), matched in order
# against jax.devices()[0].device_kind, e.g. "NVIDIA H100 80GB HBM3" or "NVIDIA H100 PCIe".
PEAK_TFLOPS: tuple[tuple[tuple[str, ...], float], ...] = (
    (("H100", "PCIe"), 756.0),
    (("H100", "NVL"), 835.0),
    (("H100",), 989.0),
    (("H200", "NVL"), 835.0),
    (("H200",), 989.0),
    (("A100",), 312.0),
)


def peak_tflops(device_kind: str) -> float | None:
    """bf16 dense peak TFLOP/s of one device of this kind, or None when unknown (e.g. CPU)."""
    for words, tflops in PEAK_TFLOPS:
        if all(w.lower() in device_kind.lower() for w in words):
            return tflops
    return None


def flops_per_token(matmul_params: int, num_layers: int, seq_len: int, attn_dim: int) -> float:
    """Training FLOPs per token, ``6 N + 12 L T D`` (forward and backward, PaLM App. B)."""
    return 6.0 * matmul_params + 12.0 * num_layers * seq_len * attn_dim


def compiled_memory(compiled) -> dict[str, int]:
    """XLA's compiled memory analysis: the bytes the program needs on the device ({} if none)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return {}
    if m is None:
        return {}
    total = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )
    return {
        "compiled_bytes": int(total),
        "compiled_temp_bytes": int(m.temp_size_in_bytes),
        "compiled_argument_bytes": int(m.argument_size_in_bytes),
        "compiled_output_bytes": int(m.output_size_in_bytes),
    }


def peak_bytes_in_use() -> int | None:
    """The allocator's peak over this process's life (max over local devices), None on CPU."""
    stats = [d.memory_stats() for d in jax.local_devices()]
    if not stats or any(s is None or "peak_bytes_in_use" not in s for s in stats):
        return None
    return max(int(s["peak_bytes_in_use"]) for s in stats)


def short_error(e: BaseException) -> str:
    """The first line of an error, for a table cell."""
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def probe() -> dict[str, Any]:
    """The device this process sees and whether it reports allocator statistics."""
    devices = jax.devices()
    return {
        "device_kind": devices[0].device_kind,
        "platform": devices[0].platform,
        "device_count": len(devices),
        "jax_version": jax.__version__,
        "flax_version": flax.__version__,
        "memory_stats": peak_bytes_in_use() is not None,
    }


def chosen_path(model: Transformer, length: int, impl: str) -> str:
    """The attention path ``impl`` runs at ``length``: ``"auto"``'s choice for each layer's
    encoder and options, the distinct ones joined by ``+`` where a pattern's layers differ."""
    if impl != "auto":
        return impl
    m = model.config
    paths: list[str] = []
    for block in model.blocks:
        path = choose_implementation(
            block.encoding, length, m.dtype, m.attention_block_size, options=block.options
        )
        if path not in paths:
            paths.append(path)
    return "+".join(paths)


def _matmul_params(model: Transformer) -> int:
    """Parameters used in matmuls: all but the encoders' (EncoderParam) position tables."""

    def size(variable: nnx.Variable) -> int:
        return 0 if isinstance(variable, EncoderParam) else int(variable[...].size)

    params = nnx.state(model, nnx.Param)
    sizes = jax.tree.map(size, params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return sum(jax.tree.leaves(sizes))


# -- training ---------------------------------------------------------------------------------


def measure_train(settings: Settings, encoder: str) -> tuple[dict[str, Any], Transformer]:
    """Compiles and times ``settings.steps`` training steps after ``settings.warmup`` steps.

    Returns:
      ``(row, model)``: the measurements and the model holding the trained parameters.
    """
    config, windows, trainer, state, batch = prepare_train(settings, encoder)
    t = config.train
    model = trainer.model(state)
    result: dict[str, Any] = {
        "encoder": encoder,
        "path": chosen_path(model, t.seq_len, config.model.attention_impl),
        # What auto takes on each backend at this length (posenc.runs.paths).
        "paths": paths_by_backend(model, t.seq_len),
        "seq_len": int(t.seq_len),
        "num_params": model.num_params(),
        "matmul_params": _matmul_params(model),
        "devices": int(trainer.mesh.devices.size),
    }
    del model
    start = time.perf_counter()
    # The executable Trainer.step runs: compiled and checked here, then cached for the steps.
    compiled = trainer._step.compile(state, batch)
    result["compile_s"] = time.perf_counter() - start
    result.update(compiled_memory(compiled))

    state, metrics, elapsed = _timed_steps(trainer, state, windows, settings)
    metrics = jax.device_get(metrics)
    loss = float(metrics["loss_sum"]) / float(metrics["tokens"])
    if not np.isfinite(loss):
        raise FloatingPointError(f"loss is {loss} after {settings.warmup + settings.steps} steps")
    m = config.model
    attn_dim = m.num_heads * (m.head_dim or m.model_dim // m.num_heads)
    tokens_per_step = t.batch_size * t.seq_len
    result.update(
        steps=settings.steps,
        tokens_per_step=tokens_per_step,
        seconds=elapsed,
        step_time_s=elapsed / settings.steps,
        tokens_per_s=settings.steps * tokens_per_step / elapsed,
        loss=loss,
        flops_per_token=flops_per_token(result["matmul_params"], m.num_layers, t.seq_len, attn_dim),
    )
    result["model_tflops_per_s"] = result["flops_per_token"] * result["tokens_per_s"] / 1e12
    return result, trainer.model(state)


def prepare_train(settings: Settings, encoder: str):
    """What :func:`measure_train` compiles and times: ``(config, windows, trainer, state,
    batch)``, the batch step 0's, placed as the trainer places it."""
    config = make_config(settings, encoder)
    windows = train_windows(config)
    trainer = Trainer(config)
    state = trainer.init_state()
    return config, windows, trainer, state, trainer.global_batch(windows.batch(0))


def compile_train(settings: Settings, encoder: str) -> None:
    """Compiles :func:`measure_train`'s step and runs nothing: with a persistent compilation
    cache (``JAX_COMPILATION_CACHE_DIR``), another process's measurement then loads it."""
    _, _, trainer, state, batch = prepare_train(settings, encoder)
    trainer._step.compile(state, batch)


def compile_eval(settings: Settings, encoder: str, lengths: Sequence[int]) -> None:
    """Compiles :func:`measure_eval`'s scoring program at each length it can score, running
    nothing (see :func:`compile_train`)."""
    config = make_config(settings, encoder)
    stream = open_source(config).split_stream("validation")
    model = build(config)
    scorer = Scorer(model, sharding.make_mesh(devices=jax.local_devices()[:1]))
    for length in lengths:
        try:
            for _, encoding in layer_encodings(model):
                encoding.check_length(length)
        except ValueError:
            continue
        _, batch = _window_batch(scorer, stream, length)
        scorer._score.compile(scorer.state, batch)


def _timed_steps(trainer: Trainer, state, windows: data_lib.TrainWindows, settings: Settings):
    """Runs the warm-up steps, then times the steady-state ones (host batching included).

    Returns:
      ``(state, metrics, seconds)``: the state and metrics after the last step, and the seconds
      the timed steps took up to ``jax.block_until_ready``.
    """
    step = 0
    for _ in range(settings.warmup):
        state, metrics = trainer.step(state, trainer.global_batch(windows.batch(step)))
        step += 1
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(settings.steps):
        state, metrics = trainer.step(state, trainer.global_batch(windows.batch(step)))
        step += 1
    jax.block_until_ready((state, metrics))
    return state, metrics, time.perf_counter() - start


# -- evaluation -------------------------------------------------------------------------------


def measure_eval(
    settings: Settings,
    encoder: str,
    lengths: Sequence[int],
    model: Transformer | None = None,
) -> list[dict[str, Any]]:
    """Compiles and times scoring one window (batch 1) at each length; errors per length.

    ``model``: the model to score with (default: freshly initialised; timing and memory do not
    depend on the parameter values).
    """
    config = make_config(settings, encoder)
    stream = open_source(config).split_stream("validation")
    model = model or build(config)
    # One window on one device: a batch of 1 cannot be split over a mesh.
    mesh = sharding.make_mesh(devices=jax.local_devices()[:1])
    scorer = Scorer(model, mesh)
    results = []
    for length in lengths:
        entry: dict[str, Any] = {"encoder": encoder, "length": int(length)}
        results.append(entry)
        try:
            for _, encoding in layer_encodings(model):
                encoding.check_length(length)
            entry["path"] = chosen_path(model, length, config.model.attention_impl)
            entry["paths"] = paths_by_backend(model, length)
            _time_one_window(entry, scorer, stream, settings.eval_repeats)
        except Exception as e:  # noqa: BLE001 - reported per length (e.g. out of memory)
            entry["error"] = short_error(e)
    return results


def _window_batch(scorer: Scorer, stream, length: int):
    """The first window of ``length`` tokens, and its batch of one placed as the scorer reads
    it: ``(windows, batch)``."""
    windows = data_lib.eval_windows(stream, length, max_windows=1)
    local = next(windows.iter_batches(1))
    batch = {
        k: jax.make_array_from_process_local_data(scorer.batch_sharding, v)
        for k, v in local.items()
    }
    return windows, batch


def _time_one_window(entry: dict[str, Any], scorer: Scorer, stream, repeats: int) -> None:
    """Adds compile time, memory, the median seconds of ``repeats`` runs, tokens/s and loss.

    Fills ``entry`` in place, so that what was measured before an error stays in the row.
    """
    windows, batch = _window_batch(scorer, stream, entry["length"])
    start = time.perf_counter()
    # The executable Scorer.score runs: compiled and checked here, then cached for its calls.
    compiled = scorer._score.compile(scorer.state, batch)
    entry["compile_s"] = time.perf_counter() - start
    entry.update(compiled_memory(compiled))
    scorer.score(windows, 1)  # first run
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss_sum, count = scorer.score(windows, 1)  # fetched to the host: synchronous
        times.append(time.perf_counter() - start)
    entry["seconds"] = statistics.median(times)
    entry["tokens_per_s"] = entry["length"] / entry["seconds"]
    entry["loss"] = float(loss_sum.sum() / count.sum())
    if not np.isfinite(entry["loss"]):
        raise FloatingPointError(f"loss is {entry['loss']}")
