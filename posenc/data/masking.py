"""The masked-LM objective of BERT (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional
Transformers for Language Understanding", Sec. 3.1 "Task #1: Masked LM").

Each token of a window is *chosen* with probability ``MASK_RATE = 0.15``, independently (as
Hugging Face's ``DataCollatorForLanguageModeling`` draws it; BERT's ``create_pretraining_data.py``
picks ``round(0.15 L)`` positions, the same rate). A chosen token is replaced by the mask token
with probability 0.8, by a random token with 0.1 and kept with 0.1. Random tokens are uniform
over the tokenizer's real ids ``[0, 257)`` (the 256 bytes and the document separator: never the
mask token, and posenc has no padding id). The model reads the corrupted window and is scored on
the chosen tokens only, against the original window itself (targets are not shifted).

The mask token is id ``MASK_ID = 257``, the first id after the byte tokenizer's, so a masked LM
needs ``model.vocab_size >= 258``.

Draws are pure functions, like the training windows and randomized positions: row ``r`` of the
global batch of training step ``s`` draws from ``(seed, step, r)`` (the row of the *global*
batch, so N processes corrupt exactly the batch one process would), and an evaluation window of
length ``L`` starting at stream offset ``o`` from ``(seed, L, o)`` (independent of batch size,
process count and which other windows are scored).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from posenc.data.tokenizer import VOCAB_SIZE

# The training objectives (config field train.objective).
OBJECTIVES = ("causal_lm", "masked_lm")
# The mask token: the first id after the byte tokenizer's 257 (bytes and the separator).
MASK_ID: int = VOCAB_SIZE
# BERT's rates: 15 % of the tokens chosen; of those 80 % masked, 10 % random, 10 % kept.
MASK_RATE = 0.15
MASK_TOKEN_SHARE = 0.8
RANDOM_TOKEN_SHARE = 0.1
# Streams of random numbers, apart from the windows' and the randomized positions' (0, 1).
_PURPOSES = {"train": 2, "eval": 3}


def corrupt(
    window: np.ndarray, key: Sequence[int], num_tokens: int = MASK_ID, mask_id: int = MASK_ID
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's corruption of one window, drawn from ``key``.

    Args:
      window: ``[L]`` integer token ids.
      key: integers seeding the draw (``np.random.default_rng(key)``).
      num_tokens: random replacements are uniform over ``[0, num_tokens)``.
      mask_id: the mask token.

    Returns:
      ``(inputs [L] int32, chosen [L] bool)``: the corrupted window, and which tokens are scored.
    """
    rng = np.random.default_rng(list(key))
    length = window.shape[0]
    chosen = rng.random(length) < MASK_RATE
    action = rng.random(length)  # [0, 0.8): mask, [0.8, 0.9): random, [0.9, 1): keep
    random_ids = rng.integers(0, num_tokens, length)
    inputs = np.asarray(window, np.int32).copy()
    masked = chosen & (action < MASK_TOKEN_SHARE)
    randomised = chosen & ~masked & (action < MASK_TOKEN_SHARE + RANDOM_TOKEN_SHARE)
    inputs[masked] = mask_id
    inputs[randomised] = random_ids[randomised]
    return inputs, chosen


@dataclasses.dataclass(frozen=True)
class MaskedLM:
    """Masked-LM batches of one run (its seed), for training and for evaluation.

    Attributes:
      seed: the run's seed (``config.seed``).
      num_tokens: random replacements are uniform over ``[0, num_tokens)`` (the tokenizer's ids).
      mask_id: the mask token.
    """

    seed: int
    num_tokens: int = MASK_ID
    mask_id: int = MASK_ID

    def train_batch(self, windows: np.ndarray, step: int, first_row: int = 0) -> dict:
        """A training batch from this process's windows of step ``step``.

        Args:
          windows: ``[b, L]`` int32 windows (rows ``first_row .. first_row + b - 1`` of the
            global batch).
          step: the training step.
          first_row: the global row of ``windows[0]`` (``process_index * local_batch``).

        Returns:
          ``{"inputs": [b, L] int32 corrupted, "targets": [b, L] int32 the windows,
          "weights": [b, L] float32 1.0 on the chosen tokens}``.
        """
        keys = [(self.seed, _PURPOSES["train"], step, first_row + r) for r in range(len(windows))]
        inputs, chosen = self._corrupt_rows(windows, keys)
        return {
            "inputs": inputs,
            "targets": np.asarray(windows, np.int32),
            "weights": chosen.astype(np.float32),
        }

    def eval_batch(self, batch: dict, length: int) -> dict:
        """An evaluation batch from :meth:`~posenc.data.EvalWindows.iter_batches`' (with
        ``with_starts=True``): the window is the inputs, corrupted; the targets are the window; the
        mask keeps the scored positions (``mask``) that were chosen; padding rows (start -1)
        choose nothing.

        Returns:
          ``{"inputs", "targets": [b, L] int32, "mask": [b, L] float32}``.
        """
        windows, starts = batch["inputs"], batch["starts"]
        # Padding rows (start -1) draw as window 0 would, then choose nothing.
        keys = [(self.seed, _PURPOSES["eval"], length, max(int(s), 0)) for s in starts]
        inputs, chosen = self._corrupt_rows(windows, keys)
        chosen &= (starts >= 0)[:, None]
        mask = batch["mask"] * chosen.astype(np.float32)
        return {"inputs": inputs, "targets": np.asarray(windows, np.int32), "mask": mask}

    def _corrupt_rows(self, windows: np.ndarray, keys) -> tuple[np.ndarray, np.ndarray]:
        rows = [
            corrupt(w, key, self.num_tokens, self.mask_id)
            for w, key in zip(windows, keys, strict=True)
        ]
        if not rows:
            empty = np.zeros(np.shape(windows), np.int32)
            return empty, empty.astype(bool)
        inputs, chosen = zip(*rows, strict=True)
        return np.stack(inputs), np.stack(chosen)
