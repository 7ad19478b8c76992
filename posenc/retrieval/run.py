"""Retrieval accuracy by task, context length and needle depth.

:func:`evaluate_retrieval` runs ``trials`` trials per (task, length, depth) cell: each trial's
parts are a pure function of ``(task, length, seed, trial)`` (so a trial's key and needles are
the same at every depth), its prompt is exactly ``length`` tokens
(:mod:`posenc.retrieval.prompt`), and the trials of a cell are decoded together by one
``generate(prompts [B, L], num_new) -> [B, num_new]`` call: for a model, one prefill of the
``L`` prompt tokens and ``num_new - 1`` cached steps (:func:`model_generator` over
:func:`posenc.decoding.lm.greedy_generate`), never a recomputation of the prompt. The output is
the generated text up to the tokenizer's end-of-text id; it is scored as the task says
(:mod:`posenc.retrieval.score`). cwe's and fwe's prompts do not depend on the depth: their
trials are built and decoded once per length and recorded at every depth.

:func:`retrieval_workdir` does this for a run directory (trained or imported) through
:func:`posenc.load_run`, with the run's tokenizer, under evaluation-time overrides (RoPE's
scaling, ...), and writes the record, every trial as a JSON line, a table and the plots beside
the run (:func:`posenc.workdir.retrieval_names`).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posenc.retrieval import prompt as _prompt
from posenc.retrieval import score as _score
from posenc.retrieval import tasks as _tasks

# prompts [B, L] int32 and the tokens to generate -> [B, num_new] token ids.
Generate = Callable[[np.ndarray, int], np.ndarray]
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_TRIALS = 10


def model_generator(model: Any) -> Generate:
    """Greedy decoding of a causal :class:`~posenc.models.lm.Transformer` through its key/value
    cache (:func:`posenc.decoding.lm.greedy_generate`)."""
    import jax.numpy as jnp

    from posenc.decoding.lm import greedy_generate

    def generate(prompts: np.ndarray, num_new: int) -> np.ndarray:
        return np.asarray(greedy_generate(model, jnp.asarray(prompts, jnp.int32), num_new))

    return generate


def trial_rng(task: str, length: int, seed: int, trial: int) -> np.random.Generator:
    """The generator of one trial's draws (its key, needles and distractors)."""
    return np.random.default_rng([zlib.crc32(task.encode()), int(length), int(seed), int(trial)])


