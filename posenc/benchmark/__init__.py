"""Training throughput, model FLOP utilisation and memory, and long-window evaluation cost.

For each encoder, at one model size, measures what a user runs:

- training with :class:`posenc.runs.train.Trainer` (the jitted AdamW step, batches built by
  :class:`posenc.data.TrainWindows` and sharded by ``Trainer.global_batch``): compile time, then
  ``steps`` steady-state steps after ``warmup`` steps, timed with ``jax.block_until_ready``;
  tokens/s, step time, MFU and peak memory (:func:`~posenc.benchmark.measure.measure_train`);
- evaluation with :class:`posenc.kinds.stream.Scorer` of one window (batch 1) at each of
  ``eval_lengths``, with the model's ``attention_impl`` (``auto`` picks the blocked path or
  cuDNN for long windows): compile time, steady-state seconds, tokens/s and peak memory
  (:func:`~posenc.benchmark.measure.measure_eval`).

MFU = model FLOPs per token x tokens/s / (peak FLOP/s per device x devices), with model FLOPs
per training token ``6 N + 12 L T D`` (PaLM, Chowdhery et al. 2022, App. B): ``N`` the parameters
used in matmuls (tied embedding counted once, positional tables excluded), ``L`` layers, ``T``
the training length, ``D`` the attention width (heads x head dim). Encoder-specific work (T5 and
ALiBi biases, Shaw's and Transformer-XL's relative logits) is not counted, so it shows as lower
MFU. Peak FLOP/s: bf16 dense from :data:`~posenc.benchmark.measure.PEAK_TFLOPS` by device kind,
or ``Settings.peak_tflops`` (``--peak-tflops``).

Peak memory: on devices with allocator statistics (GPU, TPU) each measurement runs in a fresh
process (``isolate="auto"``, :mod:`posenc.benchmark.worker`) and reports
``memory_stats()['peak_bytes_in_use']``; XLA's compiled memory analysis (arguments + outputs -
aliased + temporaries of the jitted program) is reported everywhere and is the figure shown on
CPU.

Modules: ``settings`` (sizes, :class:`Settings`, each encoder's config), ``measure`` (the
measurements, FLOPs, peak table and memory), ``worker`` (one measurement in a fresh process;
``python -m posenc.benchmark`` is its entry), ``runner`` (:func:`run`: all encoders, MFU, the
header), ``report`` (markdown and the files ``throughput_<size>.json`` and ``.md``), ``rounds``
(the encoders timed in interleaved rounds, with medians, spreads and ratios to NoPE per round,
for a noisy machine), ``windows`` (the evaluation cost of an attention window and of a layer
pattern, in rounds), ``device`` and ``device_report`` (the prepared device check of a lent GPU:
tests, training, evaluation and the PyTorch peer ``torch_peer``, x-transformers at the same
shape, under time guards; ``experiments/device_check.py``). Which attention path each encoder
takes on each backend: :mod:`posenc.runs.paths`. The command is ``experiments/throughput.py``.
"""

from posenc.benchmark import rounds, windows
from posenc.benchmark.measure import (
    PEAK_TFLOPS,
    flops_per_token,
    measure_eval,
    measure_train,
    peak_tflops,
)
from posenc.benchmark.report import markdown, write_report
from posenc.benchmark.runner import run
from posenc.benchmark.settings import SIZES, Settings, make_config

__all__ = [
    "PEAK_TFLOPS",
    "SIZES",
    "Settings",
    "flops_per_token",
    "make_config",
    "markdown",
    "measure_eval",
    "measure_train",
    "peak_tflops",
    "rounds",
    "windows",
    "run",
    "write_report",
]
