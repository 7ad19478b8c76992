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

    def claims(self, config: ml_collections.ConfigDict) -> bool:
        return assembly(config) == "lm" and objective(config) == "masked_lm"

    def windows(self, config: ml_collections.ConfigDict, stream: np.ndarray) -> Any:
        return MaskedWindows(super().windows(config, stream), masked_lm(config))

    # -- evaluation: what is scored, eval.json, CLI verbs and summaries

    def masking(self, config: ml_collections.ConfigDict) -> data_lib.MaskedLM:
        """BERT's rule, drawn from the seed, the length and the window's place in the stream."""
        return masked_lm(config)

    # -- config, plan and analysis

    # -- report
