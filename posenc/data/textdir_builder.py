"""The TFDS builder that turns a folder of text files into an array_record data set.

Importing this module registers the builder with TFDS under the name `posenc_textdir`, so
`tfds.builder("posenc_textdir", data_dir=...)` finds it; reading also works without it, since
TFDS falls back to a read-only builder made from the prepared files.

Works without TensorFlow in TFDS 4.9: `download_and_prepare(file_format="array_record")` writes
through the `array_record` package. Three things differ from the TFDS template, all found by
experiment with TFDS 4.9.10:

- `_info` builds `tfds.core.DatasetInfo` directly: `dataset_info_from_configs` expects metadata
  files next to the builder's module, which a library module does not have.
- Shuffling is disabled in `DatasetInfo` (a class attribute is ignored), so records keep the
  sorted file order.
- `code_path` is overridden to None. TFDS uses it only to find a `checksums.tsv` of download URLs
  (we download nothing), and its default implementation touches `importlib_resources`, which TFDS
  4.9.10 declares as a dependency only for Python < 3.9 (tensorflow/datasets#11212): without that
  package, `download_and_prepare` of any builder defined inside a package fails with
  "No module named 'importlib_resources'".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import tensorflow_datasets as tfds

# The TFDS name this builder registers.
BUILDER_NAME = "posenc_textdir"


class PosencTextdir(tfds.core.GeneratorBasedBuilder):
    """One record per text file: `{"text": <file content>}`, splits as assigned by the caller.

    Args:
      source_dir: the folder the files are read from; only needed to prepare.
      split_files: {split name: relative paths, in record order}; empty splits are left out
        (TFDS refuses to write a split without examples).
      **kwargs: `tfds.core.GeneratorBasedBuilder` arguments (`data_dir`, `file_format`, ...).
    """

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "One record per UTF-8 text file."}

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> None:
        """No code folder: there are no download checksums to look up (see module docstring)."""
        return None

    def __init__(
        self,
        *,
        source_dir: Path | None = None,
        split_files: Mapping[str, Sequence[str]] | None = None,
        **kwargs: Any,
    ):
        self._source_dir = Path(source_dir) if source_dir is not None else None
        self._split_files = dict(split_files or {})
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Text files of a local folder, one record per file (posenc textdir).",
            features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict]]]:
        del dl_manager  # Local files only: nothing to download.
        if self._source_dir is None:
            raise RuntimeError(
                "PosencTextdir needs source_dir to prepare; use posenc.data.prepare('textdir:...')"
            )
        return {
            split: self._generate_examples(files)
            for split, files in self._split_files.items()
            if files
        }

    def _generate_examples(self, files: Sequence[str]) -> Iterator[tuple[int, dict]]:
        assert self._source_dir is not None
        for index, rel in enumerate(files):
            # Files were checked to be UTF-8 when the split was made.
            yield index, {"text": (self._source_dir / rel).read_bytes().decode("utf-8")}
