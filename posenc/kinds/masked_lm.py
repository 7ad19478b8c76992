"""Masked language modelling (BERT's objective) on a bidirectional model: windows of a token
stream with 15 % of their tokens chosen (80 % of those masked, 10 % random, 10 % kept), the loss
over the chosen tokens; evaluated on the same windows, corrupted as in training.

Chosen by ``train.objective="masked_lm"`` (with ``model.causal=False``).
"""

from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from posenc import data as data_lib
from posenc.kinds.causal_lm import CausalLM
from posenc.kinds.common import masked_lm, objective
from posenc.kinds.registry import register
from posenc.models.build import assembly


def validate_masked_objective(config: ml_collections.ConfigDict) -> None:
    """With ``train.objective="masked_lm"``: a bidirectional model (``model.causal=False``)
    and, with posenc's bytes, an id for the mask token in ``model.vocab_size``."""
    if objective(config) != "masked_lm":
        return
    m = config.model
    if m.get("causal", True):
        raise ValueError(
            "train.objective='masked_lm' needs model.causal=False: a masked LM reads the tokens "
            "on both sides of the masked ones"
        )
    bytes_ = config.data.get("tokenizer", "bytes") == "bytes"
    if bytes_ and m.vocab_size <= data_lib.MASK_ID:
        raise ValueError(
            f"model.vocab_size={m.vocab_size} has no id for the mask token of "
            f"train.objective='masked_lm' (id {data_lib.MASK_ID}); use model.vocab_size >= "
            f"{data_lib.MASK_ID + 1}"
        )


class MaskedWindows:
    """A stream's training windows, corrupted by BERT's rule (drawn per global row and step),
    in the interface of :class:`posenc.data.TrainWindows`: ``batch(step)`` gives ``inputs``
    (corrupted), ``targets`` (the windows) and ``weights`` (1 on the chosen tokens)."""

    def __init__(self, windows: Any, masking: data_lib.MaskedLM):
        self.windows = windows
        self.masking = masking
        self.process_index = windows.process_index
        self.local_batch = windows.local_batch

    def batch(self, step: int) -> dict[str, np.ndarray]:
        first_row = self.process_index * self.local_batch
        return self.masking.train_batch(self.windows.batch(step)["inputs"], step, first_row)

    def __getattr__(self, name: str) -> Any:  # the windows' other attributes (seq_len, ...)
        return getattr(self.windows, name)


@register
class MaskedLM(CausalLM):
    """BERT's masked-LM objective on a stream's windows."""

    name = "masked_lm"
    summary = "BERT's masked-LM objective on windows of a token stream, scored by length"
    chosen_by = "train.objective='masked_lm' with model.causal=False"
    precedence = 40
    objective = "masked_lm"
    predicts_next = False

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return assembly(config) == "lm" and objective(config) == "masked_lm"

    def windows(self, config: ml_collections.ConfigDict, stream: np.ndarray) -> Any:
        return MaskedWindows(super().windows(config, stream), masked_lm(config))

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    # -- config, plan and analysis

    weighted = True

    def validate_masking(self, config: ml_collections.ConfigDict) -> None:
        validate_masked_objective(config)

    def validate_pretrained_tokenizer(
        self, config: ml_collections.ConfigDict, tokenizer: str
    ) -> None:
        """The tokenizer must have a mask token (:func:`posenc.kinds.common.masked_lm`)."""
        masked_lm(config)

    def window_masking(self, config: ml_collections.ConfigDict) -> data_lib.MaskedLM | None:
        """BERT's rule, drawn from the seed, the length and the window's place in the stream, as
        training corrupts windows; what evaluation and ``posenc analyze`` apply."""
        return masked_lm(config)

    # -- report

    report_runs = "masked-LM"
    report_metrics = ("perplexity", "loss", "accuracy")
    report_own_metrics = ("accuracy",)
    report_metric_text = {"accuracy": "masked-LM accuracy (share of the masked tokens predicted)"}

    def owns_eval(self, report: dict[str, Any]) -> bool:
        return report.get("objective") == self.objective

    def report_notes(self, reports: list[dict[str, Any]]) -> list[str]:
        """The objective, and over which tokens loss, perplexity and accuracy are."""
        masked = [r for r in reports if self.owns_eval(r)]
        if not masked:
            return []
        some = "" if len(masked) == len(reports) else " (where the column says so)"
        return [
            f"- Objective: masked LM{some} (BERT's: 15 % of the tokens chosen, 80 % of those "
            "masked, 10 % random, 10 % kept); loss, perplexity and accuracy are over the chosen "
            "tokens."
        ]

    def report_refusal(self, metric: str, reports: list[dict[str, Any]], where: str) -> str | None:
        """Accuracy without a masked-LM run (causal LMs are scored by perplexity)."""
        if metric not in self.report_own_metrics or any(self.owns_eval(r) for r in reports):
            return None
        return (
            f"--metric {metric}: no masked-LM run (train.objective=masked_lm) under {where}; "
            "causal-LM runs have perplexity, bits_per_byte and loss"
        )
