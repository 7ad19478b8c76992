"""Byte-level tokenizer: ids 0..255 are UTF-8 bytes, id 256 separates documents.

Byte-level tokens need no vocabulary file (nothing to download) and make bits per byte a
direct function of the loss, which is why posenc uses them by default.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Id of the document separator; it follows every document in a stream.
SEP_ID: int = 256
# 256 byte values plus the separator.
VOCAB_SIZE: int = 257
# How `decode` renders a separator, so document boundaries stay visible in printed samples.
# Decoding is therefore lossy for text that itself contains "<|sep|>"; `decode_documents` is not.
SEP_TEXT: str = "<|sep|>"


def bytes_to_ids(data: bytes) -> np.ndarray:
    """Token ids of raw bytes (no separator).

    Args:
      data: any bytes (UTF-8 text in practice).

    Returns:
      uint16 array `[len(data)]`, one id per byte.
    """
    return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)


class ByteTokenizer:
    """Maps text to UTF-8 byte ids and back; `SEP_ID` marks the end of a document.

    Text is never parsed for special tokens: the string "<|sep|>" encodes as its 7 bytes, so
    only `encode_documents` can place a separator.
    """

    vocab_size: int = VOCAB_SIZE
    sep_id: int = SEP_ID

    def encode(self, text: str) -> np.ndarray:
        """Encodes one text.

        Args:
          text: any string; it is encoded as UTF-8 (lone surrogates raise UnicodeEncodeError).

        Returns:
          uint16 array `[num_bytes]`.
        """
        return bytes_to_ids(text.encode("utf-8"))

    def encode_documents(self, documents: Iterable[str]) -> np.ndarray:
        """Encodes documents into one stream with `SEP_ID` after each document.

        Args:
          documents: texts, in stream order.

        Returns:
          uint16 array `[sum(num_bytes + 1)]`: doc0 bytes, SEP, doc1 bytes, SEP, ...
        """
        sep = np.array([SEP_ID], dtype=np.uint16)
        parts: list[np.ndarray] = []
        for doc in documents:
            parts.append(self.encode(doc))
            parts.append(sep)
        if not parts:
            return np.zeros((0,), dtype=np.uint16)
        return np.concatenate(parts)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Decodes ids to text; each separator is rendered as `SEP_TEXT` ("<|sep|>").

        Byte sequences that are not valid UTF-8 (e.g. a window cut inside a multi-byte
        character, or model samples) decode with U+FFFD replacement characters rather than
        raising, so decoding never fails on model output.

        Args:
          ids: token ids in [0, VOCAB_SIZE).

        Returns:
          The decoded string.
        """
        return SEP_TEXT.join(self.decode_documents(ids))

    def decode_documents(self, ids: Iterable[int] | np.ndarray) -> list[str]:
        """Splits ids at separators and decodes each piece.

        `decode_documents(encode_documents(docs))` returns `docs + [""]` (the stream ends
        with a separator, so the text after it is empty).

        Args:
          ids: token ids in [0, VOCAB_SIZE).

        Returns:
          The texts between separators, in order (`n_separators + 1` items).
        """
        arr = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids)
        if arr.ndim != 1:
            raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
        arr = arr.astype(np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= VOCAB_SIZE):
            bad = arr[(arr < 0) | (arr >= VOCAB_SIZE)][0]
            raise ValueError(
                f"token id {int(bad)} is outside the byte vocabulary [0, {VOCAB_SIZE})"
            )
        cuts = np.flatnonzero(arr == SEP_ID)
        pieces = np.split(arr, cuts)
        # Every piece after the first starts with the separator that ended the previous one.
        return [
            (p[1:] if i else p).astype(np.uint8).tobytes().decode("utf-8", errors="replace")
            for i, p in enumerate(pieces)
        ]
