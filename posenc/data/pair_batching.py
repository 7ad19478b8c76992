"""Token-bucketed batches of translation pairs (fairseq / tensor2tensor style), for jitted steps.

Pairs are grouped into buckets by length, so that a batch has one of a small fixed set of shapes
and a jitted step compiles once per shape. The padded source lengths are a geometric series
(`bucket_boundaries`, tensor2tensor's `length_bucket_step`); bucket `k` pads sources to `b_k` and
targets to `ceil(r * b_k)`, where `r` is the median target/source length ratio of the data
(tensor2tensor pads both sides to the same length, r = 1, which wastes the shorter side when
one language is longer). A pair goes to the first bucket that fits both of its sides. A batch
of a bucket has `tokens_per_batch // max(S, T)` rows (rounded down to a multiple of
`row_multiple`), i.e. about `tokens_per_batch` tokens, as fairseq's `--max-tokens`.

Training batches are a pure function of (seed, step): epoch `e = step // batches_per_epoch` is a
permutation of the kept pairs drawn from `(seed, e)`, cut into batches bucket by bucket from the
shortest up, and visited in an order drawn from the same generator. The pairs left over at the
end of a bucket (too few for a full batch) move up into the next bucket, whose shape also fits
them, so only the last bucket may end with a batch completed by empty rows. Every kept pair is
in exactly one batch per epoch, and resuming at step `s` gives the batches an uninterrupted run
would have, whatever happened before.

A batch (padding on the right; PAD rows and columns are masked out):

    src      int32 [B, S]   source ids + EOS
    src_mask bool  [B, S]
    tgt_in   int32 [B, T]   BOS + target ids (decoder input)
    tgt_out  int32 [B, T]   target ids + EOS (what the decoder predicts)
    tgt_mask bool  [B, T]
    index    int64 [B]      the pair's index in the split (-1 for an empty row)

Lengths: a pair's source length is its number of text tokens (without EOS), the unit of
`max_src_len` and of the length buckets in evaluation; its padded row is one longer (EOS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from posenc.data.parallel import Pair
from posenc.data.vocab import Vocab

MAX_SRC_LEN_FIELD = "data.max_src_len"
TOKENS_FIELD = "train.tokens_per_batch"


@dataclasses.dataclass(frozen=True, eq=False)
class EncodedPairs:
    """The token ids of a split's pairs, as two ragged arrays (flat ids + offsets).

    Attributes:
      src_ids: int32 `[sum of source lengths]`, the source ids of every pair, concatenated.
      src_offsets: int64 `[n + 1]`; pair i's source is `src_ids[src_offsets[i]:src_offsets[i+1]]`.
      tgt_ids: int32, the target ids, concatenated.
      tgt_offsets: int64 `[n + 1]`.
      pad_id, bos_id, eos_id: the vocabulary's special ids.
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    pad_id: int
    bos_id: int
    eos_id: int

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        """int64 `[n]`: text tokens of each source (without EOS)."""
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        """int64 `[n]`: text tokens of each target (without BOS/EOS)."""
        return np.diff(self.tgt_offsets)

    def src(self, i: int) -> np.ndarray:
        """The source ids of pair i."""
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        """The target ids of pair i."""
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]


def _ragged(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32)
    return flat, offsets


def encode_pairs(pairs: Sequence[Pair], vocab: Vocab) -> EncodedPairs:
    """Encodes a split's pairs with `vocab` (no BOS/EOS: batches add them).

    Args:
      pairs: (source, target) texts.
      vocab: the vocabulary.

    Returns:
      The `EncodedPairs`.
    """
    src_ids, src_offsets = _ragged(vocab.encode_batch([s for s, _ in pairs]))
    tgt_ids, tgt_offsets = _ragged(vocab.encode_batch([t for _, t in pairs]))
    return EncodedPairs(
        src_ids, src_offsets, tgt_ids, tgt_offsets, vocab.pad_id, vocab.bos_id, vocab.eos_id
    )


def bucket_boundaries(max_length: int, min_length: int = 8, step: float = 1.1) -> np.ndarray:
    """Padded lengths: `min_length`, then each at least `step` times (and 1 more than) the last,
    the last one `max_length` (tensor2tensor's `_bucket_boundaries`, closed at the top).

    Args:
      max_length: the longest row to fit.
      min_length: the shortest padded length.
      step: growth factor (> 1).

    Returns:
      int64 `[k]`, increasing, the last `max(max_length, min_length)`.
    """
    if step <= 1.0:
        raise ValueError(f"bucket step must be > 1, got {step}")
    out = [max(1, min_length)]
    while out[-1] < max_length:
        out.append(max(out[-1] + 1, int(out[-1] * step)))
    if len(out) > 1:  # the last boundary need not overshoot: the one before is < max_length
        out[-1] = max_length
    return np.asarray(out, dtype=np.int64)


