"""``tfds:glue/<task>``: a prepared TFDS GLUE config as labelled examples, read without TensorFlow.

Records are read through ``tfds.data_source`` (array_record), as the text and translation TFDS
sources read theirs (:mod:`posenc.data.tfds_source`). Each GLUE config's text features are
known (:data:`GLUE_TEXTS`: first ``text``, then ``text_b`` for pairs); its ``label`` is a
``ClassLabel`` (class names in id order) or, for STS-B, a real number. GLUE's test splits carry
no labels (``-1``): they are read as unlabelled, and evaluating on them is refused. MNLI's
``validation`` is ``validation_matched`` (``tfds:glue/mnli_mismatched`` has the other).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from posenc.data.base import SOURCE_FIELD, DataNotFoundError
from posenc.data.labelled_base import Example, LabelledSource, examples_sha256
from posenc.data.tfds_source import (
    field_bytes,
    import_tfds,
    iter_records,
    require_array_record,
    tfds_builder,
)

# GLUE config -> its text features (one, or a pair in order).
GLUE_TEXTS: dict[str, tuple[str, ...]] = {
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qqp": ("question1", "question2"),
    "stsb": ("sentence1", "sentence2"),
    "mnli": ("premise", "hypothesis"),
    "mnli_matched": ("premise", "hypothesis"),
    "mnli_mismatched": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
    "rte": ("sentence1", "sentence2"),
    "wnli": ("sentence1", "sentence2"),
    "ax": ("premise", "hypothesis"),
}
# Canonical split -> the TFDS split names that serve it, in order of preference.
_SPLITS = {
    "train": ("train",),
    "validation": ("validation", "validation_matched"),
    "test": ("test", "test_matched"),
}


def glue_prepare_command(name: str, data_dir: Path) -> str:
    """The shell command that prepares TFDS GLUE config ``name`` (``glue/mrpc``) under
    ``data_dir`` in the array_record format posenc reads."""
    return f"tfds build {name} --data_dir={data_dir} --file_format=array_record"


def _text_features(name: str, features: Any, spec: str) -> tuple[str, ...]:
    """A GLUE config's text features (:data:`GLUE_TEXTS`); for another builder with a
    ``label``, its one or two text features in name order."""
    family, _, task = name.split(":")[0].partition("/")
    if family == "glue" and task in GLUE_TEXTS:
        return GLUE_TEXTS[task]
    tfds = import_tfds()
    texts = tuple(sorted(k for k, f in features.items() if isinstance(f, tfds.features.Text)))
    if "label" not in features or len(texts) not in (1, 2):
        raise ValueError(
            f"{SOURCE_FIELD}={spec!r}: not a labelled data set (features {sorted(features)}); a "
            "classifier reads TFDS GLUE configs (tfds:glue/<task>) or builders with a 'label' "
            "and one or two text features; other labelled data: tsv:<dir>"
        )
    return texts


class TfdsLabelledSource(LabelledSource):
    """A prepared TFDS GLUE config (or another builder with a ``label`` and one or two text
    features).

    Args:
      data_dir: TFDS data directory.
      name: ``glue/<task>[:version]``.
      spec: the spec string to report.
    """

    def __init__(self, data_dir: Path, name: str, spec: str = ""):
        self.spec = spec or f"tfds:{name}"
        self.name = name
        self.data_dir = Path(data_dir)
        builder = tfds_builder(name, self.data_dir)
        require_array_record(
            builder, self.spec, name, self.data_dir, glue_prepare_command(name, self.data_dir)
        )
        self._info = builder.info
        self.texts = _text_features(name, builder.info.features, self.spec)
        self.pair = len(self.texts) == 2
        available = list(builder.info.splits.keys())
        self.tfds_splits = {
            split: next(a for a in aliases if a in available)
            for split, aliases in _SPLITS.items()
            if any(a in available for a in aliases)
        }
        self.splits = tuple(self.tfds_splits)
        label = builder.info.features["label"]
        self._classes = tuple(label.names) if hasattr(label, "names") else None
        self._cache: dict[str, list[Example]] = {}

    def classes(self) -> tuple[str, ...] | None:
        return self._classes

    def check_split(self, split: str) -> str:
        if split in _SPLITS and split not in self.tfds_splits:
            raise DataNotFoundError(
                f"{SOURCE_FIELD}={self.spec!r} has no {split!r} split (TFDS splits: "
                f"{sorted(self._info.splits.keys())})"
            )
        return super().check_split(split)

    def examples(self, split: str) -> list[Example]:
        split = self.check_split(split)
        if split not in self._cache:
            tfds = import_tfds()
            records = tfds.data_source(
                self.name,
                split=self.tfds_splits[split],
                data_dir=str(self.data_dir),
                download=False,
            )
            where = f"{self.spec} {self.tfds_splits[split]}"
            self._cache[split] = [
                self._example(record, f"{where}, record {i}")
                for i, record in enumerate(iter_records(records))
            ]
        return list(self._cache[split])

    def _example(self, record: Any, where: str) -> Example:
        texts = [field_bytes(record, f).decode("utf-8") for f in self.texts]
        value = np.asarray(record["label"]).item()
        if self._classes is None:  # a regression (STS-B)
            label = str(float(value))
        else:  # GLUE's unlabelled test rows have -1
            label = None if int(value) < 0 else self._classes[int(value)]
        return Example(texts[0], texts[1] if self.pair else None, label, where)

    def info(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kind": "labelled-tfds",
            "tfds_name": self._info.full_name,
            "data_dir": str(self.data_dir),
            "pair": self.pair,
            "examples": {
                s: int(self._info.splits[t].num_examples) for s, t in self.tfds_splits.items()
            },
            "sha256": examples_sha256([("train", self.examples("train"))]),
        }
