"""Token-stream caches on disk: `.npy` files written atomically and read as memory maps.

Several processes (data-parallel hosts, a sweep's workers) may build the same cache at once,
so every file is written under a unique temporary name and moved into place with
`os.replace`: readers see either no file or a complete one, never a partial one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data.tokenizer import SEP_ID, bytes_to_ids
from posenc.workdir.files import write_json

# Fixed .npy header size: the shape is only known after streaming every document, so we reserve
# a header that fits any 1-D length and rewrite it in place at the end.
_NPY_HEADER_BYTES = 128
_SEP_BYTES = np.array([SEP_ID], dtype="<u2").tobytes()


def npy_header(length: int, descr: str = "<u2") -> bytes:
    """An .npy v1.0 header for a little-endian vector of `length` (uint16 by default, `"<u4"`
    for uint32), padded to 128 bytes."""
    fields = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({length},), }}"
    prefix = b"\x93NUMPY\x01\x00"
    body_len = _NPY_HEADER_BYTES - len(prefix) - 2
    body = fields.ljust(body_len - 1) + "\n"
    if len(body) != body_len:
        raise ValueError(f"stream length {length} does not fit the .npy header")
    return prefix + body_len.to_bytes(2, "little") + body.encode("latin1")


def _temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write_json(path: Path, obj: Any) -> None:
    """Writes `obj` as indented JSON to `path`, atomically (posenc's one JSON writer)."""
    write_json(path, obj, sort_keys=True)


def read_json(path: Path) -> Any:
    """The JSON object stored at `path`."""
    return json.loads(path.read_text())


def write_stream(path: Path, documents: Iterable[bytes]) -> dict[str, Any]:
    """Tokenizes documents into one uint16 `.npy` stream at `path` without holding it in memory.

    Each document's bytes are written followed by `SEP_ID`. A sidecar `<path>.json` records the
    token and document counts and the sha256 of the token bytes, so runs can be compared.

    Args:
      path: destination `.npy` file (parent folders are created).
      documents: raw UTF-8 bytes of each document, in stream order.

    Returns:
      The sidecar metadata: {"tokens", "documents", "sha256"}.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_path(path)
    digest = hashlib.sha256()
    tokens = 0
    count = 0
    try:
        with open(tmp, "wb") as f:
            f.write(npy_header(0))
            for doc in documents:
                chunk = bytes_to_ids(doc).astype("<u2", copy=False).tobytes() + _SEP_BYTES
                f.write(chunk)
                digest.update(chunk)
                tokens += len(doc) + 1
                count += 1
            f.seek(0)
            f.write(npy_header(tokens))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    meta = {"tokens": tokens, "documents": count, "sha256": digest.hexdigest()}
    atomic_write_json(stream_meta_path(path), meta)
    return meta


def stream_meta_path(path: Path) -> Path:
    """Where `write_stream` records the metadata of the stream at `path`."""
    return path.with_name(path.name + ".json")


def stream_summary(path: Path, files: int) -> dict[str, Any]:
    """A split's entry in `Source.info()`: its file count and its stream's tokens and hash."""
    meta = read_json(stream_meta_path(path))
    return {"files": files, "tokens": meta["tokens"], "stream_sha256": meta["sha256"]}


def stream_is_built(path: Path) -> bool:
    """Whether `write_stream` finished for `path` (the sidecar is written last)."""
    return path.exists() and stream_meta_path(path).exists()


def load_stream(path: Path) -> np.ndarray:
    """Memory-maps a stream written by `write_stream` (read-only, never loaded whole)."""
    arr = np.load(path, mmap_mode="r")
    if arr.dtype not in (np.uint16, np.uint32) or arr.ndim != 1:
        raise ValueError(f"{path} is not a token stream (dtype {arr.dtype}, {arr.ndim}-D)")
    return arr


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive advisory lock on `path` (created if needed) for the block.

    Used around steps that cannot be made atomic by a rename (TFDS writes a whole folder), so
    that a second process waits and then finds the work done.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
