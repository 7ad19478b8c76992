"""Extending RoPE's context: zero-shot scaling at evaluation and short fine-tunes.

The comparison of YaRN (Peng et al. 2023, Tables 1-2) and position interpolation (Chen et al.
2023, Figure / Table 1) at the scale of one machine: RoPE is trained at length ``L`` and
evaluated at ``1 .. 16 x L``

- zero-shot, with the scaling modes as evaluation-time hyperparameters of the trained run (no
  retraining): none, ``linear`` (PI), ``ntk``, ``dynamic`` (dynamic NTK) and ``yarn``, each with
  ``factor = s`` and ``original_max_len = L``;
- after a short fine-tune at ``s x L`` from the trained parameters (``train.init_from``, a fresh
  optimizer) with PI and with YaRN, as both papers do (PI: 1000 steps; YaRN: 400).

Layout of the experiment directory (every step resumes or is skipped when run again)::

    base/                 RoPE trained at L: eval.json (no scaling), eval-<scaling>.json
    finetune-linear/      PI fine-tuned at s x L from base/
    finetune-yarn/        YaRN fine-tuned at s x L from base/
    report.md, report.csv, perplexity_vs_length.png
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from posenc.report import Column, Run, markdown_table, plot_metric
from posenc.report.plots import line_colors
from posenc.report.tables import describe, footnote_lines, metric_heading, write_csv
from posenc.runs.config import apply_overrides, eval_lengths, evaluation_changes
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import train
from posenc.workdir import RunDir, eval_file_name

# Zero-shot scaling modes (None: plain RoPE) and the modes fine-tuned, with their labels.
ZERO_SHOT = (None, "linear", "ntk", "dynamic", "yarn")
FINE_TUNED = ("linear", "yarn")
LABELS = {
    None: "none",
    "linear": "PI",
    "ntk": "NTK",
    "dynamic": "dynamic NTK",
    "yarn": "YaRN",
    "llama3": "Llama 3",
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What is fine-tuned, and how.

    Attributes:
      factor: the extension ``s``: fine-tuning length ``s x L`` and the scaling factor.
      finetune_steps: optimizer steps of each fine-tune.
      finetune_warmup: linear warmup steps of each fine-tune.
      finetune_learning_rate: peak learning rate of the fine-tunes (None: the base run's).
    """

    factor: int = 4
    finetune_steps: int = 200
    finetune_warmup: int = 20
    finetune_learning_rate: float | None = None

    def __post_init__(self):
        if not isinstance(self.factor, int) or self.factor < 2:
            raise ValueError(f"factor must be an integer >= 2, got {self.factor!r}")
        if not isinstance(self.finetune_steps, int) or self.finetune_steps < 1:
            raise ValueError(f"finetune_steps must be an integer >= 1, got {self.finetune_steps!r}")


def scaling_overrides(scaling: str | None, factor: int, train_len: int) -> list[str]:
    """The config overrides that put RoPE under ``scaling`` (none for plain RoPE)."""
    if scaling is None:
        return []
    return [
        f"encoding.hparams.scaling={scaling!r}",
        f"encoding.hparams.factor={factor}",
        f"encoding.hparams.original_max_len={train_len}",
    ]


def finetune_config(
    config: ml_collections.ConfigDict, scaling: str, base_dir: str, plan: Plan
) -> ml_collections.ConfigDict:
    """The fine-tune of ``base_dir`` at ``factor x L`` under ``scaling``: the same model, the
    same tokens per batch, evaluated at the base run's lengths."""
    t = config.train
    overrides = scaling_overrides(scaling, plan.factor, t.seq_len) + [
        f"train.init_from={os.path.abspath(base_dir)!r}",
        f"train.seq_len={t.seq_len * plan.factor}",
        f"train.batch_size={max(1, t.batch_size // plan.factor)}",
        f"train.steps={plan.finetune_steps}",
        f"train.checkpoint_every={plan.finetune_steps}",
        f"train.log_every={max(1, plan.finetune_steps // 10)}",
        f"optim.warmup_steps={plan.finetune_warmup}",
        f"eval.lengths={tuple(eval_lengths(config))!r}",
    ]
    if plan.finetune_learning_rate is not None:
        overrides.append(f"optim.learning_rate={plan.finetune_learning_rate!r}")
    return apply_overrides(config, overrides)


