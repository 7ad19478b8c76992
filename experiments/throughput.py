"""Training throughput, model FLOP utilisation and memory, and long-window evaluation cost.

For each encoder, at one model size, measures what a user runs:

- training with :class:`posenc.train.Trainer` (the jitted AdamW step, batches built by
  :class:`posenc.data.TrainWindows` and sharded by ``Trainer.global_batch``): compile time, then
  ``--steps`` steady-state steps after ``--warmup`` steps, timed with ``jax.block_until_ready``;
  tokens/s, step time, MFU and peak memory;
- evaluation with :class:`posenc.evaluate.Scorer` of one window (batch 1) at each of
  ``--eval-lengths``, with the model's ``attention_impl`` (``auto`` picks the blocked path or
  cuDNN for long windows): compile time, steady-state seconds, tokens/s and peak memory.

MFU = model FLOPs per token x tokens/s / (peak FLOP/s per device x devices), with model FLOPs
per training token ``6 N + 12 L T D`` (PaLM, Chowdhery et al. 2022, App. B): ``N`` the parameters
used in matmuls (tied embedding counted once, positional tables excluded), ``L`` layers, ``T``
the training length, ``D`` the attention width (heads x head dim). Encoder-specific work (T5 and
ALiBi biases, Shaw's and Transformer-XL's relative logits) is not counted, so it shows as lower
MFU. Peak FLOP/s: bf16 dense from :data:`PEAK_TFLOPS` by device kind, or ``--peak-tflops``.

Peak memory: on devices with allocator statistics (GPU, TPU) each measurement runs in a fresh
process (``--isolate auto``) and reports ``memory_stats()['peak_bytes_in_use']``; XLA's compiled
memory analysis (arguments + outputs - aliased + temporaries of the jitted program) is reported
everywhere and is the figure shown on CPU.

    python experiments/throughput.py --size small --out runs/throughput          # GPU
    python experiments/throughput.py --size cpu --out runs/throughput_cpu        # seconds on CPU

Writes ``throughput_<size>.json`` and ``throughput_<size>.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

# Model sizes. "small" is the reference setting (configs/base.py); "cpu" runs in seconds.
SIZES: dict[str, dict[str, Any]] = {
    "cpu": {
        "model": dict(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32"),
        "train": dict(seq_len=128, batch_size=8),
        "eval_lengths": (256, 1024, 4096),
    },
    "small": {
        "model": dict(num_layers=6, model_dim=512, num_heads=8, mlp_dim=2048, dtype="bfloat16"),
        "train": dict(seq_len=512, batch_size=64),
        "eval_lengths": (1024, 4096, 16384, 32768),
    },
    "gpt2": {
        "model": dict(num_layers=12, model_dim=768, num_heads=12, mlp_dim=3072, dtype="bfloat16"),
        "train": dict(seq_len=1024, batch_size=32),
        "eval_lengths": (1024, 4096, 16384, 32768),
    },
}

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

_GIB = 2.0**30
_BASE_CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "base.py"


def peak_tflops(device_kind: str) -> float | None:
    """bf16 dense peak TFLOP/s of one device of this kind, or None when unknown (e.g. CPU)."""
    for words, tflops in PEAK_TFLOPS:
        if all(w.lower() in device_kind.lower() for w in words):
            return tflops
    return None


def flops_per_token(matmul_params: int, num_layers: int, seq_len: int, attn_dim: int) -> float:
    """Training FLOPs per token, ``6 N + 12 L T D`` (forward and backward, PaLM App. B)."""
    return 6.0 * matmul_params + 12.0 * num_layers * seq_len * attn_dim


# -- measurements (run in this process or in a worker process) --------------------------------


def make_config(args: argparse.Namespace, encoder: str):
    """The run config of one encoder at ``args.size`` (configs/base.py plus the size)."""
    from posenc.config import load_config

    size = SIZES[args.size]
    config = load_config(str(_BASE_CONFIG))
    config.model.update(size["model"])
    config.train.update(size["train"])
    if args.dtype:
        config.model.dtype = args.dtype
    if args.batch_size:
        config.train.batch_size = args.batch_size
    config.model.attention_impl = args.attention_impl
    config.encoding.name = encoder
    config.data.source = args.data
    config.data.data_dir = args.data_dir
    config.train.steps = args.warmup + args.steps + 1  # only shapes the learning-rate schedule
    config.optim.warmup_steps = 1
    return config


def _memory(compiled) -> dict[str, int] | None:
    """XLA's compiled memory analysis: the bytes the program needs on the device."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if m is None:
        return None
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


