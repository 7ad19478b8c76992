"""A kind of run that posenc does not have, in one file, for the plugin test: counting.

Each row counts up by one from a random start, modulo ``model.vocab_size``; a decoder-only model
learns to continue it, and evaluation scores next-token accuracy at every evaluation length. The
test registers it through the ``posenc.kinds`` entry points, as a third-party package would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from posenc.kinds import EvalContext, RunKind, StepLoss, TrainingData, register
from posenc.kinds.common import eval_lengths, require_int
from posenc.models.losses import token_loss

REPO = Path(__file__).resolve().parents[2]


def counting_rows(seed: int, step: int, rows: int, length: int, vocab: int) -> np.ndarray:
    """``rows`` count-ups of ``length + 1`` tokens, deterministic in (seed, step)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, vocab, size=(rows, 1))
    return ((starts + np.arange(length + 1)) % vocab).astype(np.int32)


class CountingBatches:
    """Training batches of count-ups, a function of (seed, step)."""

    def __init__(self, config: ml_collections.ConfigDict):
        self.config = config

    def batch(self, step: int) -> dict[str, np.ndarray]:
        t = self.config.train
        rows = counting_rows(self.config.seed, step, t.batch_size, t.seq_len, self.vocab)
        return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}

    @property
    def vocab(self) -> int:
        return self.config.model.vocab_size


@register
class Counting(RunKind):
    name = "counting"
    summary = "continue a count-up modulo the vocabulary; next-token accuracy by length"
    chosen_by = "train.objective='counting'"
    precedence = 20
    objective = "counting"
    report_writer = "toy_kind:write_counting_report"
    report_metrics = ("accuracy",)

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return config.train.get("objective") == "counting"

    def validate(self, config, *, num_devices=None, process_count=1) -> None:
        require_int("train.seq_len", config.train.seq_len, 2)
        require_int("train.batch_size", config.train.batch_size)
        require_int("train.steps", config.train.steps)
        if not config.model.get("causal", True):
            raise ValueError("model.causal must be True for train.objective='counting'")

    def training_data(self, config, mesh) -> TrainingData:
        return TrainingData(CountingBatches(config), {"source": "counting"})

    def loss(self, config, model, batch, rng, memory=None) -> StepLoss:
        losses = token_loss(model(batch["inputs"], rng=rng), batch["targets"])
        tokens = batch["targets"].size
        return StepLoss(losses.mean(), losses.sum(), tokens, tokens)

    def evaluate(self, context: EvalContext) -> dict[str, Any]:
        config = context.config
        model = context.model_on()
        results = []
        for length in eval_lengths(config):
            rows = counting_rows(config.seed + 1, 0, 8, length, config.model.vocab_size)
            logits = model(jnp.asarray(rows[:, :-1]))
            hits = jax.device_get(jnp.argmax(logits, -1) == rows[:, 1:])
            results.append({"length": length, "accuracy": float(np.mean(hits)), "rows": 8})
        return {"data": {"source": "counting"}, "results": results}

    def example_config(self, folder: str) -> ml_collections.ConfigDict:
        from posenc.runs.config import apply_overrides, load_config

        return apply_overrides(
            load_config(f"{REPO / 'configs' / 'base.py'}:tiny"),
            [
                "train.objective=counting",
                "model.num_layers=1",
                "model.model_dim=32",
                "model.num_heads=2",
                "model.mlp_dim=64",
                "model.vocab_size=64",
                "model.dtype=float32",
                "train.seq_len=16",
                "train.batch_size=4",
                "train.steps=3",
                "train.log_every=1",
                "train.checkpoint_every=3",
                "train.progress=False",
                "optim.warmup_steps=1",
                "eval.lengths=16,32",
            ],
        )


def write_counting_report(sweep_dir: str, runs: list, metric: str | None) -> list[str]:
    """``report.md``: next-token accuracy per evaluation length, one row per run."""
    lengths = sorted({r["length"] for run in runs for r in run.eval["results"]})
    lines = [
        "# Counting: next-token accuracy by length",
        "",
        "| run | encoding | " + " | ".join(f"L={n}" for n in lengths) + " |",
        "|---|---|" + "---|" * len(lengths),
    ]
    for run in runs:
        by_length = {r["length"]: r["accuracy"] for r in run.eval["results"]}
        cells = [f"{by_length[n]:.3f}" if n in by_length else "-" for n in lengths]
        lines.append(f"| {Path(run.dir).name} | {run.encoding} | " + " | ".join(cells) + " |")
    path = Path(sweep_dir) / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return [str(path)]
