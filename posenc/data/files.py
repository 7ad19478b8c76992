"""Listing a folder of files, hashing its content, and splitting it by file.

A split assigns whole files (never parts of one) so that validation text is never seen in
training. The assignment of a file depends only on its relative path, through sha256 (Python's
`hash` is salted per process), so it is the same on every machine for the same file list.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from posenc.data.base import SPLITS

# Fractions of files for train / validation / test.
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.90, 0.05, 0.05)


def list_files(
    root: Path, keep_dir: Callable[[str], bool], keep_file: Callable[[str], bool]
) -> list[str]:
    """Relative POSIX paths of the files under `root`, sorted.

    Args:
      root: folder to walk (symlinked folders are not followed, so cycles are impossible).
      keep_dir: called with a folder's name; False prunes that folder.
      keep_file: called with a file's name; False skips it.

    Returns:
      Sorted relative paths using "/" separators (stable across operating systems).
    """
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if keep_dir(d))
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            if keep_file(name):
                out.append((rel_dir / name).as_posix())
    return sorted(out)


def content_sha256(items: Iterable[tuple[str, bytes]]) -> str:
    """sha256 over (relative path, bytes) pairs, framed so that no two listings collide.

    Args:
      items: (relative path, file content) in a fixed order (sorted paths).

    Returns:
      Hex digest.
    """
    digest = hashlib.sha256()
    for rel, data in items:
        name = rel.encode("utf-8")
        # Length prefixes make ("ab", "c") and ("a", "bc") hash differently.
        digest.update(len(name).to_bytes(8, "little") + name)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _unit_interval(rel: str) -> float:
    """A uniform number in [0, 1) determined by the relative path alone."""
    digest = hashlib.sha256(b"posenc-split\0" + rel.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_by_hash(
    relpaths: Iterable[str], fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
) -> dict[str, list[str]]:
    """Assigns each file to train/validation/test by a hash of its relative path.

    With 3 or more files every split gets at least one: an empty split takes the file with the
    highest hash value from the largest split. This only changes anything for tiny folders, and
    is still a pure function of the file list.

    Args:
      relpaths: relative paths (any order; the result is sorted).
      fractions: target fractions of files for (train, validation, test); must sum to 1.

    Returns:
      {"train": [...], "validation": [...], "test": [...]}, each sorted.
    """
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) < 0:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
    cut_train = fractions[0]
    cut_valid = fractions[0] + fractions[1]
    unit = {rel: _unit_interval(rel) for rel in sorted(set(relpaths))}
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for rel, u in unit.items():
        split = "train" if u < cut_train else "validation" if u < cut_valid else "test"
        out[split].append(rel)
    if len(unit) >= len(SPLITS):
        for split in SPLITS:
            if not out[split]:
                donor = max(SPLITS, key=lambda s: len(out[s]))
                moved = max(out[donor], key=unit.__getitem__)
                out[donor].remove(moved)
                out[split].append(moved)
    return {s: sorted(v) for s, v in out.items()}