def _bucket(lengths: np.ndarray, boundaries: np.ndarray) -> np.ndarray:
    """Index of the smallest boundary >= each length."""
    return np.searchsorted(boundaries, lengths, side="left")


def _rows(tokens_per_batch: int, width: int, row_multiple: int) -> int:
    return max(row_multiple, (tokens_per_batch // width) // row_multiple * row_multiple)


def _fill(
    data: EncodedPairs, members: np.ndarray, rows: int, src_len: int, tgt_len: int, targets: bool
) -> dict[str, np.ndarray]:
    """A padded batch of `rows` rows holding the pairs `members` (the rest are empty rows)."""
    src = np.full((rows, src_len), data.pad_id, dtype=np.int32)
    index = np.full(rows, -1, dtype=np.int64)
    index[: len(members)] = members
    if targets:
        tgt_in = np.full((rows, tgt_len), data.pad_id, dtype=np.int32)
        tgt_out = np.full((rows, tgt_len), data.pad_id, dtype=np.int32)
    for r, i in enumerate(members):
        s = data.src(i)
        src[r, : len(s)] = s
        src[r, len(s)] = data.eos_id
        if targets:
            t = data.tgt(i)
            tgt_in[r, 0] = data.bos_id
            tgt_in[r, 1 : len(t) + 1] = t
            tgt_out[r, : len(t)] = t
            tgt_out[r, len(t)] = data.eos_id
    lengths = np.zeros(rows, dtype=np.int64)
    lengths[: len(members)] = data.src_lengths[members] + 1
    batch = {"src": src, "src_mask": np.arange(src_len)[None, :] < lengths[:, None]}
    if targets:
        tlen = np.zeros(rows, dtype=np.int64)
        tlen[: len(members)] = data.tgt_lengths[members] + 1
        batch.update(
            tgt_in=tgt_in, tgt_out=tgt_out, tgt_mask=np.arange(tgt_len)[None, :] < tlen[:, None]
        )
    batch["index"] = index
    return batch


def _check_shares(row_multiple: int, process_index: int, process_count: int) -> None:
    if row_multiple < 1 or process_count < 1 or row_multiple % process_count:
        raise ValueError(
            f"row multiple {row_multiple} must be a positive multiple of the process count "
            f"{process_count}"
        )
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")


def _local(batch: dict[str, np.ndarray], process_index: int, process_count: int) -> dict:
    b = len(batch["index"]) // process_count
    return {k: v[process_index * b : (process_index + 1) * b] for k, v in batch.items()}


class _Buckets:
    """Bucket shapes for a set of pairs: padded source lengths `b_k`, target lengths
    `ceil(ratio * b_k)`, and each pair's bucket (the first that fits both of its sides)."""

    def __init__(
        self,
        src_rows: np.ndarray,
        tgt_rows: np.ndarray,
        step: float,
        min_bucket: int,
        targets: bool,
    ):
        # The median ratio of the padded rows; a whole number of hundredths keeps shapes readable.
        ratio = float(np.median(tgt_rows / src_rows)) if targets else 0.0
        self.ratio = max(0.01, round(ratio, 2)) if targets else 0.0
        need = src_rows
        if targets:
            need = np.maximum(src_rows, np.ceil(tgt_rows / self.ratio - 1e-9).astype(np.int64))
        self.src_lengths = bucket_boundaries(int(need.max()), min_bucket, step)
        self.tgt_lengths = np.ceil(self.src_lengths * self.ratio - 1e-9).astype(np.int64)
        if targets:  # rounding may leave the longest target one short: widen the last bucket
            self.tgt_lengths[-1] = max(int(self.tgt_lengths[-1]), int(tgt_rows.max()))
        self.of = np.searchsorted(self.src_lengths, need, side="left")  # [n] bucket of each pair
        tgt_ok = tgt_rows <= self.tgt_lengths[self.of] if targets else True
        assert np.all(src_rows <= self.src_lengths[self.of]) and np.all(tgt_ok)

    def shape(self, k: int, tokens_per_batch: int, row_multiple: int) -> tuple[int, int, int]:
        s_len, t_len = int(self.src_lengths[k]), int(self.tgt_lengths[k])
        return _rows(tokens_per_batch, max(s_len, t_len), row_multiple), s_len, t_len


class PairBatches:
    """Training batches of about `tokens_per_batch` tokens, deterministic per (seed, step).

    Args:
      data: the encoded training pairs.
      tokens_per_batch: padded tokens per batch, `rows * max(S, T)` (global, over processes).
      seed: non-negative seed.
      row_multiple: every batch's row count is a multiple of this (the data-parallel width).
      max_src_len: keep only pairs whose source has at most this many tokens (train short);
        None keeps all.
      max_tgt_len: likewise for targets (bounds the largest shape); None keeps all.
      bucket_step: growth factor of the padded lengths (smaller: less padding, more shapes).
      min_bucket: the shortest padded source length.
      process_index: this process's index; it gets rows [i * B/P, (i+1) * B/P) of each batch.
      process_count: number of processes (must divide `row_multiple`).

    Attributes:
      kept: int64 `[n_kept]`, the indices of the pairs that pass the length filters.
      batches_per_epoch: batches that hold every kept pair once.
      bucket_shapes: {bucket: (rows, S, T)} of the buckets that hold pairs.
    """

    def __init__(
        self,
        data: EncodedPairs,
        tokens_per_batch: int,
        seed: int,
        *,
        row_multiple: int = 1,
        max_src_len: int | None = None,
        max_tgt_len: int | None = None,
        bucket_step: float = 1.1,
        min_bucket: int = 8,
        process_index: int = 0,
        process_count: int = 1,
    ):
        _check_shares(row_multiple, process_index, process_count)
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if tokens_per_batch < 1:
            raise ValueError(f"{TOKENS_FIELD} must be positive, got {tokens_per_batch}")
        src_len, tgt_len = data.src_lengths, data.tgt_lengths
        keep = np.ones(len(data), dtype=bool)
        if max_src_len is not None:
            keep &= src_len <= max_src_len
        if max_tgt_len is not None:
            keep &= tgt_len <= max_tgt_len
        if not keep.any():
            shortest = int(src_len.min()) if len(data) else 0
            raise ValueError(
                f"{MAX_SRC_LEN_FIELD}={max_src_len} (max_tgt_len={max_tgt_len}) keeps none of the "
                f"{len(data)} training pairs; the shortest source has {shortest} tokens"
            )
        self.data = data
        self.seed = seed
        self.process_index, self.process_count = process_index, process_count
        self.kept = np.flatnonzero(keep)
        # Padded rows hold the source's EOS, and the target's BOS (input) or EOS (output).
        self._buckets = _Buckets(
            src_len[self.kept] + 1, tgt_len[self.kept] + 1, bucket_step, min_bucket, True
        )
        self.length_ratio = self._buckets.ratio
        occupied, counts = np.unique(self._buckets.of, return_counts=True)
        self.bucket_shapes = {
            int(k): self._buckets.shape(int(k), tokens_per_batch, row_multiple) for k in occupied
        }
        # Batches per bucket: a pure function of the bucket sizes, so the same every epoch.
        self._batches: dict[int, int] = {}
        carry, last = 0, int(occupied[-1])
        for k, n in zip(occupied.tolist(), counts.tolist(), strict=True):
            rows = self.bucket_shapes[k][0]
            total = carry + n
            self._batches[k] = -(-total // rows) if k == last else total // rows
            carry = total - self._batches[k] * rows if k != last else 0
        self.batches_per_epoch = sum(self._batches.values())
        self._cached: tuple[int, list[tuple[int, np.ndarray]]] | None = None

    @property
    def shapes(self) -> list[tuple[int, int, int]]:
        """The distinct global batch shapes (rows, S, T), one per occupied bucket."""
        return sorted(set(self.bucket_shapes.values()))

    def epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """The batches of one epoch, in visiting order: (bucket, pair indices of its rows).

        Args:
          epoch: non-negative epoch.

        Returns:
          `batches_per_epoch` items; every kept pair is in exactly one of them.
        """
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.kept))
        buckets = self._buckets.of[order]
        plan: list[tuple[int, np.ndarray]] = []
        carry = np.zeros(0, dtype=np.int64)
        last = max(self.bucket_shapes)
        for k, (rows, _, _) in sorted(self.bucket_shapes.items()):
            # The leftovers of shorter buckets first, then this bucket's pairs in permuted order.
            members = np.concatenate([carry, self.kept[order[buckets == k]]])
            full = len(members) if k == last else len(members) // rows * rows
            plan.extend((k, members[i : min(i + rows, full)]) for i in range(0, full, rows))
            carry = members[full:]
        plan = [plan[i] for i in rng.permutation(len(plan))]
        self._cached = (epoch, plan)
        return plan

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of the batch of `step` (see the module docstring for the keys).

        Args:
          step: non-negative training step.

        Returns:
          The batch, with `rows // process_count` rows.
        """
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        epoch, k = divmod(step, self.batches_per_epoch)
        bucket, members = self.epoch_plan(epoch)[k]
        rows, s_len, t_len = self.bucket_shapes[bucket]
        batch = _fill(self.data, members, rows, s_len, t_len, targets=True)
        return _local(batch, self.process_index, self.process_count)

    def padding_report(self) -> dict[str, Any]:
        """Padded share of an epoch's slots (the same every epoch), per side and overall.

        Returns:
          {"pairs", "batches_per_epoch", "shapes", "length_ratio", "src_slots", "src_tokens",
          "tgt_slots", "tgt_tokens", "src_padding", "tgt_padding", "padding"}: slots are rows x
          padded length over all batches (empty rows included), tokens the real ones (EOS and
          BOS included); the paddings are 1 - tokens / slots.
        """
        src_slots = tgt_slots = 0
        for k, (rows, s_len, t_len) in self.bucket_shapes.items():
            src_slots += self._batches[k] * rows * s_len
            tgt_slots += self._batches[k] * rows * t_len
        src_tokens = int(np.sum(self.data.src_lengths[self.kept] + 1))
        tgt_tokens = int(np.sum(self.data.tgt_lengths[self.kept] + 1))
        return {
            "pairs": len(self.kept),
            "batches_per_epoch": self.batches_per_epoch,
            "shapes": len(self.shapes),
            "length_ratio": self.length_ratio,
            "src_slots": src_slots,
            "src_tokens": src_tokens,
            "tgt_slots": tgt_slots,
            "tgt_tokens": tgt_tokens,
            "src_padding": 1 - src_tokens / src_slots,
            "tgt_padding": 1 - tgt_tokens / tgt_slots,
            "padding": 1 - (src_tokens + tgt_tokens) / (src_slots + tgt_slots),
        }


def eval_pair_batches(
    data: EncodedPairs,
    tokens_per_batch: int,
    *,
    targets: bool = True,
    row_multiple: int = 1,
    bucket_step: float = 1.1,
    min_bucket: int = 8,
    process_index: int = 0,
    process_count: int = 1,
) -> list[dict[str, np.ndarray]]:
    """Every pair of a split once, sorted by length into bucketed shapes (evaluation, decoding).

    Pairs are grouped into buckets as in training (by source length alone when `targets` is
    False, for decoding) and cut into batches bucket by bucket, in the split's order within a
    bucket. Each batch's "index" row says which pair a row holds (-1: empty row), so outputs
    are put back in the split's order with `out[batch["index"][r]] = row_output[r]`.

    Args:
      data: the encoded pairs of the split.
      tokens_per_batch: padded tokens per batch (global).
      targets: include "tgt_in", "tgt_out", "tgt_mask" (teacher-forced loss); False gives
        sources only, bucketed by source length.
      row_multiple, bucket_step, min_bucket, process_index, process_count: as `PairBatches`.

    Returns:
      This process's share of every batch, in sorted order.
    """
    _check_shares(row_multiple, process_index, process_count)
    if len(data) == 0:
        return []
    src_rows, tgt_rows = data.src_lengths + 1, data.tgt_lengths + 1
    buckets = _Buckets(src_rows, tgt_rows, bucket_step, min_bucket, targets)
    # Sorted by bucket, then by the split's order: batches are as full and as few as they can be.
    order = np.lexsort((np.arange(len(data)), buckets.of))
    out = []
    for k in np.unique(buckets.of):
        members = order[buckets.of[order] == k]
        rows, s_len, t_len = buckets.shape(int(k), tokens_per_batch, row_multiple)
        for i in range(0, len(members), rows):
            batch = _fill(data, members[i : i + rows], rows, s_len, t_len, targets)
            out.append(_local(batch, process_index, process_count))
    return out
