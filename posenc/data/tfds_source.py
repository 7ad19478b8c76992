"""`tfds:<name>[/<config>][:<version>]`: a prepared TFDS text data set, read without TensorFlow.

Records are read through `tfds.data_source` (TFDS's random-access reader for `array_record`
files), tokenized once into a uint16 `.npy` stream per split under
`<data_dir>/posenc/tfds/<name>/[<config>/]<version>/`, and memory-mapped afterwards, so a
10 GB corpus such as PG-19 never has to fit in memory.

Reading never downloads: an unprepared data set raises `DataNotFoundError` naming the command
that prepares it. `prepare_tfds` is the one explicit step that may download.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data import storage
from posenc.data.base import SOURCE_FIELD, SPLITS, DataNotFoundError, Source
from posenc.data.tokenizer import VOCAB_SIZE

_log = logging.getLogger(__name__)

# Config field that selects the text feature of a TFDS data set.
TEXT_FIELD = "data.text_field"
# TFDS split names accepted for each canonical split, in order of preference.
SPLIT_ALIASES: dict[str, tuple[str, ...]] = {
    "train": ("train",),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test",),
}
# TFDS imports most dataset families lazily and only registers their builders once the family
# module is imported; without TensorFlow nothing triggers that import, so `tfds.builder("wiki40b")`
# reports "not found". Importing the family modules explicitly registers them.
_BUILDER_FAMILIES = (
    "text",
    "summarization",
    "translate",
    "question_answering",
    "text_simplification",
    "structured",
)
# Records read per call when tokenizing a split (bounded memory, few Python calls).
_READ_CHUNK = 64


def import_tfds() -> Any:
    """Imports `tensorflow_datasets` on first use (it takes ~1 s, so `pystdlib` runs skip it)."""
    import tensorflow_datasets as tfds

    return tfds


def prepare_command(name: str, data_dir: Path) -> str:
    """The shell commands that prepare TFDS data set `name` for posenc under `data_dir`."""
    return (
        f"posenc data prepare tfds:{name} --data_dir {data_dir}\n"
        f"  (or: tfds build {name} --data_dir={data_dir} --file_format=array_record)"
    )


def _register_families() -> None:
    for family in _BUILDER_FAMILIES:
        try:
            importlib.import_module(f"tensorflow_datasets.{family}")
        # A family whose optional extras are missing must not block the others.
        except Exception as err:
            _log.debug("could not import tensorflow_datasets.%s: %s", family, err)


def _parse_name(name: str) -> None:
    from tensorflow_datasets.core import naming

    parsed, _ = naming.parse_builder_name_kwargs(name)
    if parsed.namespace:
        # Namespaced builders (huggingface:, community) resolve over the network.
        raise ValueError(
            f"{SOURCE_FIELD}='tfds:{name}': namespaced TFDS names ({parsed.namespace}:) are not "
            "supported; use a data set prepared under the data dir"
        )


def tfds_builder(name: str, data_dir: Path, **kwargs: Any) -> Any:
    """`tfds.builder(name, data_dir=...)`, registering lazily-imported dataset families first.

    Args:
      name: TFDS name, `name[/config][:version]`.
      data_dir: TFDS data directory.
      **kwargs: passed to `tfds.builder`.

    Returns:
      The builder (the data set's own class, or a read-only builder from its files).
    """
    tfds = import_tfds()
    _parse_name(name)
    try:
        return tfds.builder(name, data_dir=str(data_dir), **kwargs)
    except tfds.core.registered.DatasetNotFoundError:
        _register_families()
    try:
        return tfds.builder(name, data_dir=str(data_dir), **kwargs)
    except tfds.core.registered.DatasetNotFoundError as err:
        raise DataNotFoundError(
            f"{SOURCE_FIELD}='tfds:{name}': TFDS knows no data set {name!r}, and none is prepared "
            f"under {data_dir}. Check the name, or prepare it with:\n"
            f"{prepare_command(name, data_dir)}"
        ) from err


def iter_records(data_source: Sequence[Any]) -> Iterator[Any]:
    """Yields every record of a TFDS data source in order, reading `_READ_CHUNK` at a time."""
    for start in range(0, len(data_source), _READ_CHUNK):
        indices = list(range(start, min(start + _READ_CHUNK, len(data_source))))
        if hasattr(data_source, "__getitems__"):
            yield from data_source.__getitems__(indices)
        else:
            yield from (data_source[i] for i in indices)


def field_bytes(record: Any, field: str) -> bytes:
    """The UTF-8 bytes of a text feature of one record (TFDS gives bytes, str or a 0-d array)."""
    value = record[field]
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def canonical_splits(info: Any) -> dict[str, str]:
    """{canonical split: the TFDS split that serves it} for a builder's `info` (see
    `SPLIT_ALIASES`)."""
    available = list(info.splits.keys())
    out: dict[str, str] = {}
    for split in SPLITS:
        found = [alias for alias in SPLIT_ALIASES[split] if alias in available]
        if found:
            out[split] = found[0]
    return out


def check_tfds_split(spec: str, split: str, info: Any) -> None:
    """Raises for a canonical split the TFDS data set (`info`) lacks, listing its own splits."""
    if split in SPLITS and split not in canonical_splits(info):
        raise ValueError(
            f"{SOURCE_FIELD}={spec!r} has no {split!r} split (looked for TFDS splits "
            f"{list(SPLIT_ALIASES[split])}); TFDS splits of {info.full_name}: "
            f"{sorted(info.splits.keys())}"
        )


def require_array_record(builder: Any, spec: str, name: str, data_dir: Path, command: str) -> None:
    """Raises `DataNotFoundError` (with `command`, the preparation to run) unless the builder's
    data set `name` is prepared under `data_dir` in array_record format, the one
    `tfds.data_source` reads without TensorFlow."""
    if not builder.is_prepared():
        raise DataNotFoundError(
            f"{SOURCE_FIELD}={spec!r}: TFDS data set {name!r} is not prepared under {data_dir} "
            f"(posenc never downloads at run time). Prepare it once with:\n{command}"
        )
    fmt = getattr(builder.info.file_format, "value", builder.info.file_format)
    if str(fmt) != "array_record":
        raise DataNotFoundError(
            f"{SOURCE_FIELD}={spec!r}: {builder.data_dir} holds {fmt} files, which cannot be read "
            "without TensorFlow. Prepare it in array_record format (into another data dir, or "
            f"after deleting that folder):\n{command}"
        )


def _read_field(data_source: Sequence[Any], field: str) -> Iterator[bytes]:
    """Yields the UTF-8 bytes of `field` of every record."""
    for record in iter_records(data_source):
        yield field_bytes(record, field)


def write_stream_from_data_source(data_source: Sequence[Any], field: str, path: Path) -> None:
    """Tokenizes every record's `field` into the stream `path` (see `storage.write_stream`)."""
    _log.info("tokenizing %d records into %s", len(data_source), path)
    storage.write_stream(path, _read_field(data_source, field))


