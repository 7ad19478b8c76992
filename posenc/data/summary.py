"""What a data source's splits hold, for people to read (``posenc data prepare`` / ``info``).

:func:`describe` lists, split by split, the files (with their sizes), the bytes and the tokens,
and the rule that assigned the files; :func:`thin_splits` names the evaluation splits too small
to measure at a length.

Too small to measure: scored as non-overlapping windows of ``L`` tokens (posenc's default), a
split of ``N`` tokens gives ``(N - 1) // L`` windows; with fewer than :data:`MIN_WINDOWS` the
mean at that length rests on a handful of passages of text (their variation, not the model's,
can decide a comparison), so it is flagged. Evaluation warns the same way at its own lengths
(:func:`thin_lengths`).
"""

from __future__ import annotations

import hashlib
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.data.base import SPLITS, Source
from posenc.data.files import DEFAULT_FRACTIONS

# A split gives fewer windows of the longest evaluation length than this: flagged.
MIN_WINDOWS = 4
# The longest evaluation length `posenc data prepare` checks the splits against by default.
DEFAULT_LONGEST = 1024
# Files listed per split (the rest are counted).
MAX_FILES = 20
_EVAL_SPLITS = ("validation", "test")


class ThinSplitWarning(UserWarning):
    """An evaluation split gives fewer than :data:`MIN_WINDOWS` windows at some length."""


def split_rule(info: dict[str, Any]) -> str:
    """How the source assigned its text to splits, in one sentence."""
    train, valid, test = (round(100 * f) for f in DEFAULT_FRACTIONS)
    by_hash = (
        f"whole files, by a hash (sha256) of each file's relative path: about {train} % of the "
        f"files to train, {valid} % to validation and {test} % to test, at least one file each "
        "(the same files on every machine)"
    )
    kind, layout = info.get("kind"), info.get("layout")
    if kind == "textdir" and layout == "split_dirs":
        return (
            "splits from the folder's train/, validation/ (or valid/, dev/) and test/ "
            "subfolders; files elsewhere are ignored"
        )
    if kind == "textdir":
        return (
            f"{by_hash}. To choose the split of each file, put them in train/, validation/ "
            "and test/ subfolders"
        )
    if kind == "pystdlib":
        return by_hash
    return "the data set's own splits"


def windows(tokens: int, length: int) -> int:
    """Non-overlapping windows of ``length`` tokens in a split of ``tokens`` tokens."""
    return max(0, (tokens - 1) // length)


def thin_lengths(tokens: int, lengths: Sequence[int], min_windows: int = MIN_WINDOWS) -> list[int]:
    """The lengths at which a split of ``tokens`` tokens gives fewer than ``min_windows``
    non-overlapping windows (but at least one; a length with none is an error elsewhere)."""
    return [n for n in lengths if 1 <= windows(tokens, n) < min_windows]


def thin_splits(info: dict[str, Any], longest: int, min_windows: int = MIN_WINDOWS) -> list[str]:
    """One line per evaluation split too small to measure at ``longest`` tokens."""
    lines = []
    for split in _EVAL_SPLITS:
        entry = info.get("splits", {}).get(split)
        if not entry or entry.get("tokens") is None:
            continue
        n = windows(entry["tokens"], longest)
        if n < min_windows:
            lines.append(
                f"the {split} split holds {entry['tokens']:,} tokens: {n} windows of {longest:,} "
                f"tokens, fewer than {min_windows}, too few to measure at that length (a "
                "comparison there would rest on a few passages). Give it more text, or "
                f"evaluate at lengths up to {max(1, (entry['tokens'] - 1) // min_windows):,}"
            )
    return lines


def _file_sizes(source: Source) -> dict[str, list[tuple[str, int | None]]] | None:
    """``{split: [(relative path, bytes or None if gone)]}`` for sources made of files."""
    files = getattr(source, "files", None)
    folder = getattr(source, "folder", None) or getattr(source, "root", None)
    if not isinstance(files, dict) or folder is None:
        return None
    out = {}
    for split, relpaths in files.items():
        out[split] = []
        for rel in relpaths:
            path = Path(folder) / rel
            out[split].append((rel, path.stat().st_size if path.is_file() else None))
    return out


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n:,} bytes"