def _peak_bytes_in_use() -> int | None:
    import jax

    stats = [d.memory_stats() for d in jax.local_devices()]
    if not stats or any(s is None or "peak_bytes_in_use" not in s for s in stats):
        return None
    return max(int(s["peak_bytes_in_use"]) for s in stats)


def _chosen_path(model, length: int, impl: str) -> str:
    from posenc.attention import choose_implementation

    if impl != "auto":
        return impl
    m = model.config
    return choose_implementation(model.encoding, length, m.dtype, m.attention_block_size)


def _matmul_params(model) -> int:
    """Parameters used in matmuls: all but the encoders' position tables."""
    import jax
    from flax import nnx

    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        if not any("pos_params" in str(getattr(p, "key", p)) for p in path):
            total += int(leaf.size)
    return total


def measure_train(args: argparse.Namespace, encoder: str):
    """Compiles and times ``args.steps`` training steps after ``args.warmup`` steps.

    Returns:
      ``(row, model)``: the measurements and the model holding the trained parameters.
    """
    import jax
    import numpy as np

    from posenc import data as data_lib
    from posenc.config import open_source
    from posenc.train import Trainer

    config = make_config(args, encoder)
    t = config.train
    stream = open_source(config).split_stream("train")
    windows = data_lib.TrainWindows(stream, t.seq_len, t.batch_size, seed=config.seed)
    trainer = Trainer(config)
    state = trainer.init_state()
    model = trainer.model(state)
    result: dict[str, Any] = {
        "encoder": encoder,
        "path": _chosen_path(model, t.seq_len, config.model.attention_impl),
        "num_params": model.num_params(),
        "matmul_params": _matmul_params(model),
        "devices": int(trainer.mesh.devices.size),
    }
    del model
    batch = trainer.global_batch(windows.batch(0))
    start = time.perf_counter()
    # The jitted step Trainer.step calls: the compiled program is cached and reused by it.
    compiled = trainer._step.lower(state, batch).compile()
    result["compile_s"] = time.perf_counter() - start
    result.update(_memory(compiled) or {})

    step = 0
    for _ in range(args.warmup):
        state, metrics = trainer.step(state, trainer.global_batch(windows.batch(step)))
        step += 1
    jax.block_until_ready(state)
    start = time.perf_counter()
    for _ in range(args.steps):
        state, metrics = trainer.step(state, trainer.global_batch(windows.batch(step)))
        step += 1
    jax.block_until_ready((state, metrics))
    elapsed = time.perf_counter() - start

    metrics = jax.device_get(metrics)
    tokens_per_step = t.batch_size * t.seq_len
    loss = float(metrics["loss_sum"]) / float(metrics["tokens"])
    if not np.isfinite(loss):
        raise FloatingPointError(f"loss is {loss} after {step} steps")
    m = config.model
    attn_dim = m.num_heads * (m.head_dim or m.model_dim // m.num_heads)
    result.update(
        steps=args.steps,
        tokens_per_step=tokens_per_step,
        seconds=elapsed,
        step_time_s=elapsed / args.steps,
        tokens_per_s=args.steps * tokens_per_step / elapsed,
        loss=loss,
        flops_per_token=flops_per_token(result["matmul_params"], m.num_layers, t.seq_len, attn_dim),
    )
    result["model_tflops_per_s"] = result["flops_per_token"] * result["tokens_per_s"] / 1e12
    return result, trainer.model(state)


def measure_eval(
    args: argparse.Namespace, encoder: str, lengths: Sequence[int], model=None
) -> list[dict]:
    """Compiles and times scoring one window (batch 1) at each length; errors per length.

    ``model``: the model to score with (default: freshly initialised; timing and memory do not
    depend on the parameter values).
    """
    import jax
    import numpy as np

    from posenc import data as data_lib
    from posenc.config import build_model, open_source
    from posenc.evaluate import Scorer

    config = make_config(args, encoder)
    stream = open_source(config).split_stream("validation")
    model = model or build_model(config)
    # One window on one device: a batch of 1 cannot be split over a mesh.
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:1]), ("data",))
    scorer = Scorer(model, mesh)
    results = []
    for length in lengths:
        entry: dict[str, Any] = {"encoder": encoder, "length": int(length)}
        results.append(entry)
        try:
            model.encoding.check_length(length)
            entry["path"] = _chosen_path(model, length, config.model.attention_impl)
            windows = data_lib.eval_windows(stream, length, max_windows=1)
            local = next(windows.iter_batches(1))
            batch = {
                k: jax.make_array_from_process_local_data(scorer.batch_sharding, v)
                for k, v in local.items()
            }
            start = time.perf_counter()
            # The jitted function Scorer.score calls; its compiled program is reused there.
            compiled = scorer._score.lower(scorer.state, batch).compile()
            entry["compile_s"] = time.perf_counter() - start
            entry.update(_memory(compiled) or {})
            scorer.score(windows, 1)  # first run
            times = []
            for _ in range(args.eval_repeats):
                start = time.perf_counter()
                loss_sum, count = scorer.score(windows, 1)  # fetched to the host: synchronous
                times.append(time.perf_counter() - start)
            entry["seconds"] = statistics.median(times)
            entry["tokens_per_s"] = length / entry["seconds"]
            entry["loss"] = float(loss_sum.sum() / count.sum())
            if not np.isfinite(entry["loss"]):
                raise FloatingPointError(f"loss is {entry['loss']}")
        except Exception as e:  # noqa: BLE001 - reported per length (e.g. out of memory)
            entry["error"] = _short_error(e)
    return results


