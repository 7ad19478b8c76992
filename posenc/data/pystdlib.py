"""`pystdlib`: the running Python's standard-library sources, the always-offline default corpus.

About 12 MB of code in ~700 files for CPython 3.11: big enough to train a small model, small
enough to tokenize in well under a second. Tests and vendored packages are left out; the rest is
split by file (see `files.split_by_hash`) and cached as token streams keyed by a hash of the
content, so a different Python (or an edited file) gets its own cache.
"""

from __future__ import annotations

import platform
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

from posenc.data import storage
from posenc.data.base import SPLITS, Source
from posenc.data.files import content_sha256, list_files, split_by_hash
from posenc.data.tokenizer import VOCAB_SIZE

# Folders that hold tests, third-party packages or build configuration rather than stdlib code.
_EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)
_CACHE_VERSION = 1


def stdlib_root() -> Path:
    """The running interpreter's standard-library folder (the base one inside a venv)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _keep_dir(name: str) -> bool:
    # config-3.X-<platform> holds the build's Makefile and helpers, not library code.
    return name not in _EXCLUDED_DIRS and not name.startswith((".", "config-"))


def _keep_file(name: str) -> bool:
    # _sysconfigdata*.py records the build machine's paths and flags: leaving it out keeps the
    # content hash equal across machines that run the same Python release.
    return name.endswith(".py") and not name.startswith(("test_", "_sysconfigdata", "."))


def list_stdlib_files(root: Path) -> list[str]:
    """Relative paths of the stdlib `.py` files used by `pystdlib`, sorted.

    Args:
      root: the standard-library folder.

    Returns:
      Sorted POSIX relative paths, without tests, site-packages and build configuration.
    """
    return list_files(root, _keep_dir, _keep_file)


class PyStdlibSource(Source):
    """Token streams of the standard library, built once per content hash and memory-mapped.

    Args:
      data_dir: the data directory; caches go to `<data_dir>/posenc/pystdlib/<hash16>/`.
      root: standard-library folder to read; defaults to the running Python's (tests pass a
        small fake one).
      spec: the spec string to report.
    """

    def __init__(self, data_dir: Path, root: Path | None = None, spec: str = "pystdlib"):
        self.spec = spec
        self.splits = SPLITS
        self.root = Path(root) if root is not None else stdlib_root()
        if not self.root.is_dir():
            raise FileNotFoundError(f"standard-library folder {self.root} does not exist")
        relpaths = list_stdlib_files(self.root)
        if not relpaths:
            raise FileNotFoundError(f"no .py files found under {self.root}")
        # Reading ~12 MB and hashing it costs ~0.1 s, cheap enough to do on every start; it is
        # what guarantees that a cache is never reused for different content.
        self._contents = {rel: (self.root / rel).read_bytes() for rel in relpaths}
        self.content_sha256 = content_sha256(self._contents.items())
        self.files = split_by_hash(relpaths)
        self.cache_dir = Path(data_dir) / "posenc" / "pystdlib" / self.content_sha256[:16]
        self._ensure_built()
        # The bytes are only needed to build the cache.
        self._contents = {}

    def _stream_path(self, split: str) -> Path:
        return self.cache_dir / f"{split}.npy"

    def _ensure_built(self) -> None:
        for split in SPLITS:
            path = self._stream_path(split)
            if not storage.stream_is_built(path):
                storage.write_stream(path, (self._contents[rel] for rel in self.files[split]))
        info_path = self.cache_dir / "files.json"
        if not info_path.exists():
            storage.atomic_write_json(
                info_path,
                {"version": _CACHE_VERSION, "content_sha256": self.content_sha256, **self.files},
            )

    def split_stream(self, split: str) -> np.ndarray:
        """See `Source.split_stream`; documents are in sorted relative-path order."""
        return storage.load_stream(self._stream_path(self.check_split(split)))

    def info(self) -> dict[str, Any]:
        """See `Source.info`: spec, Python version, content hash, per-split files and tokens."""
        splits = {
            split: storage.stream_summary(self._stream_path(split), len(self.files[split]))
            for split in SPLITS
        }
        return {
            "spec": self.spec,
            "kind": "pystdlib",
            "python": platform.python_version(),
            "root": str(self.root),
            "content_sha256": self.content_sha256,
            "tokenizer": "bytes",
            "vocab_size": VOCAB_SIZE,
            "splits": splits,
            "cache_dir": str(self.cache_dir),
        }