class TfdsSource(Source):
    """A prepared TFDS data set as token streams.

    Args:
      data_dir: TFDS data directory (the one the data set was prepared under).
      name: TFDS name, `name[/config][:version]`.
      text_field: the text feature; None picks "text", or the only text feature there is.
      spec: the spec string to report.
    """

    def __init__(self, data_dir: Path, name: str, text_field: str | None = None, spec: str = ""):
        self.spec = spec or f"tfds:{name}"
        self.name = name
        self.data_dir = Path(data_dir)
        builder = tfds_builder(name, self.data_dir)
        require_array_record(
            builder, self.spec, name, self.data_dir, prepare_command(name, self.data_dir)
        )
        self.full_name: str = builder.info.full_name
        self._tfds_info = builder.info
        self.text_field = _pick_text_field(builder.info.features, text_field, self.spec)
        self.tfds_splits = canonical_splits(builder.info)
        self.splits = tuple(self.tfds_splits)
        self.cache_dir = self.data_dir / "posenc" / "tfds" / self.full_name

    def check_split(self, split: str) -> str:
        """See `Source.check_split`; the error also lists the data set's own split names."""
        check_tfds_split(self.spec, split, self._tfds_info)
        return super().check_split(split)

    def data_source(self, split: str) -> Sequence[Any]:
        """The TFDS random-access data source of a canonical split (records are dicts)."""
        tfds = import_tfds()
        tfds_split = self.tfds_splits[self.check_split(split)]
        return tfds.data_source(
            self.name, split=tfds_split, data_dir=str(self.data_dir), download=False
        )

    def _stream_path(self, split: str) -> Path:
        return self.cache_dir / f"{self.tfds_splits[split]}.{self.text_field}.npy"

    def build_streams(self) -> None:
        """Tokenizes every split that has no stream cache yet (the slow, one-time step)."""
        for split in self.splits:
            path = self._stream_path(split)
            if not storage.stream_is_built(path):
                write_stream_from_data_source(self.data_source(split), self.text_field, path)

    def split_stream(self, split: str) -> np.ndarray:
        """See `Source.split_stream`; tokenizes the split on first use, then memory-maps it."""
        path = self._stream_path(self.check_split(split))
        if not storage.stream_is_built(path):
            write_stream_from_data_source(self.data_source(split), self.text_field, path)
        return storage.load_stream(path)

    def info(self) -> dict[str, Any]:
        """See `Source.info`; token counts appear for splits whose stream has been built."""
        splits: dict[str, Any] = {}
        for split, tfds_split in self.tfds_splits.items():
            entry: dict[str, Any] = {
                "tfds_split": tfds_split,
                "examples": int(self._tfds_info.splits[tfds_split].num_examples),
            }
            meta_path = storage.stream_meta_path(self._stream_path(split))
            if meta_path.exists():
                meta = storage.read_json(meta_path)
                entry.update(tokens=meta["tokens"], stream_sha256=meta["sha256"])
            splits[split] = entry
        return {
            "spec": self.spec,
            "kind": "tfds",
            "tfds_name": self.full_name,
            "text_field": self.text_field,
            "data_dir": str(self.data_dir),
            "tokenizer": "bytes",
            "vocab_size": VOCAB_SIZE,
            "splits": splits,
        }


