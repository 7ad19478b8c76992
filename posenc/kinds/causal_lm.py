"""Causal language modelling: next-token prediction on a token stream, trained on windows of
``train.seq_len`` tokens and scored exactly at every evaluation length.

The kind every decoder-only config is unless another claims it (a masked LM, a synthetic task).
Training reads random windows of the ``train`` split, or consecutive segments per batch row with
Transformer-XL memory (``model.mem_len``) or ``train.order="consecutive"``; with
``train.positions="randomized"`` each batch gets one sorted draw of positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np

from posenc import data as data_lib
from posenc.devices.distributed import make_mesh
from posenc.kinds import stream
from posenc.kinds.base import EvalContext, RunKind, StepLoss, TrainingData
from posenc.kinds.common import (
    check_eval_lengths,
    check_source,
    consecutive_segments,
    eval_lengths,
    eval_mem_len,
    open_source,
    short_info,
)
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


@dataclasses.dataclass(frozen=True)
class StreamInputs:
    """What a stream's evaluation reads (:meth:`CausalLM.open_evaluation`): the data source,
    its evaluation split's tokens and the evaluation's mesh (``config.mesh``; it may differ
    from training's)."""

    source: data_lib.Source
    tokens: np.ndarray | None
    mesh: jax.sharding.Mesh


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

    retrieval = True

    def masking(self, config: ml_collections.ConfigDict) -> data_lib.MaskedLM | None:
        """How evaluation windows are corrupted before they are scored: None, a causal LM
        scores them as they are."""
        return None

    def open_evaluation(self, context: EvalContext) -> StreamInputs:
        """The evaluation split's tokens, checked against the lengths, and the mesh."""
        config = context.config
        e = config.eval
        source = open_source(config)
        tokens = source.split_stream(e.split)
        check_eval_lengths(len(tokens), eval_lengths(config), e.split)
        return StreamInputs(source, tokens, make_mesh(config))

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        """The split scored exactly in windows at each length (:func:`posenc.kinds.stream.
        evaluate`), with randomized positions and Transformer-XL memory as the config says,
        the windows corrupted by :meth:`masking`."""
        config, inputs = context.config, context.inputs
        e = config.eval
        results = stream.evaluate(
            context.model_on(inputs.mesh),
            inputs.tokens,
            eval_lengths(config),
            mode=e.mode,
            stride=e.stride,
            batch_tokens=e.batch_tokens,
            max_tokens=e.max_tokens,
            split=e.split,
            mesh=inputs.mesh,
            progress=context.progress,
            positions=stream.random_positions(config),
            masked_lm=self.masking(config),
            mem_len=eval_mem_len(config),
            byte_level=config.data.get("tokenizer", "bytes") == "bytes",
        )
        data = {"source": config.data.source, "split": e.split, **short_info(inputs.source.info())}
        return {"data": data, "results": results}

    # -- config, plan and analysis

    # -- report
