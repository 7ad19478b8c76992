"""A whole benchmark run: every encoder's measurements, in this process or in workers, and MFU.

:func:`run` returns ``{"meta": ..., "train": [...], "eval": [...]}``; the device and settings in
``meta`` are what the report's header shows.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from typing import Any

from posenc.benchmark.measure import measure_eval, measure_train, peak_tflops, probe, short_error
from posenc.benchmark.settings import SIZES, Settings, make_config
from posenc.benchmark.worker import run_in_worker

MEMORY_SOURCES = {
    "peak_bytes_in_use": "memory_stats()['peak_bytes_in_use'] of a fresh process per measurement",
    "compiled": "XLA compiled memory analysis (arguments + outputs - aliased + temporaries)",
}


def run(settings: Settings) -> dict[str, Any]:
    """All measurements of a run: ``{"meta": ..., "train": [...], "eval": [...]}``."""
    device, isolate = _device(settings)
    load_before = _load_average()
    train_rows, eval_rows = [], []
    for encoder in settings.encoders:
        train, evals = _measure_encoder(settings, encoder, isolate)
        train_rows.append(train)
        eval_rows += evals

    peak = settings.peak_tflops or peak_tflops(device["device_kind"])
    if device["platform"] == "cpu" and not settings.peak_tflops:
        peak = None
    for row in train_rows:
        if peak and "tokens_per_s" in row:
            row["mfu"] = row["model_tflops_per_s"] / (peak * row["devices"])
    sources = set()
    for row in train_rows + eval_rows:
        if "error" not in row:
            _set_memory(row)
            sources.add(row["memory_source"])
    meta = _meta(settings, device, isolate, peak, sources, [load_before, _load_average()])
    return {"meta": meta, "train": train_rows, "eval": eval_rows}


def _device(settings: Settings) -> tuple[dict[str, Any], bool]:
    """The device (:func:`~posenc.benchmark.measure.probe`) and whether to isolate measurements."""
    if settings.isolate == "auto":
        # Ask a fresh process, so that this one never holds a GPU the workers need.
        device = run_in_worker(settings, "probe")
        if "error" in device:
            raise RuntimeError(f"could not start JAX: {device['error']}")
        return device, device["memory_stats"]
    if settings.isolate == "always":
        return run_in_worker(settings, "probe"), True
    return probe(), False


def _measure_encoder(
    settings: Settings, encoder: str, isolate: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One encoder's training row and evaluation rows; failures are rows with an ``error``."""
    lengths = settings.eval_lengths
    _log(f"{encoder}: training")
    model = None
    if isolate:
        row = run_in_worker(settings, "train", encoder)
    else:
        try:
            row, model = measure_train(settings, encoder)
        except Exception as e:  # noqa: BLE001 - reported in the table
            row = {"error": short_error(e)}
    train = {"encoder": encoder, **row}
    _log(f"{encoder}: evaluation at {list(lengths)}")
    if isolate:
        evals = []
        for length in lengths:
            row = run_in_worker(settings, "eval", encoder, length)
            evals.append({"encoder": encoder, "length": length, **row})
        return train, evals
    try:
        return train, measure_eval(settings, encoder, lengths, model)
    except Exception as e:  # noqa: BLE001
        return train, [{"encoder": encoder, "length": n, "error": short_error(e)} for n in lengths]


def _meta(
    settings: Settings,
    device: dict[str, Any],
    isolate: bool,
    peak: float | None,
    memory_sources: set[str],
    load_average: list[float | None],
) -> dict[str, Any]:
    """The report's header: date, device, host, versions and the run's settings."""
    encoders = settings.encoders
    config = make_config(settings, encoders[0] if encoders else "rope")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **device,
        "host": platform.node(),
        "host_cpus": os.cpu_count(),
        # Other work on the host skews CPU timings; the 1-minute load average says how much.
        "load_average_1min": load_average,
        "python": platform.python_version(),
        "size": settings.size,
        "model": config.model.to_dict(),
        "train": {"seq_len": config.train.seq_len, "batch_size": config.train.batch_size},
        "optimizer": "AdamW (posenc.runs.train.make_optimizer)",
        "steps": settings.steps,
        "warmup": settings.warmup,
        "eval_lengths": list(settings.eval_lengths),
        "eval_repeats": settings.eval_repeats,
        "attention_impl": settings.attention_impl,
        "data": settings.data,
        "peak_tflops_per_device": peak,
        "flops_per_token": "6 N + 12 L T D (N: matmul parameters, L: layers, T: train length, "
        "D: heads x head dim)",
        "memory_source": "; ".join(MEMORY_SOURCES[s] for s in sorted(memory_sources)) or "-",
        "isolated": isolate,
        "default_eval_lengths": list(SIZES[settings.size]["eval_lengths"]),
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