def check_threshold(threshold: float) -> float:
    """The effective length's threshold as a float; one-line ``ValueError`` unless it is a
    number in [0, 100] (a percentage: a score never leaves that range, so any other threshold
    makes every or no length effective)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.number):
        raise ValueError(f"retrieval --threshold must be a number, got {threshold!r}")
    if not 0 <= threshold <= 100:  # NaN fails too
        raise ValueError(
            f"retrieval --threshold must be a percentage in [0, 100] (RULER's is "
            f"{_score.RULER_THRESHOLD}), got {threshold!r}"
        )
    return float(threshold)


def check_request(
    names: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    trials: int,
    threshold: float = _score.RULER_THRESHOLD,
) -> tuple[list[_tasks.Task], list[int], list[float]]:
    """Validates a request; one-line ``ValueError`` for an unknown task, a length below 1, a
    depth outside [0, 1], a trial count below 1 or a threshold outside [0, 100]."""
    check_threshold(threshold)
    if not names:
        raise ValueError(f"retrieval tasks: name at least one of {', '.join(_tasks.NAMES)}")
    tasks = [_tasks.get(n) for n in names]
    bad = [
        n for n in lengths if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1
    ]
    if bad or not lengths:
        raise ValueError(f"retrieval lengths must be integers >= 1, got {list(lengths)!r}")
    if not isinstance(trials, int | np.integer) or isinstance(trials, bool) or trials < 1:
        raise ValueError(f"retrieval trials must be an integer >= 1, got {trials!r}")
    if not depths:
        raise ValueError("retrieval depths: give at least one depth in [0, 1]")
    return tasks, [int(n) for n in lengths], [_prompt.check_depth(d) for d in depths]


def evaluate_retrieval(
    generate: Generate,
    tokenizer: Any,
    task_names: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float] = DEFAULT_DEPTHS,
    *,
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    haystack: _prompt.Haystack | None = None,
    batch_size: int = 16,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
    stop_id: int | None = None,
    check_length: Callable[[int], None] | None = None,
    threshold: float = _score.RULER_THRESHOLD,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Scores retrieval by task, length and depth (module docstring).

    Args:
      generate: the model's greedy decoding (:data:`Generate`; :func:`model_generator`).
      tokenizer: ``encode(text) -> ids``, ``decode(ids) -> text``.
      task_names: names in :data:`posenc.retrieval.tasks.NAMES`.
      lengths: prompt lengths in the tokenizer's tokens.
      depths: needle depths in [0, 1].
      trials: trials per (task, length, depth) cell.
      seed: the seed of every draw.
      haystack: the filler (default: noise only, no text source) and the QA tasks' data
        (``Haystack(..., qa=posenc.retrieval.qa.loader(...))``).
      batch_size: trials decoded together at most.
      prefix, suffix: token ids before and after every prompt, counted in its length.
      stop_id: the end-of-text id; the output ends before it.
      check_length: raises ``ValueError`` for a total length (prompt + generated) the model
        cannot represent (a learned table's); such a length is refused before any decoding.
      threshold: the effective length's threshold, in percent.
      on_trial: called with each trial's record (``task``, ``length``, ``depth``, ``trial``,
        ``prompt``, ``answer``, ``output``, ``score``, ``correct``, ...).
      progress: print one line per (task, length).

    Returns:
      ``{"tasks": {name: {"cells": [...], "by_length": [...], "effective_length"}},
      "by_length": [{"length", "score"}], "effective_length", "threshold", ...}``; scores are
      percentages, means over trials (cells), depths (a task's length) and tasks (a length).
    """
    tasks, lengths, depths = check_request(task_names, lengths, depths, trials, threshold)
    haystack = haystack or _prompt.Haystack(tokenizer)
    record: dict[str, Any] = {"tasks": {}}
    # Every trial's draws first, so a length too short for any of them is refused before work.
    plan = {
        (task.name, length): _plan(task, tokenizer, haystack, length, seed, trials, prefix, suffix)
        for task in tasks
        for length in lengths
    }
    if check_length is not None:  # every trial fits the model's positions, or nothing runs
        _check_lengths(plan, check_length)
    for task in tasks:
        cells, by_length = [], []
        for length in lengths:
            num_new, drawn = plan[task.name, length]
            start = time.perf_counter()
            rows = outputs = None
            for depth in depths:
                if rows is None or task.has_depth:
                    rows = [
                        _trial_prompt(
                            task, drawn[t], length, depth, haystack, seed, t, prefix, suffix
                        )
                        for t in range(trials)
                    ]
                    outputs = _generate_all(generate, [r.ids for r in rows], num_new, batch_size)
                records = [
                    _trial_record(
                        task, length, depth, t, seed, row, drawn[t], out, tokenizer, stop_id
                    )
                    for t, (row, out) in enumerate(zip(rows, outputs, strict=True))
                ]
                for trial in records if on_trial is not None else ():
                    on_trial(trial)
                cells.append(_cell(length, depth, [r["score"] for r in records]))
            seconds = time.perf_counter() - start
            scores = [c["score"] for c in cells if c["length"] == length]
            by_length.append(
                {
                    "length": length,
                    "score": float(np.mean(scores)),
                    "trials_per_second": len(depths) * trials / max(seconds, 1e-9),
                    "seconds": seconds,
                }
            )
            if progress:
                print(
                    f"  {task.name:<16} length {length:>6}: {by_length[-1]['score']:6.1f} %  "
                    f"({len(depths) * trials} trials, {seconds:.1f}s)",
                    flush=True,
                )
        scored = {r["length"]: r["score"] for r in by_length if "score" in r}
        record["tasks"][task.name] = {
            "cells": cells,
            "by_length": by_length,
            "effective_length": _score.effective_length(scored, threshold),
            "metric": task.metric,
        }
    record["by_length"] = _average(record["tasks"], lengths)
    averages = {r["length"]: r["score"] for r in record["by_length"] if r["score"] is not None}
    record["effective_length"] = _score.effective_length(averages, threshold)
    record["threshold"] = threshold
    record["lengths"], record["depths"], record["trials"], record["seed"] = (
        lengths,
        depths,
        trials,
        seed,
    )
    return record


def _check_lengths(plan: dict[tuple[str, int], tuple[int, list]], check_length) -> None:
    """Refuses (one-line ``ValueError``) the lengths at which some task's prompt and answer do
    not fit the model's positions, naming them: a researcher asking for a length gets its
    score or a refusal, never a silent gap in the table."""
    refused: dict[int, str] = {}
    for (name, length), (num_new, _) in plan.items():
        try:
            check_length(length + num_new)
        except ValueError as e:
            refused.setdefault(length, f"{name} generates {num_new} tokens after the prompt: {e}")
    if refused:
        first = min(refused)
        raise ValueError(
            f"retrieval cannot score length(s) {', '.join(map(str, sorted(refused)))}: at "
            f"{first}, {refused[first]}"
        )


def _cell(length: int, depth: float, scores: list[float]) -> dict[str, Any]:
    """One (length, depth) cell: its trials, the correct ones and the mean score in percent."""
    return {
        "length": length,
        "depth": depth,
        "trials": len(scores),
        "correct": int(sum(x == 1.0 for x in scores)),
        "score": 100.0 * float(np.mean(scores)),
    }


