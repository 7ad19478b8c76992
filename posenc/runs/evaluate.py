"""Train short, test long: the evaluation driver, which scores a trained run as its kind says.

:func:`evaluate_workdir` reads a run's config, lets the run's kind (:mod:`posenc.kinds`) open
and check what it scores (:meth:`~posenc.kinds.RunKind.open_evaluation`), then, holding the run's
lock, scores its newest intact checkpoint (its parameters only: no optimizer is built) with the
kind's :meth:`~posenc.kinds.RunKind.evaluate` and writes the report: what every report says about
the run (the encoder, the kind's :meth:`~posenc.kinds.RunKind.record`, training, the checkpoint
step scored and whether training had finished, the model, the device), the kind's fields, and the
time. What each kind scores is in its module: windows of a token stream scored exactly at each
length (:mod:`posenc.kinds.stream`, causal and masked LM runs), generated examples per input
length (:mod:`posenc.kinds.tasks`), BLEU by source length (:mod:`posenc.kinds.translation`),
metrics by example length (:mod:`posenc.kinds.classification`).

Evaluation may change only what cannot change what was trained
(:func:`posenc.runs.config.evaluation_changes`); a report under changed settings records them and
is written beside the run's own ``eval.json`` (``eval-<settings>.json``), never over it.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
from flax import nnx

from posenc import kinds
from posenc.kinds.common import eval_mem_len, eval_positions
from posenc.models.restore import restore_model
from posenc.runs.config import evaluation_changes, validate
from posenc.workdir import EVAL_FILE, RunDir


def device_description() -> str:
    """E.g. ``"1 x cpu"`` or ``"8 x NVIDIA H100 80GB HBM3"``."""
    devices = jax.devices()
    return f"{len(devices)} x {devices[0].device_kind}"


def evaluate_workdir(
    workdir: str,
    *,
    overrides: ml_collections.ConfigDict | None = None,
    output: str | None = None,
    progress: bool = True,
    model: nnx.Module | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """Evaluates a trained run with its config's ``eval`` section (or changed settings).

    Args:
      workdir: a directory written by :func:`posenc.runs.train.train`.
      overrides: the config to evaluate with instead of the run's own; it may differ only where
        :func:`posenc.runs.config.evaluation_changes` allows.
      output: a ``.json`` file name inside ``workdir`` that the run does not own
        (:meth:`posenc.workdir.RunDir.eval_output`); default ``eval.json`` for the run's own
        settings and ``eval-<changed settings>.json`` otherwise.
      progress: print one line per length.
      model, step: the trained model and its step, if already in memory (skips loading the
        checkpoint).

    Returns:
      The report that was written (its file name under ``"file"``), with the names of the
      files the kind keeps beside it (:meth:`~posenc.kinds.RunKind.write_outputs`).

    Raises:
      ValueError: a setting evaluation may not change, or an ``output`` that is a path, one of
        the run's own files, or the run's own ``eval.json`` for changed settings.
    """
    run = RunDir(workdir)
    trained = run.read_config()
    config = overrides or trained
    changes = evaluation_changes(trained, config)
    validate(config)
    name = run.eval_output(output, changes)
    kind = kinds.kind_of(config)
    is_main = jax.process_index() == 0
    context = kinds.EvalContext(
        run=run,
        config=config,
        changes=changes,
        name=name,
        restore=lambda mesh: restore_model(run, config, mesh),
        progress=progress,
        is_main=is_main,
        model=model,
        step=step,
    )
    context.inputs = kind.open_evaluation(context)
    with run.lock(enabled=is_main):
        fields = kind.evaluate(context)
        report = {
            **_run_record(kind, config, context.model, context.step),
            "file": name,
            "changes": changes,
            **fields,  # a field the record has too (train_seq_len) keeps the record's place
            "time": time.time(),
        }
        if is_main:
            run.write_eval(report, name)
            report.update(kind.write_outputs(context))
    return report


def _run_record(
    kind: kinds.RunKind, config: ml_collections.ConfigDict, model: nnx.Module, step: int | None
) -> dict[str, Any]:
    """What a report says about the run it scored: encoder, kind, training, checkpoint, model."""
    e = config.eval
    return {
        "encoding": config.encoding.name,
        "encoding_hparams": config.encoding.hparams.to_dict(),
        # What was scored (objective), the task, the training length, the source length.
        **kind.record(config),
        "train_steps": config.train.steps,
        "checkpoint_step": step,
        "finished": step == config.train.steps if step is not None else None,
        "seed": config.seed,
        "model": {**config.model.to_dict(), "num_params": model.num_params()},
        "mode": e.mode,
        "stride": e.stride if e.mode == "sliding" else None,
        "positions": eval_positions(config),
        "mem_len": eval_mem_len(config),  # Transformer-XL memory carried across windows
        "train_positions": config.train.positions,
        "max_position": config.train.max_position,
        "device": device_description(),
    }


def load_eval(workdir: str, output: str = EVAL_FILE) -> dict[str, Any] | None:
    """A work directory's ``eval.json`` (or another report in it), or None if it has none."""
    return RunDir(workdir).read_eval(output)
