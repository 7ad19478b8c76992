"""DroPE against YaRN: a RoPE run continued without positions, beside RoPE scaled at evaluation.

Gelberg, Eguchi, Akiba and Cetin, *Extending the Context of Pretrained LLMs by Dropping Their
Positional Embeddings* (ICLR 2026; arXiv:2512.12167; code: github.com/SakanaAI/DroPE) claim that
a RoPE model whose rotations are removed after pretraining (NoPE) and *recalibrated* briefly at
its original length extends past that length zero-shot, beating RoPE under YaRN-style scaling
(and PI, NTK). The recipe here (:class:`Plan`), from the paper and its code:

- the recalibration continues the source run (:mod:`posenc.runs.drope`,
  ``train.drop_positions``) on the same data, at the same length and batch, for ``fraction`` of
  the source's steps: the paper recalibrates pretrained LLMs on 0.5-2 % of their pretraining
  tokens (Llama-2-7B: 10B tokens after 2T, its released config ``llama2_7b_drope.yaml``), so
  the default is 2 %, the top of that range, since a small model's schedule is short;
- its optimizer is fresh: a linear warmup over ``warmup_fraction`` of its steps (the code's
  trainer: ``warmup_ratio`` 0.03), then cosine decay, to a peak of ``lr_factor`` times the
  source's (Llama-2-7B: 1e-4 after a pretraining peak of 3e-4, so 1/3);
- nothing else changes: plain NoPE (the code's default ``attention_type: nope``; its
  ``qk_norm_nope`` variant adds fresh QK-norm scales, which this recipe does not), no change of
  the attention's scale;
- the comparison: the source RoPE run as it is, and under YaRN (Peng et al. 2023) at evaluation
  with ``factor = s`` (default the longest multiple evaluated) and ``original_max_len = L``, zero
  shot, as the paper's baselines are.

:func:`run` does it for one configuration and some seeds (``experiments/drope.py``);
:func:`recalibrate` and :func:`yarn_evaluated` are the parts other experiments reuse (the DroPE
row of ``experiments/recent_encoders.py``).

Layout of the experiment directory (each step skipped when done, resumed when interrupted)::

    rope-s<seed>/     RoPE trained at L: eval.json, eval-<yarn settings>.json
    drope-<n>steps-s<seed>/   DroPE: rope-s<seed> continued with NoPE for n steps (init.json)
    report.md, report.csv, perplexity_vs_length.png
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from posenc.report import Column, Run, markdown_table, plot_metric
from posenc.report.plots import line_colors
from posenc.report.tables import describe, footnote_lines, metric_heading, write_csv
from posenc.runs.config import apply_overrides, eval_lengths
from posenc.runs.drope import drop_positions
from posenc.runs.train import train
from posenc.studies.rope_extension import evaluated, scaling_overrides
from posenc.workdir import EVAL_FILE, RunDir

__all__ = [
    "Plan",
    "drope_dir_name",
    "recalibrate",
    "recalibration_config",
    "run",
    "write_report",
    "yarn_evaluated",
]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the recalibration is trained, and the YaRN baseline.

    Attributes:
      fraction: the recalibration's steps as a fraction of the source run's (at least one step).
      lr_factor: its peak learning rate as a multiple of the source's.
      warmup_fraction: its linear warmup as a fraction of its steps (at least one step).
      yarn_factor: YaRN's ``s`` (None: the longest evaluation length over the training length).
    """

    fraction: float = 0.02
    lr_factor: float = 1 / 3
    warmup_fraction: float = 0.03
    yarn_factor: int | None = None

    def __post_init__(self):
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction!r}")
        if not self.lr_factor > 0:
            raise ValueError(f"lr_factor must be > 0, got {self.lr_factor!r}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction!r}")
        if self.yarn_factor is not None and self.yarn_factor < 2:
            raise ValueError(f"yarn_factor must be an integer >= 2, got {self.yarn_factor!r}")

    def steps(self, source_steps: int) -> int:
        """The recalibration's optimizer steps for a source trained ``source_steps``."""
        return max(1, round(self.fraction * source_steps))


def drope_dir_name(plan: Plan, source_steps: int, seed: int) -> str:
    """The folder of the DroPE continuation of seed ``seed``'s RoPE run: by its steps, so that
    recalibrations of other lengths sit beside it."""
    return f"drope-{plan.steps(source_steps)}steps-s{seed}"


def recalibration_config(source_dir: str, plan: Plan = Plan()) -> ml_collections.ConfigDict:
    """The DroPE continuation of the run in ``source_dir``: its own config (data, length, batch,
    model, evaluation) with its encoder dropped (:func:`posenc.runs.drope.drop_positions`) and
    the recalibration's schedule (:class:`Plan`)."""
    source = RunDir(source_dir).read_config()
    steps = plan.steps(source.train.steps)
    overrides = [
        f"train.init_from={os.path.abspath(source_dir)!r}",
        f"train.steps={steps}",
        f"train.checkpoint_every={steps}",
        f"train.log_every={max(1, steps // 10)}",
        f"optim.warmup_steps={max(1, math.ceil(plan.warmup_fraction * steps))}",
        f"optim.learning_rate={source.optim.learning_rate * plan.lr_factor!r}",
    ]
    return drop_positions(apply_overrides(source, overrides))