def _plan(task, tokenizer, haystack, length, seed, trials, prefix, suffix) -> tuple[int, list]:
    """The trials' draws at one length and the tokens to generate: the task's count, or the
    longest answer's tokens plus 2 where that is more (a byte-level model spells a UUID).

    Raises:
      ValueError: ``length`` is shorter than some trial's prompt without filler, or longer than
        the text haystack can fill.
    """
    drawn, fixed = _drawn(task, tokenizer, length, seed, trials, prefix, suffix, haystack.qa)
    if task.haystack in ("words", "documents"):  # a pool too small for the length: refused now
        _trial_prompt(task, drawn[0], length, 0.0, haystack, seed, 0, prefix, suffix)
    if task.needs_text:  # tokenised now, once per length at most, and checked before any trial
        try:
            haystack.tokens(task.haystack, length - min(fixed))
        except ValueError as e:
            raise ValueError(f"retrieval length {length} ({task.name}): {e}") from None
    if task.metric == "part":  # any one answer scores
        longest = max(len(tokenizer.encode(" " + a)) for d in drawn for a in d.answers)
    else:
        longest = max(len(tokenizer.encode(" " + ", ".join(d.answers))) for d in drawn)
    return max(task.tokens_to_generate, longest + 2), drawn


def _drawn(
    task, tokenizer, length, seed, trials, prefix, suffix, qa=None
) -> tuple[list, list[int]]:
    """The trials' draws at one length and their prompts' tokens without filler; one-line
    ``ValueError`` when ``length`` cannot hold one of them. ``qa``: ``dataset -> QAData``."""
    data = None
    if task.dataset:
        if qa is None:
            raise ValueError(f"{task.name} needs its {task.dataset} data (--qa-data)")
        data = qa(task.dataset)
    drawn = [
        _tasks.draw(task, trial_rng(task.name, length, seed, t), length, qa=data, trial=t)
        for t in range(trials)
    ]
    fixed = [_prompt.fixed_tokens(tokenizer, d, prefix, suffix) for d in drawn]
    if length < max(fixed):
        raise ValueError(
            f"retrieval length {length} is too short for {task.name}: its prompts without filler "
            f"take up to {max(fixed)} tokens in this tokenizer; use lengths >= {max(fixed)}"
        )
    return drawn, fixed


def check_prompts(
    task_names: Sequence[str],
    tokenizer: Any,
    lengths: Sequence[int],
    *,
    seed: int = 0,
    trials: int = DEFAULT_TRIALS,
    prefix: Sequence[int] = (),
    suffix: Sequence[int] = (),
    qa: Callable[[str], Any] | None = None,
) -> None:
    """Refuses (one-line ``ValueError``) a length too short for some trial's prompt without
    filler, or QA data that is missing or holds fewer questions than trials, before a model is
    loaded (the tokenizer and the data alone decide it). ``qa``: ``dataset -> QAData``."""
    for name in task_names:
        for length in lengths:
            _drawn(_tasks.get(name), tokenizer, int(length), seed, trials, prefix, suffix, qa)


def _trial_prompt(task, draw, length, depth, haystack, seed, t, prefix, suffix):
    # A fresh generator for the distractors, the same at every depth of the trial.
    rng = trial_rng(task.name + "/haystack", length, seed, t)
    return _prompt.build(task, draw, length, depth, haystack, rng, prefix=prefix, suffix=suffix)


def _generate_all(generate, prompts, num_new, batch_size) -> list[np.ndarray]:
    """Generates for every prompt (one length), ``batch_size`` at a time; the last batch is
    padded with copies of its first prompt (one compiled shape)."""
    out = []
    for lo in range(0, len(prompts), batch_size):
        chunk = prompts[lo : lo + batch_size]
        n = len(chunk)
        batch = np.stack(chunk + [chunk[0]] * (min(batch_size, len(prompts)) - n))
        tokens = np.asarray(generate(batch, num_new))
        if tokens.shape != (len(batch), num_new):
            raise ValueError(
                f"generate returned shape {tokens.shape}, expected {(len(batch), num_new)}"
            )
        out += list(tokens[:n])
    return out


def _trial_record(task, length, depth, t, seed, row, draw, out, tokenizer, stop_id):
    """One trial as a JSON-able dict (``prompt`` is the text the model was given)."""
    ids = np.asarray(out)
    if stop_id is not None and (ids == stop_id).any():
        ids = ids[: int(np.argmax(ids == stop_id))]
    output = tokenizer.decode(ids)
    value = _score.score_output(task.metric, output, draw.answers)
    return {
        "task": task.name,
        "length": length,
        "depth": depth,
        "trial": t,
        "seed": seed,
        "prompt": tokenizer.decode(row.ids),
        "prompt_tokens": len(row.ids),
        "needle_token": row.answer_start,
        "answer": list(draw.answers),
        "output": output,
        "score": value,
        "correct": value == 1.0,
    }


def _average(per_task: dict[str, Any], lengths: Sequence[int]) -> list[dict[str, Any]]:
    """The mean over tasks of each length's score (None where a task could not be scored)."""
    rows = []
    for length in lengths:
        values = []
        for task in per_task.values():
            match = [r for r in task["by_length"] if r["length"] == length and "score" in r]
            values.append(match[0]["score"] if match else None)
        ok = all(v is not None for v in values)
        rows.append({"length": length, "score": float(np.mean(values)) if ok else None})
    return rows
