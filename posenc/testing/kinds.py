"""The run-kind contract as an importable battery: every registered kind of run trains, resumes,
evaluates, plans, reports and refuses another kind's config.

posenc's own suite runs it over ``posenc.kinds.names()``, so a kind is tested the day it is
registered, a plugin's too. A kind is run on a tiny config: posenc's own kinds on the repository's
``tiny`` configs shrunk further (:data:`EXAMPLES`), any other kind on the one its
``example_config(folder)`` gives (:meth:`posenc.kinds.RunKind.example_config`)::

    from posenc.testing import kinds as kind_battery
    kind_battery.check_kind("my_kind", tmp_path)   # all checks; one AssertionError lists failures

The checks (each ``check(kind, config, folder)``):

===================  ==========================================================================
``declarations``     ``name``, ``summary``, ``chosen_by`` and ``objective`` are given, the kind
                     claims its example config and :func:`posenc.kinds.kind_of` chooses it
``resumes``          a run stopped after step 1 and resumed ends with the parameters and
                     metrics of an uninterrupted run, bit for bit; its losses are finite
``evaluates``        ``evaluate_workdir`` writes ``eval.json`` with the common fields, the
                     kind's :meth:`~posenc.kinds.RunKind.record` and results
``plans``            ``posenc plan`` compiles the kind's training step and states its memory
``reports``          ``posenc report`` over the run writes a report that names it
``refuses_others``   the config of every other registered kind is refused where a command
                     needs this kind (:func:`posenc.kinds.require`), in one line naming both
===================  ==========================================================================
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from posenc import kinds
from posenc.kinds.base import RunKind

_REPO = Path(__file__).resolve().parents[2]
_CONFIGS = _REPO / "configs"

# What shrinks every example to a run of seconds on one CPU core.
_SHRINK = (
    "model.num_layers=1",
    "model.model_dim=32",
    "model.num_heads=2",
    "model.mlp_dim=64",
    "model.dtype=float32",
    "train.steps=3",
    "train.log_every=1",
    "train.checkpoint_every=3",
    "train.progress=False",
    "optim.warmup_steps=1",
)
_LM = (*_SHRINK, "train.seq_len=16", "train.batch_size=4", "eval.batch_tokens=64")

#: posenc's own kinds: ``(config spec under configs/, overrides)``; ``{data}`` is replaced by
#: the battery's data folder. A plugin's kind gives ``example_config(folder)`` instead.
EXAMPLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "causal_lm": (
        "base.py:tiny",
        (*_LM, "data.data_dir={data}", "eval.lengths=16,32", "eval.max_tokens=128"),
    ),
    "masked_lm": (
        "classify.py:mlm_tiny",
        (*_LM, "data.data_dir={data}", "eval.lengths=16,32", "eval.max_tokens=128"),
    ),
    "task": (
        "tasks.py:tiny",
        (
            *_SHRINK,
            "data.source=synthetic:reverse_string",
            "train.seq_len=8",
            "train.batch_size=4",
            "eval.lengths=8,16",
            "eval.examples=8",
        ),
    ),
    "translation": (
        "translation.py:tiny",
        (
            *_SHRINK,
            "model.num_encoder_layers=1",
            "data.data_dir={data}",
            "train.tokens_per_batch=512",
            "data.max_src_len=24",
            "data.bucket_step=4",
            "eval.bucket_step=4",
            "eval.beam_size=2",
            "eval.max_sentences=8",
        ),
    ),
    "classification": (
        "classify.py:tiny",
        (*_SHRINK, "data.data_dir={data}", "train.seq_len=32", "train.batch_size=4"),
    ),
}


def example_config(kind: RunKind, folder: str | os.PathLike[str]) -> ml_collections.ConfigDict:
    """The tiny config the battery runs ``kind`` on, reading data under ``folder``.

    Raises:
      AssertionError: a kind posenc does not know that gives no ``example_config``.
    """
    from posenc.runs.config import apply_overrides, load_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    own = kind.example_config(str(folder))
    if own is not None:
        return own
    if kind.name not in EXAMPLES:
        raise AssertionError(
            f"run kind {kind.name!r} gives no example config: define example_config(folder) on "
            f"{type(kind).__qualname__} (a tiny config of the kind, its data written under folder)"
        )
    spec, overrides = EXAMPLES[kind.name]
    data = folder / "data"
    if any("{data}" in o for o in overrides) and kind.name in ("causal_lm", "masked_lm"):
        from posenc import data as data_lib

        if not (data / "pystdlib").exists():
            data_lib.prepare("pystdlib", data)
    return apply_overrides(
        load_config(f"{_CONFIGS / spec}"), [o.replace("{data}", str(data)) for o in overrides]
    )


def _param_leaves(model: Any) -> dict[str, np.ndarray]:
    import jax
    from flax import nnx

    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}


def _metrics(workdir: str) -> list[dict[str, Any]]:
    from posenc.workdir.metrics import read_metrics

    timing = ("time", "tokens_per_s", "step_time_s")
    return [{k: v for k, v in line.items() if k not in timing} for line in read_metrics(workdir)]


def check_declarations(kind: RunKind, config: ml_collections.ConfigDict, folder: Path) -> None:
    for field in ("name", "summary", "chosen_by", "objective"):
        value = getattr(kind, field)
        assert isinstance(value, str) and value, f"{kind.name}: `{field}` is not given"
    assert isinstance(kind.precedence, int), f"{kind.name}: `precedence` must be an int"
    assert kind.claims(config), f"{kind.name} does not claim its own example config"
    chosen = kinds.kind_of(config)
    assert chosen is kind, (
        f"{kind.name}'s example config is run by {chosen.name!r} (precedence {chosen.precedence} "
        f"<= {kind.precedence}): lower {kind.name}'s precedence or narrow {chosen.name}'s claims"
    )


def _trained(config: ml_collections.ConfigDict, folder: Path) -> str:
    """The example run trained to the end in ``folder/full`` (once per folder)."""
    from posenc.runs.train import train

    workdir = folder / "full"
    if not (workdir / "checkpoints").exists():
        train(config, str(workdir))
    return str(workdir)


def check_resumes(kind: RunKind, config: ml_collections.ConfigDict, folder: Path) -> None:
    from posenc.models.restore import load_model
    from posenc.runs.train import train

    full = _trained(config, folder)
    cut = str(folder / "cut")
    first = train(config, cut, stop_at=1)
    assert first.step == 1, f"{kind.name}: stop_at=1 stopped at step {first.step}"
    second = train(config, cut)
    assert second.resumed_from == 1, f"{kind.name}: the second call did not resume from step 1"
    lines = _metrics(full)
    assert lines and all(math.isfinite(line["loss"]) for line in lines), (
        f"{kind.name}: non-finite or missing training losses {lines}"
    )
    assert _metrics(cut) == lines, f"{kind.name}: the resumed run's metrics differ"
    want, got = _param_leaves(load_model(full)), _param_leaves(load_model(cut))
    assert want.keys() == got.keys(), f"{kind.name}: the resumed run has other parameters"
    for key in want:
        assert np.array_equal(want[key], got[key]), f"{kind.name}: {key} differs after resuming"


# What every eval.json holds, whatever the kind.
_COMMON = ("encoding", "objective", "train_steps", "checkpoint_step", "model", "file", "time")


def check_evaluates(kind: RunKind, config: ml_collections.ConfigDict, folder: Path) -> None:
    from posenc.runs.evaluate import evaluate_workdir

    workdir = _trained(config, folder)
    report = evaluate_workdir(workdir, progress=False)
    on_disk = json.loads((Path(workdir) / "eval.json").read_text())
    missing = [k for k in (*_COMMON, *kind.record(config)) if k not in on_disk]
    assert not missing, f"{kind.name}: eval.json lacks {missing}"
    assert on_disk["objective"] == kind.objective, (
        f"{kind.name}: eval.json records objective {on_disk['objective']!r}, the kind "
        f"declares {kind.objective!r}"
    )
    assert on_disk["checkpoint_step"] == config.train.steps, f"{kind.name}: not the last step"
    assert report["file"] == "eval.json"


def check_plans(kind: RunKind, config: ml_collections.ConfigDict, folder: Path) -> None:
    from posenc.runs.plan import plan

    result = plan(config, parts=("train",))
    assert result.peak > 0, f"{kind.name}: posenc plan states no memory for the training step"
    assert "train" in result.table(), f"{kind.name}: the plan's table names no training step"


def check_reports(kind: RunKind, config: ml_collections.ConfigDict, folder: Path) -> None:
    from posenc.report import write_report
    from posenc.runs.evaluate import evaluate_workdir

    workdir = _trained(config, folder)
    if not (Path(workdir) / "eval.json").exists():
        evaluate_workdir(workdir, progress=False)
    paths = write_report(workdir)
    text = Path(paths[0]).read_text()
    assert paths[0].endswith("report.md") and text.strip(), f"{kind.name}: no report written"
    encoding = config.encoding.name
    assert encoding in text, f"{kind.name}: the report does not name the run's encoder {encoding}"


def check_refuses_others(kind: RunKind, config: ml_collections.ConfigDict, folder: Path) -> None:
    for other in kinds.kinds():
        if other is kind:
            continue
        try:
            other_config = example_config(other, folder / f"other-{other.name}")
        except AssertionError:
            continue  # a kind without an example is reported by its own battery
        try:
            kinds.require(other_config, kind.name, f"a {kind.name} command")
        except ValueError as err:
            message = str(err)
            assert "\n" not in message, f"{kind.name}: a refusal of more than one line"
            assert kind.name in message and other.name in message, (
                f"{kind.name} refusing a {other.name} config does not name both kinds: {message}"
            )
        else:
            raise AssertionError(f"{kind.name} accepts the example config of {other.name}")
    kinds.require(config, kind.name, f"a {kind.name} command")  # its own is accepted


CHECKS: dict[str, Callable[[RunKind, ml_collections.ConfigDict, Path], None]] = {
    "declarations": check_declarations,
    "resumes": check_resumes,
    "evaluates": check_evaluates,
    "plans": check_plans,
    "reports": check_reports,
    "refuses_others": check_refuses_others,
}


def check_kind(kind: RunKind | str, folder: str | os.PathLike[str]) -> None:
    """Runs every check on ``kind`` (a registered name or an instance), in ``folder``; one
    ``AssertionError`` lists the failures."""
    kind = kinds.get(kind) if isinstance(kind, str) else kind
    folder = Path(folder)
    config = example_config(kind, folder)
    failures = []
    for name, check in CHECKS.items():
        try:
            check(kind, config, folder)
        except AssertionError as err:
            failures.append(f"{name}: {err}")
    if failures:
        raise AssertionError(f"run kind {kind.name!r} fails: " + "; ".join(failures))