def recalibrate(
    source_dir: str, workdir: str, plan: Plan = Plan(), *, progress: bool = True
) -> dict[str, Any]:
    """Trains the DroPE continuation of ``source_dir`` in ``workdir`` (skipped when finished,
    resumed when interrupted) and evaluates it at the source's lengths; returns its report."""
    config = recalibration_config(source_dir, plan)
    if not _finished(workdir, config):
        _say(progress, f"DroPE: {config.train.steps} steps from {source_dir} in {workdir}")
        train(config, workdir)
    return evaluated(workdir, config, progress)


def yarn_evaluated(
    rope_dir: str, factor: int | None = None, *, progress: bool = True
) -> dict[str, Any]:
    """The RoPE run in ``rope_dir`` evaluated at its lengths under YaRN with ``factor`` (None:
    its longest evaluation length over its training length) and ``original_max_len`` its
    training length (``eval-<settings>.json``, computed once)."""
    config = RunDir(rope_dir).read_config()
    train_len = config.train.seq_len
    factor = factor or max(2, max(eval_lengths(config)) // train_len)
    settings = apply_overrides(config, scaling_overrides("yarn", factor, train_len))
    _say(progress, f"RoPE under YaRN x{factor}: {rope_dir}")
    return evaluated(rope_dir, settings, progress)


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    plan: Plan = Plan(),
    *,
    seeds: Sequence[int] = (0,),
    progress: bool = True,
) -> list[str]:
    """Trains RoPE per seed, continues each with DroPE, scores RoPE as it is and under YaRN and
    writes the report (module docstring). Returns its paths (report.md first).

    Args:
      config: the source run: plain RoPE (``encoding.name = "rope"``, no scaling).
      workdir: the experiment directory.
      plan: the recalibration and the YaRN baseline.
      seeds: one source run (and its DroPE continuation) per seed.
      progress: print what is being done.
    """
    if config.encoding.name != "rope" or config.encoding.hparams.get("scaling"):
        raise ValueError("the source run must be plain RoPE (encoding.name=rope, no scaling)")
    rope, yarn, dropped = [], [], []
    for seed in seeds:
        source = apply_overrides(config, [f"seed={seed}"])
        rope_dir = os.path.join(workdir, f"rope-s{seed}")
        if not _finished(rope_dir, source):
            _say(progress, f"RoPE, seed {seed}: {source.train.steps} steps in {rope_dir}")
            train(source, rope_dir)
        rope.append(Run(rope_dir, evaluated(rope_dir, source, progress), {}))
        yarn.append(
            Run(rope_dir, yarn_evaluated(rope_dir, plan.yarn_factor, progress=progress), {})
        )
        drope_dir = os.path.join(workdir, drope_dir_name(plan, source.train.steps, seed))
        dropped.append(
            Run(drope_dir, recalibrate(rope_dir, drope_dir, plan, progress=progress), {})
        )
    factor = yarn[0].eval["changes"]["encoding.hparams.factor"]
    steps = dropped[0].eval.get("train_steps")
    columns = [
        Column("RoPE", rope),
        Column(f"RoPE + YaRN x{factor}", yarn),
        Column(f"DroPE ({steps} steps)", dropped),
    ]
    notes = [recipe_note(plan, config.train.steps, factor)]
    title = "DroPE against RoPE and YaRN"
    return write_report(workdir, columns, config.train.seq_len, title, notes)


def recipe_note(plan: Plan, source_steps: int, factor: int) -> str:
    """One line of the report saying what the DroPE and YaRN columns are."""
    steps = plan.steps(source_steps)
    return (
        f"- DroPE: each RoPE run continued with NoPE for {steps} step{'s' * (steps != 1)} "
        f"({plan.fraction:.1%} of its {source_steps}), same data, length and batch, a fresh "
        f"AdamW warming up over {plan.warmup_fraction:.0%} of them to {plan.lr_factor:.2g} x the "
        f"RoPE run's peak learning rate, then cosine decay. YaRN: the RoPE runs at evaluation "
        f"with factor s = {factor} and original length L, zero-shot."
    )


def write_report(
    workdir: str,
    columns: Sequence[Column],
    train_len: int,
    title: str,
    notes: Sequence[str] = (),
    metric: str = "perplexity",
) -> list[str]:
    """``report.md`` (what was measured, ``notes``, the table), ``report.csv`` and the plot of
    ``metric`` against evaluation length, in ``workdir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    footnotes: dict[str, dict[str, Any]] = {}
    runs = [run for column in columns for run in column.runs]
    md = [f"# {title}: {metric} by evaluation length", ""]
    md += describe(runs, list(columns)) + list(notes)
    md += ["", f"## Trained at L = {train_len}: {metric_heading(metric, runs)}", ""]
    md += markdown_table(columns, metric, footnotes) + [""]
    md += footnote_lines(footnotes)
    plot = os.path.join(workdir, f"{metric}_vs_length.png")
    plot_metric(plot, columns, train_len, metric, line_colors({train_len: list(columns)}))
    md.append(f"![{metric} against evaluation length]({os.path.basename(plot)})")
    paths = [os.path.join(workdir, "report.md"), os.path.join(workdir, "report.csv"), plot]
    with open(paths[0], "w") as f:
        f.write("\n".join(md) + "\n")
    write_csv(paths[1], {train_len: list(columns)}, metric)
    return paths


def _finished(workdir: str, config: ml_collections.ConfigDict) -> bool:
    """Whether ``workdir`` holds a run evaluated at its last step (``config.train.steps``)."""
    report = RunDir(workdir).read_eval(EVAL_FILE) if os.path.isdir(workdir) else None
    return bool(report and report.get("finished")) and (
        report.get("checkpoint_step") == config.train.steps
    )


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, flush=True)
