"""What every labelled source shares: the example type, the source interface, a content hash.

The tsv folders (:mod:`posenc.data.labelled`), the embedded default
(:mod:`posenc.data.labelled_default`) and TFDS (:mod:`posenc.data.labelled_tfds`) build on it;
nothing here opens data.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from posenc.data.base import check_split

DEFAULT_SPEC = "labelled:default"


@dataclasses.dataclass(frozen=True)
class Example:
    """One labelled example.

    Attributes:
      text: the (first) text.
      text_b: the second text of a pair, or None.
      label: the label as read (class name, integer or real number); None when unlabelled.
      where: where it was read, for errors (``"<path>, line 7"``).
    """

    text: str
    text_b: str | None
    label: str | None
    where: str


class LabelledSource(abc.ABC):
    """A labelled data set addressed by a ``data.source`` spec.

    Attributes:
      spec: the spec string.
      splits: the splits it has (``train`` and ``validation`` always; ``test`` optionally).
      pair: whether examples are sentence pairs (``text_b``).
    """

    spec: str
    splits: tuple[str, ...]
    pair: bool

    @abc.abstractmethod
    def examples(self, split: str) -> list[Example]:
        """The split's examples in file order."""

    def classes(self) -> tuple[str, ...] | None:
        """The class names in label-id order when the source declares them (a TFDS
        ``ClassLabel``), else None: :func:`label_classes` derives them from the training split."""
        return None

    def check_split(self, split: str) -> str:
        return check_split(self.spec, split, self.splits)

    @abc.abstractmethod
    def info(self) -> dict[str, Any]:
        """The source's identity for ``data.json``: spec, kind and a hash of its examples."""


def examples_sha256(splits: Sequence[tuple[str, Sequence[Example]]]) -> str:
    """A hash of splits' texts and labels (not of where they were read)."""
    h = hashlib.sha256()
    for split, examples in splits:
        h.update(split.encode())
        for e in examples:
            h.update(json.dumps([e.text, e.text_b, e.label]).encode())
    return h.hexdigest()
