"""`textdir:<path>`: a local folder of text files, prepared once into a TFDS data set.

Preparation (automatic on first use, or `prepare("textdir:<path>")`) lists the folder, keeps the
files that are UTF-8 text, assigns them to splits, writes them with our TFDS builder
(`textdir_builder.PosencTextdir`) in array_record format, and tokenizes each split through
`tfds.data_source` into a memory-mapped stream. Layout under the data dir:

    posenc/textdir/<folder name>-<fingerprint16>/
        tfds/posenc_textdir/1.0.0/   the TFDS data set (array_record shards, dataset_info.json)
        streams/<split>.npy          token streams (+ <split>.npy.json: tokens, sha256)
        textdir.json                 the folder, its content hash, files per split, skipped files

The fingerprint hashes the folder's absolute path and every file's (path, size, mtime), so
editing, adding or removing a file makes a new data set; old ones can simply be deleted.

Splits: if the folder has top-level `train/`, `validation/` (or `valid/`, `dev/`) and/or `test/`
folders, those define the splits (files elsewhere are ignored, with a warning). Otherwise files
are split ~90/5/5 by a hash of their relative path (`files.split_by_hash`). Hidden files and
folders are ignored; files containing NUL bytes or invalid UTF-8 are skipped with a warning.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data import storage
from posenc.data.base import SOURCE_FIELD, SPLITS, DataNotFoundError, Source
from posenc.data.files import content_sha256, list_files, split_by_hash
from posenc.data.tokenizer import VOCAB_SIZE

# Top-level folder names that define a split.
_SPLIT_DIRS = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "dev": "validation",
    "test": "test",
}
_META_FILE = "textdir.json"
_CACHE_VERSION = 1


def _visible(name: str) -> bool:
    return not name.startswith(".") and name != "__pycache__"


def _fingerprint(folder: Path, relpaths: Sequence[str]) -> str:
    """Cheap identity of the folder's state: path plus each file's path, size and mtime."""
    digest = hashlib.sha256(f"{_CACHE_VERSION}\0{folder}\0".encode())
    for rel in relpaths:
        st = (folder / rel).stat()
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _scan(folder: Path, relpaths: Sequence[str]) -> tuple[list[str], list[str], str]:
    """Reads every file once: (text files, skipped files, content sha256 of the text files)."""
    kept: list[str] = []
    skipped: list[str] = []

    def texts() -> Iterator[tuple[str, bytes]]:
        for rel in relpaths:
            data = (folder / rel).read_bytes()
            if _is_text(data):
                kept.append(rel)
                yield rel, data
            else:
                skipped.append(rel)

    digest = content_sha256(texts())
    return kept, skipped, digest


def _assign_splits(folder: Path, relpaths: Sequence[str]) -> tuple[str, dict[str, list[str]]]:
    """Returns ("split_dirs" | "hash", {split: relative paths}) for the text files."""
    top = {p.name for p in folder.iterdir() if p.is_dir() and p.name in _SPLIT_DIRS}
    if not top:
        if 0 < len(relpaths) < len(SPLITS):  # none at all: the caller says no text was found
            raise ValueError(
                f"{SOURCE_FIELD}='textdir:{folder}' has {len(relpaths)} text file(s) and no "
                "train/, validation/ or test/ folders; without them files are split whole "
                f"(90/5/5 by a hash of the name), which needs at least {len(SPLITS)} files. "
                "Add files, or put them in train/ and validation/ folders"
            )
        return "hash", split_by_hash(relpaths)
    for split in SPLITS:
        aliases = sorted(d for d in top if _SPLIT_DIRS[d] == split)
        if len(aliases) > 1:
            raise ValueError(f"textdir {folder}: both {aliases} present; keep one {split} folder")
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    ignored = []
    for rel in relpaths:
        head = rel.split("/", 1)[0]
        if head in top and "/" in rel:
            out[_SPLIT_DIRS[head]].append(rel)
        else:
            ignored.append(rel)
    if ignored:
        warnings.warn(
            f"textdir {folder}: {len(ignored)} files outside the split folders {sorted(top)} are "
            f"ignored, e.g. {ignored[:5]}",
            stacklevel=3,
        )
    return "split_dirs", out


class TextdirSource(Source):
    """A folder of text files as token streams, via a TFDS array_record data set.

    Args:
      data_dir: the data directory; the data set goes under `<data_dir>/posenc/textdir/`.
      folder: the folder of text files.
      spec: the spec string to report.
      prepare_if_missing: prepare on first use (local work only, nothing is downloaded); if
        False a missing preparation raises `DataNotFoundError`.
    """

    def __init__(
        self, data_dir: Path, folder: Path, spec: str = "", prepare_if_missing: bool = True
    ):
        self.folder = Path(folder).expanduser().resolve()
        self.spec = spec or f"textdir:{folder}"
        if self.folder.is_file():
            raise ValueError(
                f"{SOURCE_FIELD}={self.spec!r} is a file; textdir: takes a folder of text files "
                "(with train/ and validation/ folders, or at least 3 files to split)"
            )
        if not self.folder.is_dir():
            raise DataNotFoundError(f"{SOURCE_FIELD}={self.spec!r}: {self.folder} is not a folder")
        relpaths = list_files(self.folder, _visible, _visible)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.folder.name) or "root"
        self.root = (
            Path(data_dir)
            / "posenc"
            / "textdir"
            / f"{slug}-{_fingerprint(self.folder, relpaths)[:16]}"
        )
        self.tfds_dir = self.root / "tfds"
        meta_path = self.root / _META_FILE
        if not meta_path.exists():
            if not prepare_if_missing:
                raise DataNotFoundError(
                    f"{SOURCE_FIELD}={self.spec!r} is not prepared (or the folder changed); run:\n"
                    f"posenc data prepare textdir:{self.folder} --data_dir {data_dir}"
                )
            with storage.file_lock(self.root.with_name(self.root.name + ".lock")):
                # Another process may have finished preparing while we waited for the lock.
                if not meta_path.exists():
                    self._prepare(relpaths, meta_path)
        self.meta: dict[str, Any] = storage.read_json(meta_path)
        self.content_sha256: str = self.meta["content_sha256"]
        self.files: dict[str, list[str]] = self.meta["files"]
        self.splits = tuple(s for s in SPLITS if self.files[s])

    def _prepare(self, relpaths: Sequence[str], meta_path: Path) -> None:
        from posenc.data.textdir_builder import PosencTextdir

        kept, skipped, digest = _scan(self.folder, relpaths)
        if skipped:
            warnings.warn(
                f"textdir {self.folder}: skipped {len(skipped)} files that are not UTF-8 text "
                f"(NUL bytes or invalid UTF-8), e.g. {skipped[:5]}",
                stacklevel=3,
            )
        layout, files = _assign_splits(self.folder, kept)
        if not files["train"]:
            raise DataNotFoundError(
                f"{SOURCE_FIELD}={self.spec!r}: no UTF-8 text files for the train split in "
                f"{self.folder} ({len(kept)} text files, {len(skipped)} skipped)"
            )
        builder = PosencTextdir(
            data_dir=str(self.tfds_dir),
            source_dir=self.folder,
            split_files=files,
            file_format="array_record",
        )
        if not builder.is_prepared():
            builder.download_and_prepare(file_format="array_record")
        for split in SPLITS:
            if files[split]:
                self._build_stream(split)
        storage.atomic_write_json(
            meta_path,
            {
                "version": _CACHE_VERSION,
                "folder": str(self.folder),
                "layout": layout,
                "content_sha256": digest,
                "files": files,
                "skipped": skipped,
            },
        )

    def data_source(self, split: str) -> Sequence[Any]:
        """The TFDS data source of a split: records `{"text": bytes}`, in sorted file order."""
        # Registers the builder, so TFDS uses it rather than a read-only stand-in.
        import posenc.data.textdir_builder as builder_module
        from posenc.data.tfds_source import import_tfds

        return import_tfds().data_source(
            builder_module.BUILDER_NAME, split=split, data_dir=str(self.tfds_dir), download=False
        )

    def _stream_path(self, split: str) -> Path:
        return self.root / "streams" / f"{split}.npy"

    def _build_stream(self, split: str) -> None:
        from posenc.data.tfds_source import write_stream_from_data_source

        write_stream_from_data_source(self.data_source(split), "text", self._stream_path(split))

    def split_stream(self, split: str) -> np.ndarray:
        """See `Source.split_stream`; documents are in sorted relative-path order."""
        path = self._stream_path(self.check_split(split))
        if not storage.stream_is_built(path):
            self._build_stream(split)
        return storage.load_stream(path)

    def info(self) -> dict[str, Any]:
        """See `Source.info`: folder, content hash, split layout, per-split files and tokens."""
        splits = {}
        for split in self.splits:
            path = self._stream_path(split)
            if not storage.stream_is_built(path):
                self._build_stream(split)
            splits[split] = storage.stream_summary(path, len(self.files[split]))
        return {
            "spec": self.spec,
            "kind": "textdir",
            "folder": str(self.folder),
            "layout": self.meta["layout"],
            "content_sha256": self.content_sha256,
            "skipped_files": len(self.meta["skipped"]),
            "tokenizer": "bytes",
            "vocab_size": VOCAB_SIZE,
            "splits": splits,
            "tfds_dir": str(self.tfds_dir),
        }
