"""What every parallel source shares: the pair type, the source interface, content hashes.

The folder and embedded sources (:mod:`posenc.data.parallel`) and the TFDS one
(:mod:`posenc.data.parallel_tfds`) build on it; nothing here opens data.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from posenc.data.base import check_split

SRC_LANG_FIELD = "data.src_lang"


TGT_LANG_FIELD = "data.tgt_lang"


Pair = tuple[str, str]


def pairs_sha256(splits: Iterable[tuple[str, Sequence[Pair]]]) -> str:
    """sha256 over the splits' pairs, length-framed so that no two corpora collide.

    Args:
      splits: (split name, its pairs) in a fixed order.

    Returns:
      Hex digest.
    """
    digest = hashlib.sha256()
    for split, pairs in splits:
        digest.update(f"{split}\0{len(pairs)}\0".encode())
        for src, tgt in pairs:
            for text in (src, tgt):
                data = text.encode("utf-8")
                digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def drop_empty(pairs: Sequence[Pair]) -> tuple[list[Pair], int]:
    """The pairs whose source and target both have non-space text, and how many were dropped."""
    kept = [(s, t) for s, t in pairs if s.strip() and t.strip()]
    return kept, len(pairs) - len(kept)


class ParallelSource(abc.ABC):
    """Translation pairs split into train/validation/test.

    Attributes:
      spec: the spec string (the `data.source` value).
      src_lang: source language code (the `data.src_lang` value).
      tgt_lang: target language code.
      splits: the canonical split names this source has, a subset of `SPLITS`.
    """

    spec: str
    src_lang: str
    tgt_lang: str
    splits: tuple[str, ...]

    @abc.abstractmethod
    def pairs(self, split: str) -> list[Pair]:
        """The (source text, target text) pairs of a split, in file order.

        Training pairs with an empty side are dropped (see the module docstring).
        """

    @abc.abstractmethod
    def info(self) -> dict[str, Any]:
        """A JSON-able record: spec, kind, languages, per-split counts, content sha256."""

    def sources(self, split: str) -> list[str]:
        """The source texts of a split, in order."""
        return [s for s, _ in self.pairs(split)]

    def targets(self, split: str) -> list[str]:
        """The target (reference) texts of a split, in order."""
        return [t for _, t in self.pairs(split)]

    def check_split(self, split: str) -> str:
        """Validates `split` against `SPLITS` and this source's splits; returns it."""
        return check_split(self.spec, split, self.splits)