def _pick_text_field(features: Any, text_field: str | None, spec: str) -> str:
    names = list(features.keys())
    if text_field is not None:
        if text_field not in names:
            raise ValueError(
                f"{TEXT_FIELD}={text_field!r} is not a feature of {spec!r}; features: {names}"
            )
        return text_field
    if "text" in names:
        return "text"
    tfds = import_tfds()
    texts = [n for n in names if isinstance(features[n], tfds.features.Text)]
    if len(texts) == 1:
        return texts[0]
    raise ValueError(
        f"{spec!r} has no 'text' feature; set {TEXT_FIELD} to one of its features: {names}"
    )


def prepare_tfds(name: str, data_dir: Path, text_field: str | None = None) -> TfdsSource:
    """Downloads and prepares a TFDS data set in array_record format, then tokenizes it.

    This is the one user-invoked step that may download (from the data set's own hosts, as
    TFDS's builder for it decides). It does nothing for parts that are already prepared.

    Args:
      name: TFDS name, `name[/config][:version]`.
      data_dir: TFDS data directory to prepare into.
      text_field: see `TfdsSource`.

    Returns:
      The ready source.
    """
    builder = tfds_builder(name, data_dir)
    if not builder.is_prepared():
        builder.download_and_prepare(file_format="array_record")
    source = TfdsSource(data_dir, name, text_field=text_field)
    source.build_streams()
    return source
