"""Labelled examples as token rows, and their training and evaluation batches.

A row is BERT's input (Devlin et al. 2019, Sec. 3): ``[CLS] a [SEP]`` for one text,
``[CLS] a [SEP] b [SEP]`` for a pair, with segment ids 0 up to and including the first
``[SEP]`` and 1 after it. How a row is framed is the tokenizer's (:func:`row_format`, its
:class:`RowFormat`): with posenc's bytes (texts are UTF-8 bytes, ids 0-255) ``[SEP]`` is the
byte tokenizer's document separator (:data:`~posenc.data.tokenizer.SEP_ID`, 256), which a
masked-LM run has seen between documents, and ``[CLS]`` is id 258 (:data:`CLS_ID`, after the
masked LM's mask token 257), so a classifier needs ``model.vocab_size >= 259``
(:data:`VOCAB_SIZE`); a pretrained tokenizer (``data.tokenizer="hf:..."``, an imported BERT or
RoBERTa) frames rows with its own special tokens and segment ids, as its post-processor does
(BERT's ``[CLS] a [SEP] b [SEP]`` with segments 0 and 1; RoBERTa's ``<s> a </s></s> b </s>``,
all segment 0). Rows longer than the training length are truncated as BERT's
``_truncate_seq_pair`` does: one token at a time from the end of the longer text.

Training batches (:class:`ClassifyBatches`) are a function of (seed, step): each epoch is a
permutation of the training examples drawn from (seed, epoch); every batch is padded to
``train.seq_len``, one shape. Evaluation (:func:`eval_batches`) groups examples by length into
buckets bounded by the evaluation lengths and pads each batch to its bucket's bound (one
compilation per bound); rows longer than the largest bound are truncated to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from posenc.data.labelled import Example
from posenc.data.tokenizer import SEP_ID, ByteTokenizer

CLS_ID = 258
VOCAB_SIZE = 259
# What an item of a row template holds: a special token, or the text a or b.
SPECIAL, TEXT_A, TEXT_B = -1, 0, 1


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """How a tokenizer frames one text, or a pair, as a row.

    Attributes:
      single, pair: the templates, one ``(what, token id, segment)`` per item: ``what`` is
        :data:`SPECIAL` (the token ``id``), :data:`TEXT_A` or :data:`TEXT_B` (that text's
        tokens; ``id`` unused); each item's tokens get ``segment``.
    """

    single: tuple[tuple[int, int, int], ...]
    pair: tuple[tuple[int, int, int], ...]

    def specials(self, pair: bool) -> int:
        """The special tokens of a row (of a pair, or of one text)."""
        return sum(what == SPECIAL for what, _, _ in (self.pair if pair else self.single))

    def frame(self, a: np.ndarray, b: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The row of texts ``a`` (and ``b``): token ids ``[T]`` and segment ids ``[T]``."""
        ids, segs = [], []
        for what, token, segment in self.single if b is None else self.pair:
            part = np.asarray([token] if what == SPECIAL else a if what == TEXT_A else b)
            ids.append(part)
            segs.append(np.full(len(part), segment))
        return np.concatenate(ids).astype(np.int32), np.concatenate(segs).astype(np.int32)


# posenc's bytes: [CLS] a [SEP] (b [SEP]), segment 1 from b on.
BYTES_FORMAT = RowFormat(
    single=((SPECIAL, CLS_ID, 0), (TEXT_A, 0, 0), (SPECIAL, SEP_ID, 0)),
    pair=(
        (SPECIAL, CLS_ID, 0),
        (TEXT_A, 0, 0),
        (SPECIAL, SEP_ID, 0),
        (TEXT_B, 0, 1),
        (SPECIAL, SEP_ID, 1),
    ),
)


def row_format(tokenizer: Any = None) -> RowFormat:
    """The tokenizer's own row format (its ``row_format()`` hook: a pretrained tokenizer's
    post-processor); posenc's bytes (None, or no such hook): :data:`BYTES_FORMAT`."""
    hook = getattr(tokenizer, "row_format", None)
    return BYTES_FORMAT if hook is None else hook()