def _short_error(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def probe() -> dict[str, Any]:
    """The device this process sees and whether it reports allocator statistics."""
    import flax
    import jax

    devices = jax.devices()
    return {
        "device_kind": devices[0].device_kind,
        "platform": devices[0].platform,
        "device_count": len(devices),
        "jax_version": jax.__version__,
        "flax_version": flax.__version__,
        "memory_stats": _peak_bytes_in_use() is not None,
    }


def run_task(args: argparse.Namespace, task: str, encoder: str | None, length: int | None):
    """One measurement; with ``isolated``, the process peak is this measurement's peak."""
    if task == "probe":
        return probe()
    if task == "train":
        out, _ = measure_train(args, encoder)
        out["peak_bytes_in_use"] = _peak_bytes_in_use()
        return out
    out = measure_eval(args, encoder, [length])[0]
    out["peak_bytes_in_use"] = _peak_bytes_in_use()
    return out


# -- orchestration ----------------------------------------------------------------------------


def _in_worker(argv: Sequence[str], task: str, encoder: str | None, length: int | None, timeout):
    """Runs one task in a fresh Python process; failures come back as ``{"error": ...}``."""
    out = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"posenc_throughput_{os.getpid()}.json"
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker-task", task]
    cmd += ["--worker-out", str(out)]
    if encoder:
        cmd += ["--worker-encoder", encoder]
    if length:
        cmd += ["--worker-length", str(length)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode < 0:
        return {"error": f"worker killed by signal {-proc.returncode} (out of host memory?)"}
    if proc.returncode != 0 or not out.exists():
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        # The most informative line of a JAX failure names the error (e.g. RESOURCE_EXHAUSTED).
        named = [ln for ln in lines if "Error" in ln or "RESOURCE_EXHAUSTED" in ln]
        detail = (named or lines or [f"exit status {proc.returncode}"])[-1]
        return {"error": f"worker exited with {proc.returncode}: {detail.strip()[:300]}"}
    result = json.loads(out.read_text())
    out.unlink()
    return result


def run(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """All measurements of a run: ``{"meta": ..., "train": [...], "eval": [...]}``."""
    encoders = args.encoders
    lengths = args.eval_lengths
    device = None
    isolate = args.isolate == "always"
    if args.isolate == "auto":
        # Ask a fresh process, so that this one never holds a GPU the workers need.
        device = _in_worker(argv, "probe", None, None, args.timeout)
        if "error" in device:
            raise RuntimeError(f"could not start JAX: {device['error']}")
        isolate = device["memory_stats"]
    if not isolate and device is None:
        device = probe()
    elif device is None:
        device = _in_worker(argv, "probe", None, None, args.timeout)

    load_before = _load_average()
    train_rows, eval_rows = [], []
    for encoder in encoders:
        _log(f"{encoder}: training")
        model = None
        if isolate:
            row = _in_worker(argv, "train", encoder, None, args.timeout)
        else:
            try:
                row, model = measure_train(args, encoder)
            except Exception as e:  # noqa: BLE001 - reported in the table
                row = {"error": _short_error(e)}
        train_rows.append({"encoder": encoder, **row})
        _log(f"{encoder}: evaluation at {list(lengths)}")
        if isolate:
            for length in lengths:
                row = _in_worker(argv, "eval", encoder, length, args.timeout)
                eval_rows.append({"encoder": encoder, "length": length, **row})
        else:
            try:
                eval_rows += measure_eval(args, encoder, lengths, model)
            except Exception as e:  # noqa: BLE001
                eval_rows += [
                    {"encoder": encoder, "length": n, "error": _short_error(e)} for n in lengths
                ]

    size = SIZES[args.size]
    config = make_config(args, encoders[0] if encoders else "rope")
    peak = args.peak_tflops or peak_tflops(device["device_kind"])
    if device["platform"] == "cpu" and not args.peak_tflops:
        peak = None
    for row in train_rows:
        if peak and "tokens_per_s" in row:
            row["mfu"] = row["model_tflops_per_s"] / (peak * row["devices"])
    sources = set()
    for row in train_rows + eval_rows:
        if "error" not in row:
            _set_memory(row)
            sources.add(row["memory_source"])
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **device,
        "host": platform.node(),
        "host_cpus": os.cpu_count(),
        # Other work on the host skews CPU timings; the 1-minute load average says how much.
        "load_average_1min": [load_before, _load_average()],
        "python": platform.python_version(),
        "size": args.size,
        "model": config.model.to_dict(),
        "train": {"seq_len": config.train.seq_len, "batch_size": config.train.batch_size},
        "optimizer": "AdamW (posenc.train.make_optimizer)",
        "steps": args.steps,
        "warmup": args.warmup,
        "eval_lengths": list(lengths),
        "eval_repeats": args.eval_repeats,
        "attention_impl": args.attention_impl,
        "data": args.data,
        "peak_tflops_per_device": peak,
        "flops_per_token": "6 N + 12 L T D (N: matmul parameters, L: layers, T: train length, "
        "D: heads x head dim)",
        "memory_source": "; ".join(MEMORY_SOURCES[s] for s in sorted(sources)) or "-",
        "isolated": isolate,
        "default_eval_lengths": list(size["eval_lengths"]),
    }
    return {"meta": meta, "train": train_rows, "eval": eval_rows}


MEMORY_SOURCES = {
    "peak_bytes_in_use": "memory_stats()['peak_bytes_in_use'] of a fresh process per measurement",
    "compiled": "XLA compiled memory analysis (arguments + outputs - aliased + temporaries)",
}


def _set_memory(row: dict[str, Any]) -> None:
    """``memory_bytes``: the allocator's peak where measured, else the compiled estimate."""
    if row.get("peak_bytes_in_use") is not None:
        row["memory_bytes"], row["memory_source"] = row["peak_bytes_in_use"], "peak_bytes_in_use"
    else:
        row["memory_bytes"], row["memory_source"] = row.get("compiled_bytes"), "compiled"


def _load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _log(text: str) -> None:
    print(f"[throughput] {text}", file=sys.stderr, flush=True)


# -- report -----------------------------------------------------------------------------------


def _bytes(row: dict[str, Any]) -> str:
    value = row.get("memory_bytes")
    if value is None:
        return "-"
    return f"{value / _GIB:.2f} GiB" if value >= _GIB else f"{value / 2**20:.1f} MiB"


def _cell_error(row: dict[str, Any]) -> str:
    """The error's first clause (the JSON keeps all of it)."""
    return "error: " + row["error"].split("; ")[0].replace("|", "/")[:200]


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: a header with device and settings, a training and an eval table."""
    meta = report["meta"]
    m = meta["model"]
    lines = [
        f"# Throughput and memory: size `{meta['size']}`",
        "",
        f"- date: {meta['date']}; device: {meta['device_count']} x {meta['device_kind']} "
        f"({meta['platform']}); host: {meta['host']}, {meta['host_cpus']} CPUs, 1-min load "
        f"average {meta['load_average_1min'][0]} at start, {meta['load_average_1min'][1]} at end",
        f"- jax {meta['jax_version']}, flax {meta['flax_version']}, python {meta['python']}",
        f"- model: {m['num_layers']} layers, width {m['model_dim']}, {m['num_heads']} heads, "
        f"MLP {m['mlp_dim']}, vocab {m['vocab_size']}, {m['dtype']}; train length "
        f"{meta['train']['seq_len']}, batch {meta['train']['batch_size']}, "
        f"{meta['optimizer']}",
        f"- timing: {meta['warmup']} warm-up steps, then {meta['steps']} timed steps; eval: "
        f"one window, batch 1, median of {meta['eval_repeats']}; attention_impl "
        f"`{meta['attention_impl']}`; data `{meta['data']}`",
        f"- MFU: model FLOPs per token {meta['flops_per_token']}; peak "
        + (
            f"{meta['peak_tflops_per_device']} TFLOP/s per device (bf16 dense)"
            if meta["peak_tflops_per_device"]
            else "unknown for this device (MFU omitted; give --peak-tflops)"
        ),
        f"- memory: {meta['memory_source']}",
        "",
        "| encoder | path | tokens/s | step (ms) | MFU | model TFLOP/s | memory "
        "| compile (s) | loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["train"]:
        if "error" in row:
            lines.append(f"| {row['encoder']} | {_cell_error(row)} | | | | | | | |")
            continue
        mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
        lines.append(
            f"| {row['encoder']} | {row['path']} | {row['tokens_per_s']:,.0f} | "
            f"{1e3 * row['step_time_s']:.1f} | {mfu} | {row['model_tflops_per_s']:.3g} | "
            f"{_bytes(row)} | {row['compile_s']:.1f} | {row['loss']:.3f} |"
        )
    lines += [
        "",
        "Evaluation of one window (batch 1):",
        "",
        "| encoder | length | path | seconds | tokens/s | memory | compile (s) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in report["eval"]:
        if "error" in row:
            lines.append(f"| {row['encoder']} | {row['length']} | {_cell_error(row)} | | | | |")
            continue
        lines.append(
            f"| {row['encoder']} | {row['length']} | {row['path']} | {row['seconds']:.3f} | "
            f"{row['tokens_per_s']:,.0f} | {_bytes(row)} | {row['compile_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


# -- command line -----------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from posenc import encodings
    from posenc.attention import IMPLEMENTATIONS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--encoders", default=",".join(encodings.names()), help="comma-separated encoder names"
    )
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    parser.add_argument(
        "--eval-lengths", default=None, help="comma-separated window lengths (default by size)"
    )
    parser.add_argument("--eval-repeats", type=int, default=3, help="timed runs per length")
    parser.add_argument("--attention-impl", choices=IMPLEMENTATIONS, default="auto")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="override the size's batch")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per-device peak")
    parser.add_argument("--data", default="pystdlib", help="data.source of the windows")
    parser.add_argument("--data-dir", default=None, help="data.data_dir")
    parser.add_argument(
        "--isolate",
        choices=("auto", "always", "never"),
        default="auto",
        help="one process per measurement (auto: where the device reports peak memory)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    parser.add_argument("--out", default="runs/throughput", help="output directory")
    for name in ("task", "encoder", "length", "out"):  # internal: worker processes
        parser.add_argument(f"--worker-{name}", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.encoders = [e for e in args.encoders.split(",") if e]
    unknown = sorted(set(args.encoders) - set(encodings.names()))
    if unknown:
        parser.error(f"unknown encoders {unknown}; known: {', '.join(encodings.names())}")
    text = args.eval_lengths
    lengths = SIZES[args.size]["eval_lengths"] if text is None else text.split(",")
    args.eval_lengths = [int(x) for x in lengths if str(x).strip()]
    if args.steps < 1 or args.warmup < 0 or args.eval_repeats < 1:
        parser.error("--steps and --eval-repeats must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse_args(argv)
    if args.worker_task:
        length = int(args.worker_length) if args.worker_length else None
        result = run_task(args, args.worker_task, args.worker_encoder, length)
        pathlib.Path(args.worker_out).write_text(json.dumps(result))
        return result
    report = run(args, argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"throughput_{args.size}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (out / f"{stem}.md").write_text(text)
    print(text)
    return report


if __name__ == "__main__":
    main()
