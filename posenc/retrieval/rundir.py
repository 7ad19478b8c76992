"""``posenc retrieval``: retrieval accuracy of a run directory, written beside the run.

Works on any decoder-only run that :func:`posenc.load_run` loads (trained here or imported),
with the run's own tokenizer (``run.tokenizer``: bytes, or a pretrained model's), under the
evaluation-time overrides ``posenc eval`` accepts (RoPE's PI / NTK / YaRN scaling, the attention
path, ...), so "does YaRN x4 retrieve at 4x?" is::

    posenc retrieval --workdir runs/llama --lengths 4096,16384 \\
        --config.encoding.hparams.scaling=yarn --config.encoding.hparams.factor=4

A run trained on a ``synthetic:`` retrieval task reads its answer after a document separator,
as it was trained; the separator is the prompt's last token (counted in its length).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posenc.retrieval import output as _output
from posenc.retrieval import qa as _qa
from posenc.retrieval import run as _run
from posenc.retrieval import score as _score
from posenc.retrieval.prompt import Haystack
from posenc.retrieval.tasks import get as get_task

DEFAULT_HAYSTACK = "pystdlib"


def _text_source(spec: str, data_dir: str | None, split: str):
    """``() -> (name, byte stream)`` of a text source's split, opened on first use."""
    opened: dict[str, Any] = {}

    def text() -> tuple[str, np.ndarray]:
        if "stream" not in opened:
            from posenc import data as data_lib

            if spec.startswith("synthetic:"):
                raise ValueError(
                    f"retrieval haystack {spec!r} is not text; use pystdlib, textdir:<folder> "
                    "or a prepared tfds: corpus"
                )
            source = data_lib.get_source(spec, data_dir=data_dir)
            opened["stream"] = source.split_stream(split)
        return f"{spec} ({split} split)", opened["stream"]

    return text


def _default_haystack(config: Any) -> str:
    """The run's data source when it is text, else ``pystdlib``."""
    own = config.data.source
    return DEFAULT_HAYSTACK if own.startswith("synthetic:") else own