def describe(
    source: Source, longest: int = DEFAULT_LONGEST, max_files: int = MAX_FILES
) -> tuple[list[str], list[str]]:
    """The splits of ``source`` for people to read, and the warnings about them.

    Args:
      source: a prepared source.
      longest: the longest evaluation length to check the evaluation splits against.
      max_files: files listed per split (largest first; the rest are counted).

    Returns:
      ``(lines, warnings)``: per split its files, bytes and tokens, then the split rule; and
      :func:`thin_splits`'s lines.
    """
    info = source.info()
    sizes = _file_sizes(source)
    lines = [f"{info.get('spec', '?')}: content sha256 {str(info.get('content_sha256'))[:16]}"]
    for split in SPLITS:
        entry = info.get("splits", {}).get(split)
        if entry is None:
            lines.append(f"  {split}: none")
            continue
        head = f"  {split}: {entry.get('tokens', 0):,} tokens"
        listed = (sizes or {}).get(split)
        if listed is not None:
            total = sum(b for _, b in listed if b is not None)
            head += f", {len(listed)} file{'s' if len(listed) != 1 else ''}, {total:,} bytes"
        lines.append(head)
        for rel, size in sorted(listed or [], key=lambda f: -(f[1] or 0))[:max_files]:
            lines.append(f"      {rel} ({_size(size)})")
        if listed is not None and len(listed) > max_files:
            lines.append(f"      ... and {len(listed) - max_files} more files")
    lines += textwrap.wrap(
        f"rule: {split_rule(info)}.", width=100, initial_indent="  ", subsequent_indent="    "
    )
    return lines, thin_splits(info, longest) + _small_train(info) + _repeated(source, sizes)


def _repeated(source: Source, sizes: dict[str, list[tuple[str, int | None]]] | None) -> list[str]:
    """A line per evaluation split with files whose bytes are also a training file's (found
    among files of equal size, then compared by sha256): text the model was trained on."""
    if not sizes:
        return []
    folder = Path(getattr(source, "folder", None) or source.root)

    def digest(rel: str) -> str:
        return hashlib.sha256((folder / rel).read_bytes()).hexdigest()

    train = [(rel, b) for rel, b in sizes.get("train", []) if b is not None]
    lines = []
    for split in _EVAL_SPLITS:
        sized = {b for _, b in train}
        candidates = [(r, b) for r, b in sizes.get(split, []) if b in sized]
        if not candidates:
            continue
        wanted = {b for _, b in candidates}
        hashes = {digest(rel): rel for rel, b in train if b in wanted}
        same = [(r, hashes[d]) for r, _ in candidates if (d := digest(r)) in hashes]
        if same:
            pairs = ", ".join(f"{r} = {t}" for r, t in same[:5])
            lines.append(
                f"{len(same)} file(s) of the {split} split repeat a train file byte for byte "
                f"({pairs}): the model trains on that text; remove the copies"
            )
    return lines


def _small_train(info: dict[str, Any]) -> list[str]:
    """A line if the train split holds less than half of the tokens (a few files split by
    hash can land that way)."""
    tokens = {s: e.get("tokens") or 0 for s, e in info.get("splits", {}).items()}
    total = sum(tokens.values())
    if total and tokens.get("train", 0) < total / 2:
        return [
            f"the train split holds {tokens.get('train', 0):,} of the {total:,} tokens "
            f"({100 * tokens.get('train', 0) / total:.0f} %); with few files a split by file "
            "can land far from its shares: add files, or choose the splits with train/, "
            "validation/ and test/ subfolders"
        ]
    return []


def warn_thin(tokens: int, lengths: Sequence[int], split: str) -> None:
    """Warns (:class:`ThinSplitWarning`) when ``split`` gives fewer than :data:`MIN_WINDOWS`
    windows at some of ``lengths``."""
    thin = thin_lengths(tokens, lengths)
    if thin:
        counts = ", ".join(f"{windows(tokens, n)} at L = {n}" for n in thin)
        warnings.warn(
            f"the {split} split ({tokens:,} tokens) gives few non-overlapping windows ({counts}; "
            f"fewer than {MIN_WINDOWS}): numbers at those lengths rest on a few passages of text",
            ThinSplitWarning,
            stacklevel=2,  # the checking function's line: one warning however often it checks
        )
