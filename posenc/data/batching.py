"""Training windows sampled from a token stream, and evaluation windows that score every token.

Training: the start of every window is a pure function of (seed, step, row of the global
batch), so resuming needs only the step, and N processes together see exactly the batch one
process would.

Training with Transformer-XL memory (``model.mem_len > 0``): :class:`StreamSegments`, where each
row of the batch reads consecutive segments of its own part of the stream, so the memory a row
carries from one step to the next holds the tokens just before its segment.

Evaluation: windows of one length tile the stream so that each target token is scored exactly
once (non-overlapping, as in the ALiBi paper), or slide by a stride with only the last `stride`
targets of each window scored (the first window scores all of its targets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from posenc.data.base import SOURCE_FIELD

_SEQ_LEN_FIELD = "train.seq_len"
_EVAL_FIELD = "eval.lengths"


def _gather(stream: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Rows `stream[s : s + width]` for each start, as int32 `[len(starts), width]`."""
    index = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]  # [n, width]
    # Fancy indexing reads only the touched pages of a memory-mapped stream.
    return np.asarray(stream[index], dtype=np.int32)


def _check_shares(global_batch: int, seed: int, process_index: int, process_count: int) -> None:
    """The batch, seed and process arguments every training-batch source takes."""
    if global_batch < 1 or process_count < 1 or global_batch % process_count:
        raise ValueError(
            f"global batch {global_batch} must be a positive multiple of the process count "
            f"{process_count}"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")


class TrainWindows:
    """Random training windows, deterministic in (seed, step).

    Args:
      stream: uint16 token stream `[N]` (an array or a memory map).
      seq_len: tokens per training window.
      global_batch: windows per step over all processes.
      seed: non-negative integer seed.
      process_index: this process's index in [0, process_count).
      process_count: number of processes sharing the global batch.
    """

    def __init__(
        self,
        stream: np.ndarray,
        seq_len: int,
        global_batch: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if seq_len < 1:
            raise ValueError(f"{_SEQ_LEN_FIELD} must be positive, got {seq_len}")
        if len(stream) < seq_len + 1:
            raise ValueError(
                f"{_SEQ_LEN_FIELD}={seq_len} needs at least {seq_len + 1} tokens (inputs plus the "
                f"next-token target), but the {SOURCE_FIELD} training stream has {len(stream)}"
            )
        _check_shares(global_batch, seed, process_index, process_count)
        self.stream = stream
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.seed = seed
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch = global_batch // process_count

    def global_starts(self, step: int) -> np.ndarray:
        """Start offsets of all `global_batch` windows of a step.

        Args:
          step: non-negative training step.

        Returns:
          int64 `[global_batch]`, uniform in [0, N - seq_len - 1], the same in every process.
        """
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        rng = np.random.default_rng([self.seed, step])
        # High bound is exclusive: the last target of a window is stream[start + seq_len].
        return rng.integers(0, len(self.stream) - self.seq_len, size=self.global_batch)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of the global batch of `step`.

        Args:
          step: non-negative training step.

        Returns:
          {"inputs": int32 `[b, seq_len]`, "targets": int32 `[b, seq_len]`}, with
          b = global_batch // process_count, rows [process_index * b, (process_index + 1) * b)
          of the global batch; targets are the inputs shifted by one token.
        """
        lo = self.process_index * self.local_batch
        starts = self.global_starts(step)[lo : lo + self.local_batch]
        rows = _gather(self.stream, starts, self.seq_len + 1)  # [b, seq_len + 1]
        return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


class StreamSegments:
    """Consecutive training segments per batch row, for Transformer-XL memory (Dai et al. 2019).

    As in the paper's data order, the stream is cut into ``global_batch`` equal parts, one per
    row of the global batch; step ``s`` gives row ``r`` the ``(s mod n)``-th segment of part ``r``,
    where ``n`` is the number of whole segments in a part (one more token is needed for the
    last target). After ``n`` steps every row starts its part again and the memory is emptied.
    The parts start at a seed-dependent rotation of the stream (the stream read cyclically), so
    a batch is a pure function of (seed, step): resuming needs only the step, and N processes
    together see exactly the batch one process would.

    Args:
      stream: uint16 token stream `[N]` (an array or a memory map).
      seq_len: tokens per segment (``train.seq_len``).
      global_batch: rows per step over all processes.
      seed: non-negative integer seed.
      process_index: this process's index in [0, process_count).
      process_count: number of processes sharing the global batch.
    """

    def __init__(
        self,
        stream: np.ndarray,
        seq_len: int,
        global_batch: int,
        seed: int,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if seq_len < 1:
            raise ValueError(f"{_SEQ_LEN_FIELD} must be positive, got {seq_len}")
        _check_shares(global_batch, seed, process_index, process_count)
        part = len(stream) // global_batch
        if part < seq_len + 1:
            raise ValueError(
                f"{_SEQ_LEN_FIELD}={seq_len} with train.batch_size={global_batch}: consecutive "
                "segments (model.mem_len > 0 or train.order) need batch_size * (seq_len + 1) "
                f"tokens, one part of the stream per row, but the {SOURCE_FIELD} training stream "
                f"has {len(stream)}"
            )
        self.stream = stream
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.seed = seed
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch = global_batch // process_count
        self.segments_per_row = (part - 1) // seq_len
        offset = int(np.random.default_rng([seed, len(stream)]).integers(0, len(stream)))
        self.row_starts = offset + np.arange(global_batch, dtype=np.int64) * part  # [global_batch]

    def segment(self, step: int) -> int:
        """The index of step ``step``'s segment within each row's part."""
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        return step % self.segments_per_row

    def memory_tokens(self, step: int, mem_len: int) -> int:
        """Tokens of memory the rows carry into step ``step``: those read since the part began
        (none at its first segment), at most ``mem_len``."""
        return min(mem_len, self.segment(step) * self.seq_len)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of step ``step``: ``{"inputs", "targets"}``, int32
        `[global_batch // process_count, seq_len]`, targets shifted by one token."""
        lo = self.process_index * self.local_batch
        starts = self.row_starts[lo : lo + self.local_batch] + self.segment(step) * self.seq_len
        index = starts[:, None] + np.arange(self.seq_len + 1, dtype=np.int64)[None, :]
        rows = np.asarray(self.stream[index % len(self.stream)], dtype=np.int32)
        return {"inputs": rows[:, :-1], "targets": rows[:, 1:]}


# eq=False: comparing would compare (possibly huge) streams element-wise.
@dataclasses.dataclass(frozen=True, eq=False)
class EvalWindows:
    """Evaluation windows over a stream, materialised on access or batch by batch.

    Window k covers inputs `stream[s_k : s_k + length]` and targets shifted by one, with
    `s_k = k * stride`; window 0 scores all targets, later windows the last `stride` ones, so
    each target position in 1..scored_tokens is scored exactly once.

    Attributes:
      stream: the token stream `[N]`.
      length: window (context) length L.
      stride: distance S between window starts (S == L: non-overlapping).
      num_windows: number of windows n.
      scored_tokens: targets scored over all windows.
      dropped_tokens: predictable tokens (stream positions 1..N-1) not scored: the tail that
        cannot fill a stride, plus everything past a `max_windows` cap.
      capped_tokens: of those, the tokens left out by the `max_windows` cap (the rest is the
        tail).
    """

    stream: np.ndarray = dataclasses.field(repr=False)
    length: int
    stride: int
    num_windows: int
    scored_tokens: int
    dropped_tokens: int
    capped_tokens: int = 0

    @property
    def starts(self) -> np.ndarray:
        """int64 `[n]` start offsets of the windows."""
        return np.arange(self.num_windows, dtype=np.int64) * self.stride

    def _mask(self, window_ids: np.ndarray) -> np.ndarray:
        mask = np.zeros((len(window_ids), self.length), np.float32)
        mask[:, self.length - self.stride :] = 1.0
        mask[window_ids == 0, :] = 1.0
        return mask

    @property
    def inputs(self) -> np.ndarray:
        """int32 `[n, L]` (materialises every window)."""
        return _gather(self.stream, self.starts, self.length)

    @property
    def targets(self) -> np.ndarray:
        """int32 `[n, L]`, the inputs shifted by one token."""
        return _gather(self.stream, self.starts + 1, self.length)

    @property
    def mask(self) -> np.ndarray:
        """float32 `[n, L]`, 1.0 where a target is scored."""
        return self._mask(np.arange(self.num_windows))

    def iter_batches(
        self,
        batch_size: int,
        process_index: int = 0,
        process_count: int = 1,
        with_starts: bool = False,
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yields fixed-shape batches so that each evaluation length compiles once.

        The last batch is padded with rows of token 0 and mask 0. With several processes,
        `batch_size` is the global batch and each process gets its contiguous share of rows.

        Args:
          batch_size: windows per (global) batch.
          process_index: this process's index in [0, process_count).
          process_count: number of processes; must divide `batch_size`.
          with_starts: also yield "starts", int64 `[b]`, each row's window start in the stream (-1
            for padding rows), which masked-LM evaluation draws its masks from.

        Yields:
          {"inputs": int32 `[b, L]`, "targets": int32 `[b, L]`, "mask": float32 `[b, L]`}
          with b = batch_size // process_count.
        """
        if batch_size < 1 or batch_size % process_count:
            raise ValueError(
                f"eval batch {batch_size} must be a positive multiple of process count "
                f"{process_count}"
            )
        local = batch_size // process_count
        for first in range(0, self.num_windows, batch_size):
            ids = first + process_index * local + np.arange(local)
            real = ids < self.num_windows
            starts = np.where(real, ids, 0) * self.stride
            mask = self._mask(ids)
            mask[~real] = 0.0
            inputs = _gather(self.stream, starts, self.length)
            targets = _gather(self.stream, starts + 1, self.length)
            inputs[~real] = 0
            targets[~real] = 0
            batch = {"inputs": inputs, "targets": targets, "mask": mask}
            if with_starts:
                batch["starts"] = np.where(real, ids * self.stride, -1).astype(np.int64)
            yield batch


@dataclasses.dataclass(frozen=True, eq=False)
class MemorySegments:
    """Evaluation over a stream with Transformer-XL memory: ``rows`` parallel parts of the
    stream, each read as ``segments`` consecutive windows of ``length`` (every target of every
    window scored once); row ``r``'s window ``k`` covers inputs
    ``stream[r * part + k * length : ... + length]`` and the targets one token later. A model
    scores the windows of a row in order, carrying its memory from one to the next (the first
    window of a row has none).

    Attributes:
      stream: the token stream `[N]`.
      length: window (segment) length L.
      rows: parallel parts of the stream (rows of the batch that hold data).
      part: tokens per part.
      segments: windows per row.
      scored_tokens: ``rows * segments * length``.
      dropped_tokens: predictable tokens (stream positions 1..N-1) not scored.
      capped_tokens: of those, the tokens left out by the ``max_tokens`` cap.
    """

    stream: np.ndarray = dataclasses.field(repr=False)
    length: int
    rows: int
    part: int
    segments: int
    scored_tokens: int
    dropped_tokens: int
    capped_tokens: int = 0

    def iter_batches(
        self, batch_size: int, process_index: int = 0, process_count: int = 1
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yields window ``k`` of every row, ``k = 0 .. segments - 1``, as
        ``{"inputs", "targets": int32 [b, L], "mask": float32 [b, L]}`` with
        ``b = batch_size // process_count`` this process's rows; rows past ``self.rows`` pad
        the batch (token 0, mask 0)."""
        if batch_size < self.rows or batch_size % process_count:
            raise ValueError(
                f"memory evaluation batch {batch_size} must be >= {self.rows} rows and a multiple "
                f"of the process count {process_count}"
            )
        local = batch_size // process_count
        ids = process_index * local + np.arange(local)
        real = ids < self.rows
        starts = np.where(real, ids, 0) * self.part
        for k in range(self.segments):
            inputs = _gather(self.stream, starts + k * self.length, self.length)
            targets = _gather(self.stream, starts + k * self.length + 1, self.length)
            mask = np.repeat(real[:, None], self.length, axis=1).astype(np.float32)
            inputs[~real] = 0
            targets[~real] = 0
            yield {"inputs": inputs, "targets": targets, "mask": mask}


def memory_segments(
    stream: np.ndarray, length: int, rows: int, max_tokens: int = 0
) -> MemorySegments:
    """Cuts a stream into ``rows`` parts read as consecutive windows of ``length``.

    The windows scored are those the stream holds, or ``max_tokens // length`` of them (at
    least one); the parts are at most half as many, so that every part holds at least two
    consecutive windows whenever there are two to score (with one window per part no window
    would ever see the memory). The windows left over when the parts cannot share them evenly
    (fewer than one per part) are not scored, and counted as dropped.

    Args:
      stream: token stream `[N]`.
      length: window length L (one entry of `eval.lengths`).
      rows: parts wanted; fewer when the windows to score cannot give each part two.
      max_tokens: score at most this many tokens (but at least one window); 0: all.
    """
    predictable = len(stream) - 1
    if length < 1 or predictable < length:
        raise ValueError(
            f"{_EVAL_FIELD}: length {length} needs {length + 1} tokens for one window, but the "
            f"evaluation stream has only {len(stream)} tokens"
        )
    windows = predictable // length
    if max_tokens:
        windows = min(windows, max(1, max_tokens // length))
    rows = max(1, min(rows, windows // 2))
    part = predictable // rows
    whole = part // length
    segments = min(whole, windows // rows)
    scored = rows * segments * length
    capped = rows * (whole - segments) * length
    return MemorySegments(
        stream, length, rows, part, segments, scored, predictable - scored, capped
    )


def eval_windows(
    stream: np.ndarray,
    length: int,
    stride: int | None = None,
    max_windows: int | None = None,
) -> EvalWindows:
    """Cuts a stream into evaluation windows of one length.

    Args:
      stream: token stream `[N]` (array or memory map; windows are gathered lazily).
      length: window length L (one entry of `eval.lengths`).
      stride: S in [1, L]; None or L gives non-overlapping windows, S < L sliding windows with
        only the last S targets of each window scored (all targets of the first).
      max_windows: keep only the first this many windows (their tokens then count as dropped).

    Returns:
      The `EvalWindows`.
    """
    stride = length if stride is None else stride
    if length < 1:
        raise ValueError(f"{_EVAL_FIELD}: lengths must be positive, got {length}")
    if not 1 <= stride <= length:
        raise ValueError(
            f"eval stride {stride} must be in [1, {length}] for length {length}: a larger stride "
            "would leave tokens unscored"
        )
    predictable = len(stream) - 1  # Every position but the first can be a target.
    if predictable < length:
        raise ValueError(
            f"{_EVAL_FIELD}: length {length} needs {length + 1} tokens for one window, but the "
            f"evaluation stream has only {len(stream)} tokens"
        )
    n = whole = (predictable - length) // stride + 1
    if max_windows is not None:
        if max_windows < 1:
            raise ValueError(f"max_windows must be positive, got {max_windows}")
        n = min(n, max_windows)
    scored = length + (n - 1) * stride
    return EvalWindows(
        stream=stream,
        length=length,
        stride=stride,
        num_windows=n,
        scored_tokens=scored,
        dropped_tokens=predictable - scored,
        capped_tokens=(whole - n) * stride,
    )