def _settings(
    tasks: Sequence[str],
    lengths: tuple[int, ...],
    own_lengths: tuple[int, ...],
    depths: Sequence[float],
    trials: int,
    seed: int,
    haystack: str,
    own_haystack: str,
    threshold: float,
    qa_data: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The settings of a retrieval that differ from the command's defaults (its files' names,
    :func:`posenc.workdir.retrieval_names`): a retrieval at other lengths, tasks, depths,
    trials, seed, haystack or threshold is written beside the default one, not over it."""
    given = {
        "tasks": (tuple(tasks), ("passkey",)),
        "lengths": (lengths, own_lengths),
        "depths": (tuple(float(d) for d in depths), tuple(map(float, _run.DEFAULT_DEPTHS))),
        "trials": (int(trials), _run.DEFAULT_TRIALS),
        "seed": (int(seed), 0),
        "haystack": (haystack, own_haystack),
        "threshold": (float(threshold), float(_score.RULER_THRESHOLD)),
        "qa_data": (qa_data, ()),
    }
    return {name: value for name, (value, default) in given.items() if value != default}


def _check_model(config: Any, tasks: Sequence[str], lengths: Sequence[int]) -> None:
    """Refuses an encoder (or scaling) that greedy decoding through a key/value cache cannot
    reproduce, and lengths whose prompt and answer exceed the model's positions (a learned
    table), naming the field as the user sets it."""
    from posenc.encodings.registry import fields_as_set
    from posenc.models.build import layer_kinds, make_encoding

    # The model's encoder, and each layer kind's own (a pattern's layers each decode from it).
    named = [("encoding", make_encoding(config))]
    named += [(f"layers.kinds.{k.name}", k.encoding) for k in layer_kinds(config) if k.encoding]
    for where, encoding in named:
        try:
            with fields_as_set(encoding.name):
                encoding.check_cacheable()
        except ValueError as e:
            message = str(e).replace("encoding.hparams.", f"{where}.hparams.")
            raise ValueError(f"retrieval: {message}") from None
    # The fewest positions a trial takes: its prompt and the task's answer tokens. A length
    # that cannot hold them is refused now, not reported as "not scored" after the rest ran.
    answer = max(get_task(name).tokens_to_generate for name in tasks)
    too_long = []
    for length in lengths:
        try:
            for _, encoding in named:
                encoding.check_length(length + answer)
        except ValueError as e:
            too_long.append((length, str(e)))
    if too_long:
        bad = ", ".join(str(n) for n, _ in too_long)
        raise ValueError(
            f"retrieval cannot score length(s) {bad}: a trial takes the prompt and at least "
            f"{answer} generated tokens, and {too_long[0][1]}"
        )


def _check_layers_length(model: Any, length: int) -> None:
    """``check_length`` of every encoder the model's layers use (a pattern's kinds included)."""
    from posenc.decoding.lm import layer_encodings

    for _, encoding in layer_encodings(model):
        encoding.check_length(length)


def _check_prompt_lengths(
    config: Any, tasks: Sequence[str], lengths: Sequence[int], seed: int, trials: int, qa: Any
) -> None:
    """Refuses a length too short for a task's prompt in the run's tokenizer (as
    :class:`posenc.runs.trained.TrainedRun` makes it), before the checkpoint is read."""
    from posenc.data.hf_tokenizer import make_tokenizer

    tokenizer = make_tokenizer(config.data.get("tokenizer", "bytes"))
    prefix, suffix = _framing(config, tokenizer)
    _run.check_prompts(
        tasks, tokenizer, lengths, seed=seed, trials=trials, prefix=prefix, suffix=suffix, qa=qa
    )


def _qa_sources(qa_data: Mapping[str, str] | None) -> tuple[str, ...]:
    """The QA data sources given, as ``name=source`` strings (a record's and a file name's)."""
    return tuple(f"{k}={v}" for k, v in sorted((qa_data or {}).items()))


def _framing(config: Any, tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The tokens around every prompt: the tokenizer's BOS before it (if it has one), and a
    task run's separator after it (its model answers after SEP)."""
    from posenc.data.tokenizer import SEP_ID
    from posenc.kinds.tasks import task_of

    bos = getattr(tokenizer, "bos_id", None)
    return () if bos is None else (int(bos),), (SEP_ID,) if task_of(config) else ()


def check_retrieval(
    workdir: str,
    *,
    tasks: Sequence[str] = ("passkey",),
    lengths: Sequence[int] | None = None,
    depths: Sequence[float] = _run.DEFAULT_DEPTHS,
    trials: int = _run.DEFAULT_TRIALS,
    seed: int = 0,
    haystack: str | None = None,
    threshold: float = _score.RULER_THRESHOLD,
    overrides: Sequence[str] = (),
    qa_data: Mapping[str, str] | None = None,
) -> tuple[Any, tuple[int, ...], str, Any]:
    """Validates a retrieval request against the run's config before any checkpoint is read or
    any other work is done (``posenc eval --tasks`` calls it before perplexity).

    Returns:
      The config to evaluate with, the lengths (default the run's evaluation lengths), the
      haystack (default the run's data source when it is text, else ``pystdlib``) and the QA
      tasks' data (``dataset -> QAData``, :func:`posenc.retrieval.qa.loader`).

    Raises:
      ValueError: an unknown task, a threshold outside [0, 100], a bad length, depth or trial
        count, a run that is not a decoder-only LM, an encoder (or scaling) that cannot be
        decoded with a key/value cache, a synthetic haystack, a length whose
        prompt and answer do not fit the model's positions (a learned table) or that is too
        short for a task's prompt, naming it; QA data that is missing (saying how to prepare
        it), malformed or holds fewer questions than trials.
    """
    from posenc import kinds
    from posenc.runs.config import apply_overrides, eval_lengths, evaluation_changes, validate
    from posenc.workdir import RunDir

    for name in tasks:
        get_task(name)  # an unknown name is refused before the checkpoint is read
    _run.check_threshold(threshold)
    trained = RunDir(workdir).read_config()
    config = apply_overrides(trained, list(overrides))
    evaluation_changes(trained, config)  # refuses a change to what was trained
    validate(config)
    if not kinds.kind_of(config).retrieval:
        raise ValueError(
            f"{workdir} is a model.assembly={config.model.get('assembly', 'lm')!r} run; "
            "retrieval needs a decoder-only LM (model.assembly='lm')"
        )
    lengths = tuple(int(n) for n in (lengths or eval_lengths(config)))
    _run.check_request(tasks, lengths, depths, trials, threshold)
    haystack = _default_haystack(config) if haystack is None else haystack
    if haystack.startswith("synthetic:"):
        raise ValueError(
            f"retrieval haystack {haystack!r} is not text; use pystdlib, textdir:<folder> "
            "or a prepared tfds: corpus"
        )
    _check_model(config, tasks, lengths)
    qa = _qa.loader(qa_data, config.data.data_dir)
    _check_prompt_lengths(config, tasks, lengths, seed, trials, qa)
    return config, lengths, haystack, qa


