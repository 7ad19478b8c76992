"""Batches of synthetic examples for a decoder-only model (numpy only).

A row is the byte ids of `input SEP target` shifted by one as for a causal LM, right-padded with
0 to a fixed `width` so that compiled shapes never change; the loss is on the target tokens only
(`weights`, as the masked-LM batches of `posenc.data.masking`)::

    ids      i_1 ... i_L  SEP  t_1 ... t_T
    inputs   i_1 ... i_L  SEP  t_1 ... t_{T-1}  0 ...
    targets  i_2 ... SEP  t_1  ...     t_T      0 ...
    weights  0   ...  0   1    ...     1        0 ...

Training lengths follow each paper's protocol (`train_batch`); every row is a pure function of
`(seed, step, global row)`, so a data-parallel process builds exactly its rows of the global
batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posenc.data.synthetic import tasks as _tasks
from posenc.data.tokenizer import SEP_ID

# How training lengths are drawn: one length per batch (Delétang et al. 2023's training loop
# draws one length per step from its curriculum, `experiments/training.py`) or one per row
# (Kazemnejad et al. 2023 shuffle a data set with equally many examples per length).
LENGTH_PER = ("batch", "row")
PAPER_LENGTH_PER = {"ruoss": "batch", "nope": "row", "retrieval": "row"}


def encode(
    pairs: Sequence[tuple[str, str]], width: int, *, weight_inputs: bool = False
) -> dict[str, np.ndarray]:
    """Encodes `(input, target)` pairs as causal-LM rows.

    Args:
      pairs: B pairs of strings whose characters are bytes (`ord(c) < 256`).
      width: the row width; at least `len(input) + len(target)` of every pair.
      weight_inputs: also weight the input's next-token predictions (a language model's loss
        over the whole row; the retrieval tasks train so, `Task.weight_inputs`).

    Returns:
      `{"inputs": [B, width] int32, "targets": [B, width] int32, "weights": [B, width] float32
      (1.0 exactly where `targets` holds a target symbol), "prompt_len": [B] int32
      (len(input) + 1: the tokens before the first target symbol, SEP included),
      "target_len": [B] int32}`.
    """
    b = len(pairs)
    inputs = np.zeros((b, width), np.int32)
    targets = np.zeros((b, width), np.int32)
    weights = np.zeros((b, width), np.float32)
    prompt_len = np.zeros((b,), np.int32)
    target_len = np.zeros((b,), np.int32)
    for r, (inp, tgt) in enumerate(pairs):
        n = len(inp) + len(tgt)
        if n > width:
            raise ValueError(
                f"synthetic batch width {width} is too small for an example of input length "
                f"{len(inp)} and target length {len(tgt)}; need at least {n}"
            )
        ids = np.fromiter((ord(c) for c in inp + tgt), np.int32, n)
        if n and ids.max() > 255:
            raise ValueError(f"synthetic example {inp!r} -> {tgt!r} has a non-byte character")
        seq = np.concatenate([ids[: len(inp)], [SEP_ID], ids[len(inp) :]])
        inputs[r, :n] = seq[:-1]
        targets[r, :n] = seq[1:]
        weights[r, 0 if weight_inputs else len(inp) : n] = 1.0
        prompt_len[r] = len(inp) + 1
        target_len[r] = len(tgt)
    return {
        "inputs": inputs,
        "targets": targets,
        "weights": weights,
        "prompt_len": prompt_len,
        "target_len": target_len,
    }


def row_width(task: str, length: int) -> int:
    """The width that fits every example of `length`: longest input + SEP + longest target."""
    return _tasks.max_input_length(task, length) + 1 + _tasks.max_target_length(task, length)


def train_lengths(task: str, min_length: int, max_length: int) -> list[int]:
    """The lengths in `[min_length, max_length]` that `task` can produce (error if none)."""
    _tasks.get_task(task)
    if min_length < 1 or max_length < min_length:
        raise ValueError(
            f"synthetic training lengths need 1 <= min_length <= max_length, got "
            f"[{min_length}, {max_length}]"
        )
    lengths = [n for n in range(min_length, max_length + 1) if _tasks.length_ok(task, n)]
    if not lengths:
        raise ValueError(
            f"synthetic task {task!r} has no examples with lengths in [{min_length}, "
            f"{max_length}]; allowed: {_tasks.get_task(task).allowed}"
        )
    return lengths


def train_width(task: str, max_length: int, *, min_length: int = 1) -> int:
    """The fixed width of `train_batch`'s rows: the widest `row_width` of the allowed lengths
    (`max_length + 1 + max_target_length(task, max_length)` for tasks whose input length is
    their length and `max_length` is allowed)."""
    return max(row_width(task, n) for n in train_lengths(task, min_length, max_length))


def _rows(batch_size: int, rows: slice | Sequence[int] | None) -> list[int]:
    all_rows = range(batch_size)
    if rows is None:
        return list(all_rows)
    selected = list(all_rows[rows]) if isinstance(rows, slice) else [int(r) for r in rows]
    bad = [r for r in selected if not 0 <= r < batch_size]
    if bad:
        raise ValueError(f"synthetic batch rows must lie in [0, {batch_size}), got {bad[0]}")
    return selected


def train_batch(
    task: str,
    batch_size: int,
    max_length: int,
    seed: int,
    step: int,
    *,
    min_length: int = 1,
    rows: slice | Sequence[int] | None = None,
    length_per: str | None = None,
) -> dict[str, np.ndarray]:
    """The training batch of step `step`, or its `rows`.

    Lengths are uniform over the lengths in `[min_length, max_length]` that the task can produce
    (equivalently, a length the task cannot produce is redrawn until it can). Ruoss et al. /
    Delétang et al. draw one length per batch (a function of `(seed, step)`); Kazemnejad et al.'s
    data sets mix lengths within a batch (one length per row, from `(seed, step, row)`).
    Each row's example is drawn from `(seed, step, row)` and its length.

    Args:
      task: a name in `TASKS`.
      batch_size: the global batch size.
      max_length: the longest training length (each paper's: `PAPER_LENGTHS[task][0]`).
      seed: >= 0.
      step: >= 0.
      min_length: the shortest training length.
      rows: the global rows to build (a slice or indices of `range(batch_size)`); None: all.
      length_per: "batch" or "row"; None follows the task's paper.

    Returns:
      `encode`'s dict for the chosen rows, `[b, train_width(task, max_length)]`, plus
      `"lengths": [b] int32`.
    """
    t = _tasks.get_task(task)
    length_per = length_per or PAPER_LENGTH_PER[t.paper]
    if length_per not in LENGTH_PER:
        raise ValueError(f"synthetic length_per={length_per!r}; allowed: {', '.join(LENGTH_PER)}")
    batch_size = _tasks.check_nonnegative("batch_size", batch_size)
    seed = _tasks.check_nonnegative("seed", seed)
    step = _tasks.check_nonnegative("step", step)
    lengths = train_lengths(task, min_length, max_length)
    width = train_width(task, max_length, min_length=min_length)
    selected = _rows(batch_size, rows)
    if length_per == "batch":
        rng = np.random.default_rng([seed, _tasks.TRAIN_LENGTH_STREAM, step])
        row_lengths = [lengths[int(rng.integers(0, len(lengths)))]] * len(selected)
    else:
        row_lengths = []
        for r in selected:
            rng = np.random.default_rng([seed, _tasks.TRAIN_LENGTH_STREAM, step, r])
            row_lengths.append(lengths[int(rng.integers(0, len(lengths)))])
    pairs = [
        _tasks.generate(task, n, (seed, _tasks.TRAIN_ROW_STREAM, step, r))
        for n, r in zip(row_lengths, selected, strict=True)
    ]
    batch = encode(pairs, width, weight_inputs=t.weight_inputs)
    batch["lengths"] = np.asarray(row_lengths, np.int32).reshape(len(selected))
    return batch


def eval_batch(
    task: str, length: int, n: int, seed: int, *, width: int | None = None
) -> dict[str, np.ndarray]:
    """`examples(task, length, n, seed)` encoded (`encode`), width `row_width(task, length)`
    unless given."""
    pairs = _tasks.examples(task, length, n, seed)
    return encode(pairs, row_width(task, length) if width is None else width)
