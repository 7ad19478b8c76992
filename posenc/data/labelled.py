"""Labelled text for sequence classification and regression: sources and their labels.

A labelled source gives, per split, :class:`Example` s: one text (``text``) or a pair (``text``,
``text_b``) and a label, as the raw string it was read as (a class name, an integer, or a real
number for a regression), with where it was read (``file, line N``) so that a bad row is refused
in one line naming it. Sources (``data.source``):

- ``tsv:<dir>``: ``train.tsv`` and ``validation.tsv`` (optionally ``test.tsv``), tab-separated
  with a header row naming the columns ``text`` (and ``text_b`` for pairs) and ``label``; other
  columns are ignored, and ``test.tsv`` may leave ``label`` out (unlabelled).
- ``tfds:glue/<task>``: a prepared TFDS GLUE config (:mod:`posenc.data.labelled_tfds`).
- ``labelled:default``: the embedded text-order task built from the embedded corpus
  (:mod:`posenc.data.labelled_default`).

Labels (:func:`label_classes`, :func:`encode_labels`): a classification's classes are those of
the training split, integers in numeric order or names in sorted order (a TFDS data set's
``ClassLabel`` order); a label outside them in another split is refused. A regression
(``model.num_labels == 1``) reads every label as a real number.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data.base import SOURCE_FIELD, DataNotFoundError
from posenc.data.labelled_base import DEFAULT_SPEC, Example, LabelledSource, examples_sha256

TSV_PREFIX = "tsv:"
SPLITS = ("train", "validation", "test")
# The columns a tsv: folder's header names (text_b only for sentence pairs).
TEXT, TEXT_B, LABEL = "text", "text_b", "label"


class RepeatedHeaderWarning(UserWarning):
    """A ``.tsv`` file repeats its header row inside its body (files concatenated with
    ``cat``); the row was skipped, not read as an example labelled with the column's name."""


# --- labels -------------------------------------------------------------------------------------


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def label_classes(source: LabelledSource, train: Sequence[Example]) -> tuple[str, ...]:
    """The classes of a classification: the source's own order, or the training labels'
    (integers in numeric order, names in sorted order)."""
    declared = source.classes()
    if declared is not None:
        return declared
    seen = {e.label for e in train if e.label is not None}
    if seen and all(_is_int(x) for x in seen):
        return tuple(sorted(seen, key=int))
    return tuple(sorted(seen))


def encode_labels(
    examples: Sequence[Example], classes: Sequence[str] | None, split: str
) -> np.ndarray:
    """Label ids ``[N]`` int32 (``classes`` given), or real targets ``[N]`` float32 (a
    regression, ``classes`` None); -1 / NaN for unlabelled examples.

    Raises:
      ValueError: a label outside ``classes``, or not a real number in a regression (naming
        the file and line, and what the training split has).
    """
    if classes is None:
        out = np.empty(len(examples), np.float32)
        for i, e in enumerate(examples):
            try:
                out[i] = math.nan if e.label is None else float(e.label)
            except ValueError:
                raise ValueError(
                    f"{e.where}: label {e.label!r} is not a number, and model.num_labels=1 is a "
                    "regression; fix the row, or set model.num_labels to the number of classes"
                ) from None
            # NaN stands for "unlabelled" here, and a NaN or infinite target would read as a
            # diverged run after training started: refuse it where it was read.
            if e.label is not None and not math.isfinite(out[i]):
                raise ValueError(
                    f"{e.where}: label {e.label!r} is not a finite number (model.num_labels=1 "
                    "is a regression); fix the row, or leave the label out in test.tsv"
                )
        return out
    index = {name: i for i, name in enumerate(classes)}
    out = np.empty(len(examples), np.int32)
    for i, e in enumerate(examples):
        if e.label is None:
            out[i] = -1
            continue
        key = e.label
        if key not in index and _is_int(key) and all(_is_int(c) for c in classes):
            key = str(int(key))  # "01" and "1" are one class
        if key not in index:
            shown = list(classes) if len(classes) <= 20 else [*classes[:20], "..."]
            raise ValueError(
                f"{e.where}: label {e.label!r} is not among the training split's classes "
                f"{shown} ({split} split); fix the row or add the class to the training split"
            )
        out[i] = index[key]
    return out


# --- tsv: folders -------------------------------------------------------------------------------


def _open_tsv(path: Path) -> io.StringIO:
    """A ``.tsv`` file's text for ``csv.reader``; text that is not UTF-8 is refused naming the
    file and the line."""
    from posenc.data.parallel import decode_utf8

    text = decode_utf8(path.read_bytes(), str(path))
    return io.StringIO(text.removeprefix("\ufeff"), newline="")  # a byte-order mark is no text


