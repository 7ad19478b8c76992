"""Interleaved timing: every encoder once per round, many rounds, medians, spreads and ratios.

A shared machine's speed drifts by up to 2x over minutes (other processes, frequency scaling),
so timing encoder A for a minute and then encoder B compares the machine's moods as much as the
encoders. Here every measurement is compiled first; then each *round* times every encoder once
(training steps and one window at each evaluation length), in an order rotated every round, so
that each encoder meets each slot of a round equally often, figure by figure (the encoders
compared in one figure are timed close together); each slot keeps the fastest of
``eval_repeats`` back-to-back runs (interference only ever adds time):

    round 0: A B C    round 1: B C A    round 2: C A B    ...

Per encoder and figure the report gives the median over rounds and its spread (min and max),
and the ratio to the baseline encoder (NoPE) *within each round*, whose median and spread are
what to compare across runs, machines and branches (absolute seconds only within one run). The
1-minute load average is recorded per round, with the thread settings of the process.

:func:`run_rounds` returns ``{"meta": ..., "rows": [...]}``; :func:`markdown` renders it.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from posenc import data as data_lib
from posenc.benchmark import peer as peer_lib
from posenc.benchmark.measure import chosen_path, short_error
from posenc.benchmark.settings import Settings, make_config, train_windows
from posenc.decoding.lm import layer_encodings
from posenc.devices import sharding
from posenc.kinds.stream import Scorer
from posenc.models import build
from posenc.runs.config import open_source
from posenc.runs.train import Trainer
from posenc.workdir import write_json

# Environment variables that set how many threads XLA and BLAS use.
THREAD_VARIABLES = ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class _Train:
    """One encoder's compiled training step, its state and its batches."""

    def __init__(self, settings: Settings, encoder: str):
        config = make_config(settings, encoder)
        t = config.train
        self.windows = train_windows(config)
        self.trainer = Trainer(config)
        self.state = self.trainer.init_state()
        self.tokens = t.batch_size * t.seq_len
        self.step = 0
        self.time(settings.warmup + 1)  # compiles, then warms up

    def time(self, steps: int) -> float:
        """Seconds of ``steps`` training steps, host batching included."""
        jax.block_until_ready(self.state)
        start = time.perf_counter()
        for _ in range(steps):
            batch = self.trainer.global_batch(self.windows.batch(self.step))
            self.state, metrics = self.trainer.step(self.state, batch)
            self.step += 1
        jax.block_until_ready((self.state, metrics))
        return time.perf_counter() - start


class _Eval:
    """One encoder's compiled scorer of ``rows`` windows (one batch) at one length; ``config``
    replaces the encoder's at ``settings`` (a window or a layer pattern:
    :mod:`posenc.benchmark.windows`)."""

    def __init__(
        self,
        settings: Settings,
        encoder: str,
        length: int,
        config: Any = None,
        rows: int = 1,
    ):
        config = make_config(settings, encoder) if config is None else config
        # Freshly initialised: timing does not depend on the parameter values, and the training
        # step donates (deletes) the trained ones every round.
        model = build(config)
        for _, encoding in layer_encodings(model):
            encoding.check_length(length)
        mesh = sharding.make_mesh(devices=jax.local_devices()[:1])
        self.scorer = Scorer(model, mesh)
        stream = open_source(config).split_stream("validation")
        self.windows = data_lib.eval_windows(stream, length, max_windows=rows)
        if self.windows.num_windows < rows:
            raise ValueError(f"the validation split has fewer than {rows} windows of {length}")
        self.rows = rows
        m = config.model
        self.path = chosen_path(model, length, m.attention_impl)
        self.time()  # compiles and runs once

    def time(self) -> float:
        """Seconds to score the window (the sums are fetched to the host: synchronous)."""
        start = time.perf_counter()
        loss_sum, _ = self.scorer.score(self.windows, self.rows)
        np.asarray(loss_sum)
        return time.perf_counter() - start


