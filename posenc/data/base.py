"""What every data source provides, the data directory, and the error for missing data."""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import Any

import numpy as np

# Canonical split names, in the order they are listed.
SPLITS: tuple[str, ...] = ("train", "validation", "test")
# Environment variable that overrides the default data directory.
DATA_DIR_ENV = "POSENC_DATA_DIR"
# Name of the config field that holds the source spec; errors name it so users know what to fix.
SOURCE_FIELD = "data.source"


class DataNotFoundError(FileNotFoundError):
    """A data set is not prepared (or not present); the message says what to run."""


def default_data_dir() -> Path:
    """The data directory used when none is given.

    Returns:
      `$POSENC_DATA_DIR` when set and non-empty, else `~/.cache/posenc/data`.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/posenc/data").expanduser()


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    """`data_dir` as an absolute Path, or the default data directory when None."""
    return (Path(data_dir).expanduser() if data_dir is not None else default_data_dir()).absolute()


class Source(abc.ABC):
    """A text corpus split into train/validation/test token streams.

    Attributes:
      spec: the spec string the source was made from (the `data.source` config value).
      splits: the canonical split names this source has, a subset of `SPLITS`.
    """

    spec: str
    splits: tuple[str, ...]

    @abc.abstractmethod
    def split_stream(self, split: str) -> np.ndarray:
        """All documents of one split as one token stream.

        Args:
          split: "train", "validation" or "test".

        Returns:
          uint16 array `[num_tokens]` (possibly a read-only memory map): each document's byte
          ids followed by `SEP_ID`.
        """

    @abc.abstractmethod
    def info(self) -> dict[str, Any]:
        """A JSON-able description (spec, per-split sizes, content identity) for run records."""

    def check_split(self, split: str) -> str:
        """Validates a split name against `SPLITS` and this source's splits.

        Args:
          split: the requested split.

        Returns:
          `split`, unchanged.
        """
        return check_split(self.spec, split, self.splits)


def check_split(spec: str, split: str, splits: tuple[str, ...]) -> str:
    """Validates a split name against `SPLITS` and the splits a source (`spec`) has.

    Returns:
      `split`, unchanged.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {list(SPLITS)}")
    if split not in splits:
        raise ValueError(
            f"{SOURCE_FIELD}={spec!r} has no {split!r} split; available splits: {list(splits)}"
        )
    return split