def encode_row(
    a: np.ndarray,
    b: np.ndarray | None,
    max_len: int | None,
    fmt: RowFormat = BYTES_FORMAT,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's row of one text ``a`` (or a pair ``a``, ``b``) of token ids, framed by ``fmt``:
    token ids ``[T]`` and segment ids ``[T]``, at most ``max_len`` tokens (None: no limit).

    >>> ids, segs = encode_row(np.array([1, 2, 3]), np.array([7]), max_len=6)
    >>> ids.tolist(), segs.tolist()   # a lost its last token: it was the longer
    ([258, 1, 2, 256, 7, 256], [0, 0, 0, 0, 1, 1])
    """
    specials = fmt.specials(b is not None)
    if max_len is not None:
        if max_len < specials + 1:
            raise ValueError(f"a row of {max_len} tokens cannot hold [CLS], [SEP] and a token")
        budget = max_len - specials
        if b is None:
            a = a[:budget]
        else:  # BERT's _truncate_seq_pair: trim the longer text, one token at a time
            la, lb = len(a), len(b)
            while la + lb > budget:
                if la > lb:
                    la -= 1
                else:
                    lb -= 1
            a, b = a[:la], b[:lb]
    return fmt.frame(a, b)


@dataclasses.dataclass(frozen=True)
class EncodedExamples:
    """Rows of a split, untruncated (training truncates per batch, evaluation per bucket).

    Attributes:
      texts: per example the token ids of ``(a, b)`` (``b`` None for one text); rows are made
        from them at the length a batch needs (:meth:`rows`).
      labels: ``[N]`` int32 class ids, or float32 targets (a regression).
      fmt: how rows are framed (the tokenizer's :class:`RowFormat`).
    """

    texts: list[tuple[np.ndarray, np.ndarray | None]]
    labels: np.ndarray
    fmt: RowFormat = BYTES_FORMAT

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def lengths(self) -> np.ndarray:
        """``[N]`` the untruncated row lengths in tokens."""
        return np.array(
            [
                len(a) + (0 if b is None else len(b)) + self.fmt.specials(b is not None)
                for a, b in self.texts
            ],
            np.int64,
        )

    def rows(self, indices: Sequence[int], length: int) -> dict[str, np.ndarray]:
        """Examples ``indices`` as one padded batch of ``length`` tokens: ``inputs`` and
        ``segments`` ``[B, length]`` int32, ``mask`` ``[B, length]`` bool, ``labels`` ``[B]``.
        An index of -1 is a padding row (mask all False, label 0)."""
        n = len(indices)
        inputs = np.zeros((n, length), np.int32)
        segments = np.zeros((n, length), np.int32)
        mask = np.zeros((n, length), bool)
        labels = np.zeros((n,), self.labels.dtype)
        for r, i in enumerate(indices):
            if i < 0:
                continue
            ids, segs = encode_row(*self.texts[i], max_len=length, fmt=self.fmt)
            inputs[r, : len(ids)], segments[r, : len(ids)], mask[r, : len(ids)] = ids, segs, True
            labels[r] = self.labels[i]
        return {"inputs": inputs, "segments": segments, "mask": mask, "labels": labels}


def encode_examples(
    examples: Sequence[Example], labels: np.ndarray, tokenizer: Any = None
) -> EncodedExamples:
    """Token ids of each example's texts (``tokenizer``'s, default posenc's bytes), with their
    encoded labels (:func:`posenc.data.labelled.encode_labels`), framed as the tokenizer frames
    rows (:func:`row_format`)."""
    tokenizer = ByteTokenizer() if tokenizer is None else tokenizer

    def ids(text: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(text), np.int32)

    texts = [(ids(e.text), None if e.text_b is None else ids(e.text_b)) for e in examples]
    return EncodedExamples(texts, np.asarray(labels), row_format(tokenizer))


class ClassifyBatches:
    """Training batches of labelled examples, a function of (seed, step) (module docstring).

    Args:
      examples: the training split (labelled).
      seq_len: tokens per row (longer rows are truncated).
      global_batch: rows per step over all processes.
      seed: the run's seed.
      process_index, process_count: this process's share of each batch's rows.
    """

    def __init__(
        self,
        examples: EncodedExamples,
        seq_len: int,
        global_batch: int,
        seed: int,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ):
        if len(examples) == 0:
            raise ValueError("the training split has no examples")
        self.examples, self.seq_len, self.global_batch = examples, seq_len, global_batch
        self.seed = seed
        self.process_index = process_index
        self.local_batch = global_batch // process_count
        self._epoch: tuple[int, np.ndarray] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, 0xC1A55, epoch])
            self._epoch = (epoch, rng.permutation(len(self.examples)))
        return self._epoch[1]

    def indices(self, step: int) -> np.ndarray:
        """The example of each of this process's rows at ``step``."""
        n = len(self.examples)
        first = step * self.global_batch + self.process_index * self.local_batch
        rows = np.arange(first, first + self.local_batch)
        return np.array([self._order(g // n)[g % n] for g in rows])

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows at ``step`` (:meth:`EncodedExamples.rows`)."""
        return self.examples.rows(self.indices(step), self.seq_len)


def bucket_of(lengths: np.ndarray, bounds: Sequence[int]) -> np.ndarray:
    """The bucket of each length: the first bound it does not exceed (longer: the last)."""
    return np.minimum(np.searchsorted(np.asarray(bounds), lengths), len(bounds) - 1)


def eval_batches(
    examples: EncodedExamples, bounds: Sequence[int], batch_tokens: int
) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
    """Every example once, in batches of its length bucket padded to the bucket's bound.

    Yields:
      ``(bucket, example indices [B] (-1 for padding rows), batch)``; a bucket's batches hold
      ``max(1, batch_tokens // bound)`` rows.
    """
    buckets = bucket_of(examples.lengths, bounds)
    for k, bound in enumerate(bounds):
        members = np.flatnonzero(buckets == k)
        rows = max(1, batch_tokens // bound)
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            padded = np.full(rows, -1, np.int64)
            padded[: len(chunk)] = chunk
            yield k, padded, examples.rows(padded, bound)