def run_rounds(
    settings: Settings,
    rounds: int,
    baseline: str = "nope",
    train: bool = True,
    peer: bool = False,
) -> dict[str, Any]:
    """Compiles every encoder's measurements, then times them in ``rounds`` interleaved rounds.

    Args:
      settings: the run (``size``, ``encoders``, ``steps`` per timed training figure,
        ``warmup``, ``eval_lengths``, ``attention_impl``, ...); ``isolate`` is ignored (one
        process holds every encoder, so that they share each round's machine).
      rounds: timed rounds (>= 2 for a spread).
      baseline: the encoder the ratios divide by; measured in every round.
      train: also time ``settings.steps`` training steps per encoder and round.
      peer: with ``train``, also time the hand-written JAX network's training step
        (:mod:`posenc.benchmark.peer`) in every round, as a row of its own.

    Returns:
      ``{"meta": ..., "rows": [...]}``, one row per encoder and figure (``"train"`` or an
      evaluation length) with the per-round ``seconds``, their ``median``, ``min``, ``max``, and
      the per-round ratios to the baseline with theirs.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    encoders = list(dict.fromkeys([baseline, *settings.encoders]))
    figures: dict[tuple[str, Any], Any] = {}
    paths: dict[tuple[str, Any], str] = {}
    errors: dict[str, str] = {}
    for encoder in encoders:
        _log(f"{encoder}: compiling")
        trained = _Train(settings, encoder) if train else None
        if train:
            figures[encoder, "train"] = lambda t=trained: t.time(settings.steps)
            paths[encoder, "train"] = "step"
        for length in settings.eval_lengths:
            try:
                scorer = _Eval(settings, encoder, length)
            except Exception as e:  # noqa: BLE001 - reported, e.g. a learned table too short
                errors[f"{encoder} at {length}"] = short_error(e)
                if encoder == baseline:
                    raise
                continue
            figures[encoder, length] = scorer.time
            paths[encoder, length] = scorer.path
    if peer and train:
        _log(f"{peer_lib.NAME}: compiling")
        peer_train = peer_lib.PeerTrain(settings)
        figures[peer_lib.NAME, "train"] = lambda: peer_train.time(settings.steps)
        paths[peer_lib.NAME, "train"] = "step"
        encoders.append(peer_lib.NAME)
    seconds, loads = time_rounds(figures, encoders, rounds, settings.eval_repeats)
    rows = summarise(seconds, baseline)
    for row in rows:
        row["path"] = paths[row["encoder"], row["figure"]]
    return {"meta": _meta(settings, rounds, baseline, loads), "rows": rows, "errors": errors}


def time_rounds(
    figures: dict[tuple[str, Any], Callable[[], float]],
    encoders: list[str],
    rounds: int,
    repeats: int,
) -> tuple[dict[tuple[str, Any], list[float]], list[float | None]]:
    """Times every ``(encoder, figure)`` once per round, figure by figure (so that the encoders
    compared in one figure are timed close together), the encoders in an order rotated every
    round; each slot keeps the fastest of ``repeats`` back-to-back calls (interference only ever
    adds time). ``figures`` maps ``(encoder, figure)`` to a call returning seconds.

    Returns:
      ``({(encoder, figure): [seconds per round]}, [1-minute load average per round and once
      after the last])``.
    """
    seconds: dict[tuple[str, Any], list[float]] = {key: [] for key in figures}
    names = list(dict.fromkeys(figure for _, figure in figures))
    loads = []
    for r in range(rounds):
        order = encoders[r % len(encoders) :] + encoders[: r % len(encoders)]
        loads.append(_load_average())
        for figure in names:
            for encoder in order:
                if (encoder, figure) in figures:
                    fn = figures[encoder, figure]
                    seconds[encoder, figure].append(min(fn() for _ in range(repeats)))
        _log(f"round {r + 1}/{rounds} done (load {loads[-1]})")
    loads.append(_load_average())
    return seconds, loads


def summarise(seconds: dict[tuple[str, Any], list[float]], baseline: str) -> list[dict[str, Any]]:
    """One row per ``(encoder, figure)``: its seconds per round, their median, min and max, and
    the same of its ratio to ``baseline``'s seconds *in the same round* (what to compare across
    runs: a slow round slows both)."""
    rows = []
    for (encoder, figure), times in seconds.items():
        ratios = [a / b for a, b in zip(times, seconds[baseline, figure], strict=True)]
        rows.append(
            {
                "encoder": encoder,
                "figure": figure,
                "seconds": times,
                **_spread("", times),
                **_spread("ratio_", ratios),
            }
        )
    return rows


def _spread(prefix: str, values: list[float]) -> dict[str, float]:
    return {
        f"{prefix}median": statistics.median(values),
        f"{prefix}min": min(values),
        f"{prefix}max": max(values),
    }


def _meta(settings: Settings, rounds: int, baseline: str, loads: list) -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        affinity = None
    config = make_config(settings, baseline)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device_kind": jax.devices()[0].device_kind,
        "host": platform.node(),
        "host_cpus": os.cpu_count(),
        "cpus_usable": affinity,
        "threads": {name: os.environ.get(name) for name in THREAD_VARIABLES},
        "jax_version": jax.__version__,
        "python": platform.python_version(),
        "size": settings.size,
        "model": config.model.to_dict(),
        "train": {"seq_len": config.train.seq_len, "batch_size": config.train.batch_size},
        "steps": settings.steps,
        "repeats_per_slot": settings.eval_repeats,
        "eval_lengths": list(settings.eval_lengths),
        "attention_impl": settings.attention_impl,
        "rounds": rounds,
        "baseline": baseline,
        # Per round (and once after the last): how busy the machine was.
        "load_average_1min": loads,
    }


def markdown(report: dict[str, Any]) -> str:
    """The header and one table: per encoder and figure, median seconds (min-max over rounds)
    and the ratio to the baseline measured in the same round, median (min-max)."""
    meta = report["meta"]
    figures = list(dict.fromkeys(row["figure"] for row in report["rows"]))
    encoders = list(dict.fromkeys(row["encoder"] for row in report["rows"]))
    rows = {(row["encoder"], row["figure"]): row for row in report["rows"]}
    model = meta["model"]
    lines = [
        f"{meta['date']}, {meta['device_kind']} ({meta['host_cpus']} CPUs, "
        f"{meta['cpus_usable']} usable), jax {meta['jax_version']}, threads {meta['threads']}; "
        f"size {meta['size']} ({model['num_layers']} layers, width {model['model_dim']}, "
        f"{model['num_heads']} heads, {model['dtype']}); {meta['rounds']} interleaved rounds; "
        f"load average per round {meta['load_average_1min']}.",
        "",
        f"Seconds: the fastest of {meta['repeats_per_slot']} back-to-back runs per round, "
        "median (min-max) over rounds; ratio: to "
        f"{meta['baseline']} in the same round, median (min-max). "
        + (
            f"`train`: {meta['steps']} steps of batch {meta['train']['batch_size']} x "
            f"{meta['train']['seq_len']}. "
            if "train" in figures
            else ""
        )
        + "Each length: one window, batch 1.",
        "",
        "| encoder | " + " | ".join(f"{_figure(f)} s | {_figure(f)} ratio" for f in figures) + " |",
        "|---|" + "---:|---:|" * len(figures),
    ]
    for encoder in encoders:
        cells = []
        for figure in figures:
            row = rows.get((encoder, figure))
            if row is None:
                cells += ["n/a", "n/a"]
                continue
            cells.append(f"{row['median']:.3g} ({row['min']:.3g}-{row['max']:.3g})")
            cells.append(
                f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"
            )
        lines.append(f"| {encoder} | " + " | ".join(cells) + " |")
    lines += [f"\n{where}: {error}" for where, error in report.get("errors", {}).items()]
    return "\n".join(lines) + "\n"


def _figure(figure: Any) -> str:
    return "train" if figure == "train" else f"{figure}"


def _load_average() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def _log(text: str) -> None:
    print(f"[rounds] {text}", file=sys.stderr, flush=True)


def write_report(report: dict[str, Any], out: str | pathlib.Path) -> str:
    """Writes ``rounds_<size>.json`` and ``rounds_<size>.md`` to ``out``; returns the markdown."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"rounds_{report['meta']['size']}"
    write_json(out / f"{stem}.json", report)
    text = markdown(report)
    (out / f"{stem}.md").write_text(text)
    return text
