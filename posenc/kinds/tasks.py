"""Algorithmic tasks (``data.source = "synthetic:<task>"``): train on the targets, test longer.

The length-generalisation protocol of Ruoss et al. 2023 (*Randomized Positional Encodings Boost
Length Generalization of Transformers*, after Delétang et al. 2023) and of Kazemnejad et al. 2023
(*The Impact of Positional Encoding on Length Generalization in Transformers*): a decoder-only
model reads ``input SEP target`` and is trained on the target tokens only; the lengths of
training are drawn from ``[1, train.seq_len]`` (Ruoss: 40, NoPE: 20); evaluation generates
examples at each of ``eval.lengths`` (most beyond training) and reports

- ``accuracy``: per-token accuracy on the target under teacher forcing (the arg max at each
  target position, given the true prefix; Ruoss et al.'s metric), the share over all target
  tokens of the length's examples;
- ``sequence_accuracy``: the mean over examples of each example's per-token accuracy;
- ``exact_match``: the share of examples whose target is reproduced exactly by **greedy
  generation** from ``input SEP`` (Kazemnejad et al.'s metric), with the key/value cache of
  :mod:`posenc.decoding` (``eval.generate = False`` skips it);
- ``loss``: mean cross entropy of the target tokens (nats), and its ``perplexity``.

A length is the task's own (:mod:`posenc.data.synthetic`): the input length for Ruoss et al.'s
tasks, Kazemnejad et al.'s unit for theirs (digits of an addition, terms of a polynomial, ...).
Examples are pure functions of ``(task, length, seed, index)``;
evaluation draws them from a seed stream of its own (:func:`eval_seed`), apart from training's.
Positions: contiguous, or for a run trained with randomized positions, by default a sorted random
subset of ``[0, train.max_position)`` per batch, as for text (``eval.positions``), the same for
scoring and generating a batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from posenc.data import synthetic
from posenc.data.task_source import PREFIX, task_name
from posenc.decoding.lm import layer_encodings
from posenc.devices import fits
from posenc.devices.distributed import make_mesh
from posenc.kinds import stream
from posenc.kinds.base import EvalContext, TrainingData
from posenc.kinds.causal_lm import CausalLM, StreamInputs
from posenc.kinds.common import check_source, eval_lengths, objective, open_source, short_info
from posenc.kinds.masked_lm import validate_masked_objective
from posenc.kinds.registry import register
from posenc.models.build import assembly, make_encoding
from posenc.models.lm import Transformer
from posenc.workdir.metrics import perplexity

# Evaluation examples come from this offset of the run's seed, never used by training draws.
_EVAL_SEED_OFFSET = 1_000_003


def task_of(config: ml_collections.ConfigDict) -> str | None:
    """The task of a run whose ``data.source`` is ``synthetic:<task>``, else None."""
    return task_name(config.data.source)


def eval_seed(seed: int) -> int:
    """The seed evaluation examples are drawn with (apart from training's)."""
    return seed + _EVAL_SEED_OFFSET


class TaskBatches:
    """Training batches of a task, deterministic in ``(seed, step)``, row by row of the global
    batch (so each process builds only its rows), in the interface of
    :class:`posenc.data.TrainWindows`.

    Args:
      task: a task name (:data:`posenc.data.synthetic.TASKS`).
      max_length: the longest training input (``train.seq_len``); lengths are drawn from
        ``[1, max_length]`` as :func:`posenc.data.synthetic.train_batch` documents.
      global_batch: examples per step over all processes.
      seed: the run's seed.
      process_index, process_count: this process's share of the global batch.
    """

    def __init__(
        self,
        task: str,
        max_length: int,
        global_batch: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        self.task = task
        self.max_length = max_length
        self.global_batch = global_batch
        self.seed = seed
        self.process_index = process_index
        self.local_batch = global_batch // process_count

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of step ``step``: ``inputs``, ``targets`` int32 and ``weights``
        float32 (1 on the target tokens) ``[b, width]``."""
        lo = self.process_index * self.local_batch
        rows = range(lo, lo + self.local_batch)
        batch = synthetic.train_batch(
            self.task, self.global_batch, self.max_length, self.seed, step, rows=rows
        )
        return {k: batch[k] for k in ("inputs", "targets", "weights")}


class TaskScorer:
    """Scores a model on task examples: teacher-forced accuracy and loss, and greedy exact
    match, one compilation per evaluation length."""

    def __init__(self, model: Transformer):
        self.model = model
        self.graphdef, self.state = nnx.split(model)
        # Compiled once per length, refused in one line if it cannot fit (posenc.devices.fits).
        self._score = fits.CheckedJit(self._score_batch, self._describe)

    def _describe(self, state, inputs, *rest) -> tuple[str, str]:
        """What scoring a batch computes and what to change if it does not fit."""
        rows, width = inputs.shape
        what = f"scoring examples of {width} tokens (input, separator, target) {rows} at a time"
        config = self.model.config
        attention = fits.attention_change(config.attention_impl, config.attention_block_size)
        less = "lower eval.examples (a batch holds up to 64), " if rows > 1 else ""
        return what, f"{less}{attention} or use shorter eval.lengths"

    def _score_batch(self, state, inputs, targets, weights, positions):
        model = nnx.merge(self.graphdef, state)
        scored = model.token_losses(model.hidden_states(inputs, positions), targets, correct=True)
        losses = scored.loss  # [B, W]
        correct = scored.correct.astype(jnp.float32) * weights
        return (losses * weights).sum(-1), correct.sum(-1), weights.sum(-1)  # [B] each

    def score(self, batch: dict[str, np.ndarray], positions: np.ndarray | None):
        """Per example ``(loss sum, correct, target tokens)`` float64 ``[B]``."""
        out = self._score(
            self.state, batch["inputs"], batch["targets"], batch["weights"], positions
        )
        return tuple(np.asarray(x, np.float64) for x in jax.device_get(out))

    def exact_match(
        self, batch: dict[str, np.ndarray], num_new: int, positions: np.ndarray | None
    ) -> np.ndarray:
        """Per example, whether greedy generation of ``num_new`` tokens from ``input SEP``
        reproduces the target (bool ``[B]``). Rows are generated in groups of one prompt length
        (a task whose inputs vary in length at one task length), each group padded to the batch
        with copies of its first row, so every call has the batch's shape."""
        from posenc.decoding.lm import greedy_generate, greedy_generate_reference

        rows = len(batch["prompt_len"])
        ok = np.zeros(rows, bool)
        for prompt in np.unique(batch["prompt_len"]):
            group = np.flatnonzero(batch["prompt_len"] == prompt)
            take = np.concatenate([group, np.full(rows - len(group), group[0])])
            prompts = jnp.asarray(batch["inputs"][take, :prompt])
            pos = None if positions is None else positions[take, : prompt + num_new]
            try:
                generated = greedy_generate(self.model, prompts, num_new, positions=pos)
            except ValueError:  # a model the cache cannot serve: the same tokens, recomputed
                generated = greedy_generate_reference(self.model, prompts, num_new, positions=pos)
            generated = np.asarray(generated)
            for row, tokens in zip(group, generated, strict=False):
                n = int(batch["target_len"][row])
                # targets[prompt - 1 + i] is the target's i-th symbol (inputs shifted by one).
                want = batch["targets"][row, prompt - 1 : prompt - 1 + n]
                ok[row] = np.array_equal(tokens[:n], want)
        return ok


def evaluate_task(
    model: Transformer,
    task: str,
    lengths: Sequence[int],
    *,
    examples: int,
    seed: int,
    batch_size: int = 64,
    generate: bool = True,
    positions: Any = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Scores ``model`` on ``examples`` fresh examples of ``task`` at each input length.

    Args:
      model: a trained causal model.
      task: the task (:data:`posenc.data.synthetic.TASKS`).
      lengths: input lengths.
      examples: examples per length.
      seed: the run's seed (examples are drawn with :func:`eval_seed` of it).
      batch_size: examples per compiled batch.
      generate: also score greedy generation (exact match).
      positions: randomized positions (:class:`posenc.kinds.stream.Positions`, one draw per
        batch); None: ``0 .. W - 1``.
      progress: print one line per length.

    Returns:
      One dict per length (see the module docstring); a length the encoder cannot represent
      (a learned table too short) gets ``{"length": L, "error": message}``.
    """
    scorer = TaskScorer(model)
    batch_size = min(batch_size, examples)  # no batch rows beyond the examples asked for
    results = []
    for length in lengths:
        num_new = synthetic.max_target_length(task, length)
        width = synthetic.row_width(task, length)  # input SEP target
        try:
            for _, encoding in layer_encodings(model):  # every layer kind's encoder
                encoding.check_length(positions.max_position if positions else width)
        except ValueError as e:
            results.append({"length": int(length), "error": str(e)})
            continue
        start = time.perf_counter()
        loss = correct = tokens = 0.0
        per_example, matches = [], []
        for number, lo in enumerate(range(0, examples, batch_size)):
            n = min(batch_size, examples - lo)
            batch = _eval_rows(task, length, lo, n, batch_size, eval_seed(seed), width)
            # One draw per batch, the same for scoring and for generating (a token keeps its
            # position); the prompt and the generated tokens fit the width.
            pos = None if positions is None else positions.draw(number, batch_size, width)
            try:
                loss_b, correct_b, tokens_b = scorer.score(batch, pos)
            except fits.DoesNotFitError as e:
                raise fits.DoesNotFitError(f"eval.lengths entry {length}: {e}") from None
            loss += loss_b[:n].sum()
            correct += correct_b[:n].sum()
            tokens += tokens_b[:n].sum()
            per_example += list(correct_b[:n] / np.maximum(tokens_b[:n], 1))
            if generate:
                matches += list(scorer.exact_match(batch, num_new, pos)[:n])
        result = {
            "length": int(length),
            "examples": int(examples),
            "tokens": int(tokens),  # target tokens scored
            "loss": float(loss / max(tokens, 1)),
            "perplexity": perplexity(float(loss / max(tokens, 1))),  # of the target tokens
            "accuracy": float(correct / max(tokens, 1)),
            "sequence_accuracy": float(np.mean(per_example)),
            "exact_match": float(np.mean(matches)) if generate else None,
            "seconds": time.perf_counter() - start,
        }
        results.append(result)
        if progress and jax.process_index() == 0:
            em = "" if not generate else f"  exact match {result['exact_match']:.4f}"
            print(
                f"  length {length:>5}: accuracy {result['accuracy']:.4f}{em}  "
                f"({examples} examples, {result['seconds']:.1f}s)",
                flush=True,
            )
    return results


def _eval_rows(task, length, lo, n, batch_size, seed, width) -> dict[str, np.ndarray]:
    """Examples ``lo .. lo + n - 1`` of one length, padded with copies of the first to
    ``batch_size`` rows (one compiled shape; the padding rows are not counted)."""
    pairs = [synthetic.example(task, length, seed, lo + i) for i in range(n)]
    pairs += [pairs[0]] * (batch_size - n)
    return synthetic.encode(pairs, width)


__all__ = [
    "PREFIX",
    "TaskBatches",
    "TaskScorer",
    "eval_seed",
    "evaluate_task",
    "task_of",
    "validate_task",
]


def validate_task(config: ml_collections.ConfigDict) -> None:
    """Checks a task run's config (``data.source=synthetic:<task>``); raises a one-line
    ``ValueError`` naming the field.

    A task run is a causal LM (greedy generation needs one); ``train.seq_len`` is the longest
    training length and every ``eval.lengths`` entry a length the task can produce; an encoder
    with a position table must cover the longest row it is trained on, and randomized positions
    must have a range that covers the longest row evaluated.
    """
    task = task_of(config)
    spec = f"data.source={config.data.source!r}"
    if task not in synthetic.TASKS:
        raise ValueError(f"{spec}: unknown task {task!r}; tasks: {', '.join(synthetic.TASKS)}")
    if objective(config) != "causal_lm":
        raise ValueError(
            f"train.objective={objective(config)!r} does not apply to {spec}: a task is trained "
            "on its target tokens as a causal LM; use train.objective=causal_lm"
        )
    try:  # training draws the lengths in [1, train.seq_len] the task can produce
        synthetic.train_lengths(task, 1, config.train.seq_len)
    except ValueError as e:
        raise ValueError(f"train.seq_len={config.train.seq_len}: {e}") from None
    for length in eval_lengths(config):
        try:
            synthetic.check_length(task, length)
        except ValueError as e:
            raise ValueError(f"eval.lengths: {e}") from None
    width = synthetic.train_width(task, config.train.seq_len)
    make_encoding(config).check_length(width)  # a learned table covers every training row
    if "randomized" in (config.train.positions, config.eval.positions):
        longest = max(
            [width] + [synthetic.row_width(task, length) for length in eval_lengths(config)]
        )
        if config.train.max_position < longest:
            raise ValueError(
                f"train.max_position={config.train.max_position} is below {longest}, the tokens "
                f"of the longest example (input, SEP and target) of {spec}; randomized "
                f"positions draw that many distinct positions: use train.max_position >= {longest}"
            )
    examples = config.eval.get("examples", 256)
    if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
        raise ValueError(f"eval.examples must be an integer >= 1, got {examples!r}")


@register
class SyntheticTask(CausalLM):
    """The synthetic length-generalisation tasks: a causal LM trained on generated examples'
    target tokens, scored per input length by accuracy and exact match."""

    name = "task"
    summary = "synthetic length-generalisation tasks, accuracy and exact match per input length"
    chosen_by = "data.source='synthetic:<task>'"
    precedence = 30
    objective = "causal_lm"

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return assembly(config) == "lm" and bool(task_of(config))

    def training_data(self, config: ml_collections.ConfigDict, mesh: Any) -> TrainingData:
        source = open_source(config)
        check_source(config, source, stream=False)  # examples are generated: no split to fill
        t = config.train
        batches = TaskBatches(
            task_of(config),
            t.seq_len,
            t.batch_size,
            config.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        return TrainingData(batches, source.info())

    def record(self, config: ml_collections.ConfigDict) -> dict[str, Any]:
        return {**super().record(config), "task": task_of(config)}

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    def open_evaluation(self, context: EvalContext) -> StreamInputs:
        """The data source; no split is read (examples are generated). The mesh is made as a
        text run's is (a ``config.mesh`` the devices cannot hold is refused), though the
        examples are scored on a replicated model."""
        config = context.config
        return StreamInputs(open_source(config), None, make_mesh(config))

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        """Fresh examples at each input length: accuracy, exact match and loss
        (:func:`evaluate_task`)."""
        config = context.config
        e = config.eval
        results = evaluate_task(
            context.model_on(None),
            task_of(config),
            eval_lengths(config),
            examples=e.examples,
            seed=config.seed,
            generate=e.generate,
            positions=stream.random_positions(config),
            progress=context.progress,
        )
        data = {"source": config.data.source, **short_info(context.inputs.source.info())}
        return {"data": data, "results": results}

    def announce_evaluation(self, config: ml_collections.ConfigDict, workdir: str) -> str:
        return f"evaluating {workdir} at {self.describe_evaluation(config)} (input lengths)"

    # -- config, plan and analysis

    reads_stream = False
    plan_eval = False  # examples are generated and scored by greedy generation
    weighted = True

    def validate(
        self,
        config: ml_collections.ConfigDict,
        *,
        num_devices: int | None = None,
        process_count: int = 1,
    ) -> None:
        """A causal LM's fields (:meth:`CausalLM.validate`), then the task's
        (:func:`validate_task`)."""
        super().validate(config, num_devices=num_devices, process_count=process_count)
        validate_task(config)

    def validate_masking(self, config: ml_collections.ConfigDict) -> None:
        # A masked objective is refused at the end (validate_task); what it needs of the model
        # is named first, as for a masked LM.
        validate_masked_objective(config)

    def memory_conflicts(self, config: ml_collections.ConfigDict) -> dict[str, bool]:
        return {
            f"data.source={config.data.source!r} (an algorithmic task: examples, not a "
            "stream)": True
        }

    def validate_eval_mode(self, config: ml_collections.ConfigDict) -> None:
        """No sliding evaluation: examples are scored whole."""
        if config.eval.mode == "sliding":
            raise ValueError(
                f"eval.mode='sliding' with data.source={config.data.source!r}: sliding "
                "evaluation does not apply to algorithmic-task runs, which are scored on whole "
                "examples per input length; leave eval.mode at 'nonoverlapping'"
            )

    def validate_pretrained_tokenizer(
        self, config: ml_collections.ConfigDict, tokenizer: str
    ) -> None:
        """Refused: tasks generate token ids."""
        raise ValueError(
            f"data.tokenizer={tokenizer!r} with data.source={config.data.source!r}: algorithmic "
            "tasks generate token ids, not text; use data.tokenizer='bytes'"
        )

    def plan_refusal(self, config: ml_collections.ConfigDict, parts: tuple[str, ...]) -> str | None:
        """``--only eval`` is refused: the examples are generated, no evaluation is planned."""
        if tuple(parts) == ("eval",):
            return (
                "posenc plan --only eval: this run has no evaluation to plan (an algorithmic "
                "task generates its examples); plan its training step"
            )
        return None

    def analysis_refusal(self, config: ml_collections.ConfigDict) -> str | None:
        return (
            f"is an algorithmic-task run (data.source={config.data.source!r}: examples, not a "
            "text stream); analyze reads text runs' evaluation windows"
        )

    # -- report

    report_writer = "posenc.report.tasks:write_task_report"
    report_precedence = 30
    report_runs = "algorithmic-task"
    report_metrics = ("accuracy", "exact_match", "sequence_accuracy", "loss")
    report_own_metrics = ("exact_match", "sequence_accuracy")
    report_metric_text = {
        "exact_match": "exact match of greedy generation (algorithmic tasks)",
        "sequence_accuracy": "per-token accuracy averaged per example (algorithmic tasks)",
    }
    report_lm_beside = False  # a task report covers task runs only

    def owns_eval(self, report: dict[str, Any]) -> bool:
        return bool(report.get("task"))

    def report_evaluation(self, reports: list[dict[str, Any]]) -> str | None:
        """Generated examples per input length, not windows."""
        if not all(self.owns_eval(r) for r in reports):
            return None
        examples = sorted({x["examples"] for r in reports for x in r["results"] if "examples" in x})
        return (
            f"{'/'.join(map(str, examples))} generated examples per input length"
            " (drawn from a seed of their own, not training's)"
        )
