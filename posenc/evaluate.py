"""Train short, test long: exact evaluation at many window lengths.

For each length ``L`` the evaluation split is cut into windows (:func:`posenc.data.eval_windows`):
non-overlapping by default, as in the ALiBi paper's tables (every token scored once, each with
the context since its window started), or sliding (context ``L``, stride ``S``, only the last
``S`` tokens of a window scored). The model scores fixed-shape batches (one compilation per
length); per-position loss sums and counts come back to the host and are added in float64, so
the reported mean is the exact mean over the scored tokens.

Reported per length: tokens scored, mean loss (nats), perplexity, bits per byte, loss by
position inside the window, windows, tokens left unscored and seconds.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from posenc import data as data_lib
from posenc.config import check_eval_lengths, eval_lengths, open_source, validate
from posenc.distributed import make_mesh
from posenc.model import Transformer, token_loss
from posenc.train import load_model, read_config

EVAL_FILE = "eval.json"


def _max_windows(length: int, stride: int, max_tokens: int) -> int | None:
    """Windows that score at most ``max_tokens`` (the first scores ``length``, later ``stride``)."""
    if not max_tokens:
        return None
    return max(1, 1 + (max_tokens - length) // stride) if max_tokens >= length else 1


class Scorer:
    """Scores batches of windows with one compiled function per window length."""

    def __init__(self, model: Transformer, mesh: jax.sharding.Mesh | None = None):
        self.mesh = mesh or make_mesh()
        self.graphdef, self.state = nnx.split(model)
        self.batch_sharding = NamedSharding(self.mesh, P("data"))
        self.state = jax.device_put(self.state, NamedSharding(self.mesh, P()))
        self._score = jax.jit(self._score_batch)

    def _score_batch(self, state, batch):
        model = nnx.merge(self.graphdef, state)
        losses = token_loss(model(batch["inputs"]), batch["targets"])  # [B, L]
        mask = batch["mask"]
        return (losses * mask).sum(axis=0), mask.sum(axis=0)  # [L], [L]

    def score(self, windows: data_lib.EvalWindows, batch_size: int) -> tuple[np.ndarray, ...]:
        """Per-position ``(loss_sum, count)`` over all windows, float64 ``[L]`` each."""
        loss_sum = np.zeros(windows.length, np.float64)
        count = np.zeros(windows.length, np.float64)
        batches = windows.iter_batches(batch_size, jax.process_index(), jax.process_count())
        for local in batches:
            batch = {
                k: jax.make_array_from_process_local_data(self.batch_sharding, v)
                for k, v in local.items()
            }
            s, c = jax.device_get(self._score(self.state, batch))
            loss_sum += s
            count += c
        return loss_sum, count


def evaluate(
    model: Transformer,
    stream: np.ndarray,
    lengths: Sequence[int],
    *,
    mode: str = "nonoverlapping",
    stride: int | None = None,
    batch_tokens: int = 65_536,
    max_tokens: int = 0,
    split: str = "validation",
    mesh: jax.sharding.Mesh | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Evaluates ``model`` on ``stream`` at each window length.

    Args:
      model: a trained model.
      stream: the token stream of the evaluation split.
      lengths: window lengths ``L``.
      mode: ``"nonoverlapping"`` or ``"sliding"``.
      stride: sliding mode's stride ``S <= L`` (tokens scored per window).
      batch_tokens: windows per batch = ``max(1, batch_tokens // L)`` rounded up to a multiple
        of the device count (padding windows are masked).
      max_tokens: score at most this many tokens per length (0: all); reported honestly.
      split: name of the split, for messages.
      mesh: device mesh; default all devices along ``data``.
      progress: print one line per length.

    Returns:
      One dict per length (see the module docstring); a length the encoder cannot represent
      (a learned table shorter than ``L``) gets ``{"length": L, "error": message}``.
    """
    check_eval_lengths(len(stream), lengths, split)
    scorer = Scorer(model, mesh)
    devices = scorer.mesh.devices.size
    results = []
    for length in lengths:
        try:
            model.encoding.check_length(length)
        except ValueError as e:
            results.append({"length": int(length), "error": str(e)})
            continue
        step = length if mode == "nonoverlapping" else stride
        windows = data_lib.eval_windows(
            stream, length, stride=step, max_windows=_max_windows(length, step, max_tokens)
        )
        batch = max(1, batch_tokens // length)
        batch = -(-batch // devices) * devices  # a multiple of the device count
        start = time.perf_counter()
        loss_sum, count = scorer.score(windows, batch)
        seconds = time.perf_counter() - start
        tokens = int(count.sum())
        if tokens != windows.scored_tokens:
            raise AssertionError(f"scored {tokens} tokens, expected {windows.scored_tokens}")
        loss = float(loss_sum.sum() / tokens)
        by_position = np.where(count > 0, loss_sum / np.maximum(count, 1), np.nan)
        result = {
            "length": int(length),
            "tokens": tokens,
            "loss": loss,
            "perplexity": math.exp(loss),
            # Byte-level tokens: one token per byte (a document separator counts as one).
            "bits_per_byte": loss / math.log(2),
            "windows": int(windows.num_windows),
            "dropped_tokens": int(windows.dropped_tokens),
            "seconds": seconds,
            "loss_by_position": [None if np.isnan(x) else round(float(x), 5) for x in by_position],
        }
        results.append(result)
        if progress and jax.process_index() == 0:
            print(
                f"  L={length:>6}: loss {loss:.4f}  ppl {result['perplexity']:.3f}  "
                f"bpb {result['bits_per_byte']:.4f}  ({tokens} tokens, {seconds:.1f}s)",
                flush=True,
            )
    return results


def device_description() -> str:
    """E.g. ``"1 x cpu"`` or ``"8 x NVIDIA H100 80GB HBM3"``."""
    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind}"


def evaluate_workdir(
    workdir: str,
    *,
    overrides: ml_collections.ConfigDict | None = None,
    output: str = EVAL_FILE,
    progress: bool = True,
    model: Transformer | None = None,
) -> dict[str, Any]:
    """Evaluates a trained work directory with its config's ``eval`` section; writes ``eval.json``.

    Args:
      workdir: a directory written by :func:`posenc.train.train`.
      overrides: a config to use instead of the saved one (same model; e.g. other
        ``eval.lengths``). Only its ``eval`` and ``data`` sections may differ in effect.
      output: file name inside ``workdir``.
      progress: print one line per length.
      model: the trained model, if already in memory (skips loading the checkpoint).

    Returns:
      The report that was written.
    """
    config = overrides or read_config(workdir)
    validate(config)
    e = config.eval
    source = open_source(config)
    stream = source.split_stream(e.split)
    lengths = eval_lengths(config)
    check_eval_lengths(len(stream), lengths, e.split)
    model = model or load_model(workdir, config)
    results = evaluate(
        model,
        stream,
        lengths,
        mode=e.mode,
        stride=e.stride,
        batch_tokens=e.batch_tokens,
        max_tokens=e.max_tokens,
        split=e.split,
        progress=progress,
    )
    report = {
        "encoding": config.encoding.name,
        "encoding_hparams": config.encoding.hparams.to_dict(),
        "train_seq_len": config.train.seq_len,
        "train_steps": config.train.steps,
        "seed": config.seed,
        "model": {**config.model.to_dict(), "num_params": model.num_params()},
        "data": {"source": config.data.source, "split": e.split, **_short_info(source.info())},
        "mode": e.mode,
        "stride": e.stride if e.mode == "sliding" else None,
        "device": device_description(),
        "results": results,
        "time": time.time(),
    }
    if jax.process_index() == 0:
        path = os.path.join(workdir, output)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, path)
    return report


def _short_info(info: dict[str, Any]) -> dict[str, Any]:
    """The identifying parts of a source's info (hashes, counts), without long file lists."""
    return {k: v for k, v in info.items() if not isinstance(v, list | dict) or len(v) <= 16}


def load_eval(workdir: str, output: str = EVAL_FILE) -> dict[str, Any] | None:
    """A work directory's ``eval.json``, or None if it has none."""
    path = os.path.join(workdir, output)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