def _read_tsv(path: Path, split: str, pair: bool | None) -> list[Example]:
    """The examples of one ``.tsv`` file, checked row by row (see module docstring); a row that
    repeats the header (concatenated files) is skipped with a :class:`RepeatedHeaderWarning`."""
    with _open_tsv(path) as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows, None)
        if header is None:
            raise ValueError(
                f"{path}, line 1: empty file; it needs a header row naming text, label"
            )
        columns = {name.strip(): i for i, name in enumerate(header)}
        required = [TEXT] + ([LABEL] if split != "test" else [])
        if pair:
            required.append(TEXT_B)
        missing = [c for c in required if c not in columns]
        if missing:
            raise ValueError(
                f"{path}, line 1: no column {missing[0]!r} in the header {header}; the header "
                f"names the columns {TEXT} (and {TEXT_B} for pairs) and {LABEL}, tab-separated"
            )
        if pair is False and TEXT_B in columns:
            raise ValueError(
                f"{path}, line 1: a {TEXT_B} column, but the training split has none; give "
                f"every split the same columns"
            )
        examples = []
        names = [name.strip() for name in header]
        for line, row in enumerate(rows, start=2):
            if not row:
                continue  # a blank line (one at the end, typically)
            where = f"{path}, line {line}"
            if [field.strip() for field in row] == names:
                warnings.warn(
                    f"{where} repeats the header row (files concatenated?); skipped it",
                    RepeatedHeaderWarning,
                    stacklevel=2,
                )
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{where}: {len(row)} tab-separated fields, the header has {len(header)} "
                    "(a tab inside a text? a missing field?)"
                )
            label = row[columns[LABEL]].strip() if LABEL in columns else None
            if label == "" and split != "test":
                raise ValueError(f"{where}: empty {LABEL}")
            text_b = row[columns[TEXT_B]] if TEXT_B in columns else None
            examples.append(Example(row[columns[TEXT]], text_b, label or None, where))
    return examples


class TsvLabelledSource(LabelledSource):
    """``tsv:<dir>``: a folder of ``train.tsv``, ``validation.tsv`` and optionally ``test.tsv``.

    Args:
      folder: the folder.
      spec: the spec string to report.
    """

    def __init__(self, folder: Path, spec: str = ""):
        self.folder = Path(folder)
        self.spec = spec or f"{TSV_PREFIX}{folder}"
        for split in ("train", "validation"):
            if not (self.folder / f"{split}.tsv").is_file():
                raise DataNotFoundError(
                    f"{SOURCE_FIELD}={self.spec!r}: no {self.folder / (split + '.tsv')}; the "
                    "folder holds train.tsv and validation.tsv (optionally test.tsv), each with "
                    f"a header row naming the columns {TEXT} (and {TEXT_B} for pairs) and {LABEL}"
                )
        has_test = (self.folder / "test.tsv").is_file()
        self.splits = SPLITS if has_test else SPLITS[:2]
        self._cache: dict[str, list[Example]] = {}
        self.pair = TEXT_B in self._header("train")

    def _header(self, split: str) -> list[str]:
        with _open_tsv(self.folder / f"{split}.tsv") as f:
            return [c.strip() for c in next(csv.reader(f, delimiter="\t"), [])]

    def check_split(self, split: str) -> str:
        if split == "test" and "test" not in self.splits:
            raise DataNotFoundError(
                f"{SOURCE_FIELD}={self.spec!r} has no test split: add {self.folder / 'test.tsv'} "
                "(the columns of train.tsv; label may be left out) or evaluate eval.split="
                "validation"
            )
        return super().check_split(split)

    def examples(self, split: str) -> list[Example]:
        split = self.check_split(split)
        if split not in self._cache:
            self._cache[split] = _read_tsv(self.folder / f"{split}.tsv", split, self.pair)
        return list(self._cache[split])

    def info(self) -> dict[str, Any]:
        splits = {s: len(self.examples(s)) for s in self.splits}
        return {
            "spec": self.spec,
            "kind": "tsv",
            "folder": str(self.folder.resolve()),
            "pair": self.pair,
            "examples": splits,
            "sha256": examples_sha256([(s, self.examples(s)) for s in self.splits]),
        }


def get_labelled_source(spec: str, data_dir: str | Path | None = None) -> LabelledSource:
    """The labelled source ``spec`` names (module docstring); never downloads.

    Raises:
      ValueError: an unknown spec form.
      posenc.data.DataNotFoundError: a missing folder, file or unprepared TFDS data set (the
        message says how to prepare it).
    """
    from posenc.data.base import resolve_data_dir

    if spec.startswith(TSV_PREFIX):
        folder = Path(spec[len(TSV_PREFIX) :]).expanduser()
        if not folder.is_dir():
            raise DataNotFoundError(
                f"{SOURCE_FIELD}={spec!r}: no folder {folder}; make one holding train.tsv and "
                f"validation.tsv with a header row naming {TEXT} (and {TEXT_B}) and {LABEL}"
            )
        return TsvLabelledSource(folder, spec)
    if spec.startswith("tfds:"):
        from posenc.data.labelled_tfds import TfdsLabelledSource

        return TfdsLabelledSource(resolve_data_dir(data_dir), spec[len("tfds:") :], spec)
    if spec == DEFAULT_SPEC:
        from posenc.data.labelled_default import TextOrderSource

        return TextOrderSource(resolve_data_dir(data_dir))
    raise ValueError(
        f"{SOURCE_FIELD}={spec!r} is not a labelled source; a classifier reads "
        f"'{DEFAULT_SPEC}' (the embedded text-order task), 'tsv:<dir>' or 'tfds:glue/<task>'"
    )