def evaluated(workdir: str, config: ml_collections.ConfigDict, progress: bool) -> dict[str, Any]:
    """The report of ``config``'s settings on a trained run, computed unless already there
    (finished)."""
    run = RunDir(workdir)
    name = eval_file_name(evaluation_changes(run.read_config(), config))
    existing = run.read_eval(name)
    if existing is not None and existing.get("finished"):
        return existing
    return evaluate_workdir(workdir, overrides=config, progress=progress)


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    plan: Plan = Plan(),
    *,
    progress: bool = True,
) -> list[str]:
    """Trains, fine-tunes and evaluates everything (see the module docstring); writes the report.

    Args:
      config: the base run: RoPE (``encoding.name = "rope"``, no scaling) at its length.
      workdir: the experiment directory.
      plan: the fine-tunes.
      progress: print what is being done.

    Returns:
      The paths of the report's files (report.md first).
    """
    if config.encoding.name != "rope" or config.encoding.hparams.get("scaling"):
        raise ValueError("the base run must be plain RoPE (encoding.name=rope, no scaling)")
    train_len = config.train.seq_len
    base_dir = os.path.join(workdir, "base")
    _say(progress, f"training RoPE at L = {train_len} in {base_dir}")
    train(config, base_dir)
    columns = []
    for scaling in ZERO_SHOT:
        settings = apply_overrides(config, scaling_overrides(scaling, plan.factor, train_len))
        _say(progress, f"zero-shot, scaling {LABELS[scaling]}")
        report = evaluated(base_dir, settings, progress)
        columns.append(Column(f"{LABELS[scaling]}", [Run(base_dir, report, {})]))
    for scaling in FINE_TUNED:
        tuned = finetune_config(config, scaling, base_dir, plan)
        tuned_dir = os.path.join(workdir, f"finetune-{scaling}")
        _say(progress, f"fine-tuning {LABELS[scaling]} at {tuned.train.seq_len} in {tuned_dir}")
        train(tuned, tuned_dir)
        report = evaluated(tuned_dir, tuned, progress)
        label = f"{LABELS[scaling]} fine-tuned"
        columns.append(Column(label, [Run(tuned_dir, report, {})]))
    return write_report(workdir, columns, train_len, plan)


def write_report(
    workdir: str, columns: Sequence[Column], train_len: int, plan: Plan, metric: str = "perplexity"
) -> list[str]:
    """``report.md`` (the table and what was measured), ``report.csv`` and the plot."""
    import matplotlib

    matplotlib.use("Agg")
    footnotes: dict[str, dict[str, Any]] = {}
    base = columns[0].runs
    md = [f"# RoPE context extension: {metric} by evaluation length", ""]
    md += describe(base, [Column("RoPE", base)])
    md.append(
        f"- Scaling: factor s = {plan.factor}, original length L = {train_len}. Zero-shot "
        "columns score the base run under each scaling; fine-tuned columns continue from it for "
        f"{plan.finetune_steps} steps at {plan.factor * train_len} tokens."
    )
    heading = metric_heading(metric, [run for column in columns for run in column.runs])
    md += ["", f"## Trained at L = {train_len}: {heading}", ""]
    md += markdown_table(columns, metric, footnotes) + [""]
    md += footnote_lines(footnotes)
    plot = os.path.join(workdir, f"{metric}_vs_length.png")
    colors = line_colors({train_len: list(columns)})
    plot_metric(plot, columns, train_len, metric, colors)
    md.append(f"![{metric} against evaluation length]({os.path.basename(plot)})")
    paths = [os.path.join(workdir, "report.md"), os.path.join(workdir, "report.csv"), plot]
    with open(paths[0], "w") as f:
        f.write("\n".join(md) + "\n")
    write_csv(paths[1], {train_len: list(columns)}, metric)
    return paths


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, flush=True)