def retrieval_workdir(
    workdir: str,
    *,
    tasks: Sequence[str] = ("passkey",),
    lengths: Sequence[int] | None = None,
    depths: Sequence[float] = _run.DEFAULT_DEPTHS,
    trials: int = _run.DEFAULT_TRIALS,
    seed: int = 0,
    haystack: str | None = None,
    batch_size: int = 16,
    threshold: float = _score.RULER_THRESHOLD,
    overrides: Sequence[str] = (),
    progress: bool = False,
    qa_data: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Scores a run's retrieval and writes ``retrieval.json`` (the record), ``retrieval.jsonl``
    (every trial), ``retrieval.md`` and the plots beside it; under changed evaluation settings,
    or at other lengths, tasks, depths, trials, seed, haystack or threshold than the defaults,
    ``retrieval-<changes and settings>.*`` (:func:`posenc.workdir.retrieval_names`), so no
    retrieval replaces another's.

    Args:
      workdir: a run directory.
      tasks: retrieval task names (:data:`posenc.retrieval.NAMES`).
      lengths: prompt lengths in the run's tokens; default the run's evaluation lengths.
      depths: needle depths in [0, 1].
      trials: trials per (task, length, depth).
      seed: the prompts' seed.
      haystack: the text source of ``essay`` haystacks (default: the run's data source when it
        is text, else ``pystdlib``); its validation split is read.
      batch_size: trials decoded together.
      threshold: the effective length's threshold in percent (RULER's 85.6), in [0, 100].
      overrides: evaluation-time ``field=value`` changes.
      progress: print one line per task and length.
      qa_data: the QA tasks' data, ``{"squad" or "hotpotqa": a JSON file or tfds:<name>}``
        (:mod:`posenc.retrieval.qa`; default SQuAD from ``tfds:squad/v2.0``).

    Returns:
      The record written, with the file names under ``"files"``.

    Raises:
      ValueError: as :func:`check_retrieval`, before the checkpoint is read.
    """
    from posenc.kinds.tasks import task_of
    from posenc.runs.config import eval_lengths
    from posenc.runs.evaluate import device_description
    from posenc.runs.trained import load_run
    from posenc.workdir import RunDir, atomic_write_bytes, retrieval_names, to_json, write_json

    _, lengths, haystack, qa = check_retrieval(
        workdir,
        tasks=tasks,
        lengths=lengths,
        depths=depths,
        trials=trials,
        seed=seed,
        haystack=haystack,
        threshold=threshold,
        overrides=overrides,
        qa_data=qa_data,
    )
    run = load_run(workdir, list(overrides))
    config = run.config
    asks_qa = any(get_task(name).dataset for name in tasks)  # --qa-data names their files
    task_run = task_of(config)
    tokenizer = run.tokenizer
    prefix, suffix = _framing(config, tokenizer)
    settings = _settings(
        tasks,
        lengths,
        tuple(int(n) for n in eval_lengths(config)),
        depths,
        trials,
        seed,
        haystack,
        _default_haystack(config),
        threshold,
        _qa_sources(qa_data) if asks_qa else (),
    )
    names = retrieval_names(run.changes, settings)
    lines: list[str] = []
    with RunDir(workdir).lock():
        start = time.time()
        record = _run.evaluate_retrieval(
            _run.model_generator(run.model),
            tokenizer,
            tasks,
            lengths,
            depths,
            trials=trials,
            seed=seed,
            haystack=Haystack(
                tokenizer, _text_source(haystack, config.data.data_dir, "validation"), qa
            ),
            batch_size=batch_size,
            prefix=prefix,
            suffix=suffix,
            stop_id=getattr(tokenizer, "sep_id", None),
            check_length=functools.partial(_check_layers_length, run.model),
            threshold=threshold,
            on_trial=lambda trial: lines.append(to_json(trial, indent=None)),
            progress=progress,
        )
        record = {
            "encoding": config.encoding.name,
            "encoding_hparams": config.encoding.hparams.to_dict(),
            "changes": run.changes,
            "train_seq_len": config.train.seq_len,
            "task_run": task_run,
            "checkpoint_step": run.step,
            "finished": run.finished,
            "tokenizer": config.data.get("tokenizer", "bytes"),
            "haystack": haystack,
            **({"qa_data": dict(qa_data or {})} if asks_qa else {}),
            "prompt_set": {"tasks": list(tasks), "seed": seed, "version": 1},
            "device": device_description(),
            "seconds": time.time() - start,
            **record,
            "files": names,
            "time": time.time(),
        }
        folder = RunDir(workdir)
        write_json(folder.file(names["json"]), record)
        atomic_write_bytes(folder.file(names["trials"]), "".join(x + "\n" for x in lines).encode())
        from posenc.report.retrieval import evaluation_label

        title = f"{evaluation_label(record)} (train {config.train.seq_len})"
        text = "\n".join(_output.markdown(record, title)) + "\n"
        atomic_write_bytes(folder.file(names["table"]), text.encode())
        atomic_write_bytes(folder.file(names["heatmap"]), _output.plot_heatmap(record, title))
        atomic_write_bytes(folder.file(names["curve"]), _output.plot_curve(record, title))
    return record


def attach_to_eval(workdir: str, report_name: str, record: dict[str, Any]) -> dict[str, Any]:
    """Adds a retrieval record's scores to an evaluation report (what ``posenc eval --tasks``
    writes into ``eval.json`` beside perplexity): per task and length, the mean over tasks, the
    effective length, the prompt set and the files holding the cells and every trial. Returns
    the summary added."""
    from posenc.workdir import RunDir

    summary = {
        "tasks": {
            name: {
                "by_length": [
                    {"length": r["length"], "score": r.get("score"), "error": r.get("error")}
                    for r in task["by_length"]
                ],
                "effective_length": task["effective_length"],
            }
            for name, task in record["tasks"].items()
        },
        "by_length": record["by_length"],
        "effective_length": record["effective_length"],
        "threshold": record["threshold"],
        "depths": record["depths"],
        "trials": record["trials"],
        "seed": record["seed"],
        "prompt_set": record["prompt_set"],
        "files": {"record": record["files"]["json"], "trials": record["files"]["trials"]},
    }
    run = RunDir(workdir)
    with run.lock():
        report = run.read_eval(report_name)
        report["retrieval"] = summary
        run.write_eval(report, report_name)
    return summary


def summary_lines(record: dict[str, Any], workdir: str) -> list[str]:
    """What ``posenc retrieval`` prints: the mean score per length, the effective length and the
    files written."""
    lines = [
        f"  length {r['length']:>6}: "
        + ("not scored" if r["score"] is None else f"{r['score']:.1f} %")
        for r in record["by_length"]
    ]
    effective = record["effective_length"]
    lines.append(f"effective length (> {record['threshold']} %): {effective or 'none'}")
    lines += [f"wrote {os.path.join(workdir, name)}" for name in record["files"].values()]
    return lines
