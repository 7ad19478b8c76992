"""Pattern models with local layers (sliding and chunked windows) through Transformer-XL memory,
stream evaluation (non-overlapping and sliding) and context-parallel evaluation.

- Memory: segment after segment with memory covering the past gives one pass over all the
  segments with the windows; and since a local layer's keys reach back ``W - 1`` tokens only, a
  model whose every layer has a sliding window needs only ``W - 1`` tokens of memory per layer to
  give that pass exactly (one token less differs).
- Evaluation: the losses :func:`posenc.kinds.stream.evaluate` reports (on the blocked path, the
  window cutting tiles) equal float64 cross entropies of direct ``einsum`` calls of the model on
  each window, scored as the mode says.
- Context parallelism: on 8 virtual CPU devices (a fresh interpreter, ``_context_windows.py``)
  the windows split over 2 and 4 context devices score what one device scores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _train_helpers as helpers
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings, testing
from posenc.kinds.stream import evaluate
from posenc.layers.pattern import LayerKind
from posenc.models import memory as memory_lib
from posenc.models.lm import Transformer
from posenc.testing import _harness, patterns

SETTINGS = testing.Settings()
T = 4  # memory segment length
SCRIPT = Path(__file__).resolve().parent / "_context_windows.py"


def _segments(model, tokens, mem_len):
    memory = memory_lib.empty_memory(model, tokens.shape[0])
    out = []
    for start in range(0, tokens.shape[1], T):
        logits, memory = memory_lib.forward(
            model, tokens[:, start : start + T], memory, mem_len=mem_len
        )
        out.append(logits)
    return np.asarray(jnp.concatenate(out, axis=1))


def test_memory_with_a_local_layer_equals_one_pass_with_the_window():
    model = patterns.build_pattern(encodings.get("rope"), SETTINGS, "beside_itself", "einsum")
    tokens = _harness.tokens(SETTINGS, 3 * T)
    full = np.asarray(model(tokens))
    np.testing.assert_allclose(_segments(model, tokens, 2 * T), full, rtol=2e-5, atol=2e-5)
    unwindowed = patterns.build_pattern(
        encodings.get("rope"), SETTINGS, "beside_itself", "einsum", "full"
    )
    assert np.abs(np.asarray(unwindowed(tokens)) - full).max() > 1e-4  # the window matters


def test_sliding_layers_need_only_the_window_as_memory():
    window = 3
    config = _harness.model_config(SETTINGS, num_layers=2, attention_impl="einsum")
    local = config.attention_options(window=f"sliding:{window}", prefix="layers.kinds.local")
    kinds = (LayerKind("local", encodings.get("rope"), local),)
    model = Transformer(config, encodings.get("nope"), rngs=nnx.Rngs(0), layers=kinds)
    tokens = _harness.tokens(SETTINGS, 3 * T)
    full = np.asarray(model(tokens))
    np.testing.assert_allclose(_segments(model, tokens, window - 1), full, rtol=2e-5, atol=2e-5)
    short = _segments(model, tokens, window - 2)
    assert np.abs(short[:, T:] - full[:, T:]).max() > 1e-4


def test_memory_with_chunks_equals_one_pass_and_refuses_misaligned_chunks():
    model = patterns.build_pattern(
        encodings.get("rope"), SETTINGS, "beside_itself", "einsum", f"chunked:{T}"
    )
    tokens = _harness.tokens(SETTINGS, 3 * T)
    full = np.asarray(model(tokens))
    np.testing.assert_allclose(_segments(model, tokens, 2 * T), full, rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match=r"layers\.kinds\.local\.window='chunked:4' .* got 3"):
        _segments(model, tokens, 3)


def _direct_losses(model, stream: np.ndarray, length: int, stride: int) -> np.ndarray:
    """``[windows, length]`` float64 cross entropy of each window's targets, NaN where the mode
    does not score them (the first window scores all, later ones the last ``stride``)."""
    starts = range(0, len(stream) - 1 - length + 1, stride)
    windows = np.stack([stream[s : s + length + 1] for s in starts])  # [W, L + 1]
    logits = model(jnp.asarray(windows[:, :-1], jnp.int32))  # [W, L, V]
    losses = helpers.cross_entropy(logits, windows[:, 1:])
    losses[1:, : length - stride] = np.nan
    return losses


@pytest.mark.parametrize("window", ["sliding:3", "chunked:4"])
@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_evaluation_scores_what_direct_calls_give(window, mode):
    length, stride = 12, (12 if mode == "nonoverlapping" else 5)
    enc = encodings.get("rope")
    # The blocked path (tiles of 5 tokens: the window cuts them) against direct einsum calls.
    model = patterns.build_pattern(enc, SETTINGS, "beside_itself", "blocked", window)
    direct = patterns.build_pattern(enc, SETTINGS, "beside_itself", "einsum", window)
    stream = np.random.default_rng(3).integers(0, 64, 5 * length + 1).astype(np.int32)
    kwargs = {"stride": stride} if mode == "sliding" else {}
    [result] = evaluate(model, stream, [length], mode=mode, batch_tokens=2 * length, **kwargs)
    losses = _direct_losses(direct, stream, length, stride)
    assert result["tokens"] == np.isfinite(losses).sum()
    np.testing.assert_allclose(result["loss"], np.nanmean(losses), rtol=1e-5)
    np.testing.assert_allclose(
        result["loss_by_position"], np.nanmean(losses, axis=0), rtol=1e-5, atol=1e-6
    )


@pytest.mark.slow
def test_context_parallel_evaluation_of_a_local_layer_equals_one_device(tmp_path):
    """32-token windows on the blocked path in tiles of 8, the local layer's window of 11 keys
    crossing the tiles and the devices' shards, split over 2 and 4 context devices."""
    out = tmp_path / "context.json"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    args = [sys.executable, str(SCRIPT), "--encodings", "rope,alibi,cope", "--out", str(out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for name, by_size in report.items():
        one = by_size["1"]
        for size in ("2", "4"):
            got = by_size[size]
            assert got["split"], (name, size)
            assert got["tokens"] == one["tokens"]
            np.testing.assert_allclose(got["loss"], one["loss"], rtol=1e-5, err_msg=name)
            np.testing.assert_allclose(
                got["loss_by_position"], one["loss_by_position"], rtol=1e-5, atol=1e-6
            )


def test_the_benchmark_names_each_layers_path():
    """A pattern whose local layer has sinks (which the fused kernels cannot take) runs two
    paths; the benchmark names both, and a model without a pattern keeps its one name."""
    from posenc.benchmark.measure import chosen_path

    config = _harness.model_config(SETTINGS, num_layers=2, attention_block_size=512)
    sinks = config.attention_options(window="sliding:3", sinks=True, prefix="layers.kinds.l")
    kinds = (LayerKind("g", None, config.attention_options(prefix="layers.kinds.g")),)
    model = Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0), layers=(*kinds,))
    one = chosen_path(model, 64, "auto")  # xla on a CPU, cudnn on an NVIDIA GPU
    assert one in ("xla", "cudnn")
    both = (*kinds, LayerKind("l", None, sinks))
    model = Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0), layers=both)
    assert chosen_path(model, 64, "auto") == f"{one}+einsum"
    assert chosen_path(model, 64, "blocked") == "blocked"
