"""Causal language modelling: next-token prediction on a token stream, trained on windows of
``train.seq_len`` tokens and scored exactly at every evaluation length.

The kind every decoder-only config is unless another claims it (a masked LM, a synthetic task).
Training reads random windows of the ``train`` split, or consecutive segments per batch row with
Transformer-XL memory (``model.mem_len``) or ``train.order="consecutive"``; with
``train.positions="randomized"`` each batch gets one sorted draw of positions.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from posenc import data as data_lib
from posenc.kinds.base import RunKind, StepLoss, TrainingData
from posenc.kinds.common import check_source, consecutive_segments, open_source
from posenc.kinds.registry import register
from posenc.models import memory as memory_lib
from posenc.models.build import assembly
from posenc.models.losses import token_loss


def training_windows(
    config: ml_collections.ConfigDict, stream: np.ndarray
) -> data_lib.TrainWindows | data_lib.StreamSegments:
    """A run's training batches over ``stream``: random windows, or consecutive segments per
    row (with memory, or ``train.order = "consecutive"``)."""
    t = config.train
    cls = data_lib.StreamSegments if consecutive_segments(config) else data_lib.TrainWindows
    return cls(
        stream,
        seq_len=t.seq_len,
        global_batch=t.batch_size,
        seed=config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


@register
class CausalLM(RunKind):
    """Next-token prediction on a token stream (the default kind of a decoder-only model)."""

    name = "causal_lm"
    summary = "next-token prediction on a token stream, perplexity at every evaluation length"
    chosen_by = "model.assembly='lm' (the default), train.objective='causal_lm' (the default)"
    precedence = 90  # asked last: every decoder-only config another kind does not claim
    objective = "causal_lm"

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return assembly(config) == "lm"

    # -- data and batches

    def windows(self, config: ml_collections.ConfigDict, stream: np.ndarray) -> Any:
        """The training batches over a token stream (:func:`training_windows`)."""
        return training_windows(config, stream)

    def training_data(self, config: ml_collections.ConfigDict, mesh: Any) -> TrainingData:
        source = open_source(config)
        check_source(config, source)
        return TrainingData(self.windows(config, source.split_stream("train")), source.info())

    def local_batch(
        self, config: ml_collections.ConfigDict, batches: Any, step: int
    ) -> dict[str, np.ndarray]:
        """Step ``step``'s rows: ``inputs``, ``targets`` (and ``weights`` where the batches give
        them) and, with ``train.positions = "randomized"``, the step's ``positions``."""
        batch = batches.batch(step)
        t = config.train
        if t.positions == "randomized":
            rows, length = batch["inputs"].shape
            batch["positions"] = data_lib.batch_positions(
                config.seed, step, rows, length, t.max_position
            )
        return batch

    # -- the training step

    def loss(
        self,
        config: ml_collections.ConfigDict,
        model: Any,
        batch: dict[str, Any],
        rng: Any,
        memory: Any = None,
    ) -> StepLoss:
        """The mean cross entropy over the batch's tokens (over those with weight 1 where the
        batch has ``weights``: a masked LM's chosen tokens, a task's targets)."""
        if memory is not None:
            logits, memory = memory_lib.forward(model, batch["inputs"], memory, rng=rng)
        else:
            logits = model(batch["inputs"], batch.get("positions"), rng=rng)
        losses = token_loss(logits, batch["targets"])  # [B, T]
        tokens = batch["targets"].size
        if "weights" in batch:
            scored = batch["weights"].sum()
            loss_sum = (losses * batch["weights"]).sum()
            mean = loss_sum / jax.numpy.maximum(scored, 1.0)
            return StepLoss(mean, loss_sum, tokens, scored, memory)
        return StepLoss(losses.mean(), losses.sum(), tokens, tokens, memory)

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    # -- config, plan and analysis

    # -- report

    report_runs = "causal-LM"
    report_metrics = ("perplexity", "bits_per_byte", "loss")
    report_own_metrics = ("bits_per_byte",)

    def owns_eval(self, report: dict[str, Any]) -> bool:
        """Every report no kind asked before owns (asked last, as for configs; an older report
        without an ``objective`` too)."""
        return True
