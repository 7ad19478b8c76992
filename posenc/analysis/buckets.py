"""Buckets of relative distance (and of query position): ``0`` alone, then a fixed number per
octave of ``|d|``, mirrored for negative distances.

With four per octave (:data:`FINE`): ``0, 1, 2, ..., 7, 8-9, 10-11, 12-13, 14-15, 16-19, ...``;
with one (:data:`COARSE`): ``0, 1, 2-3, 4-7, ...``. Fine buckets nest in coarse ones, so a table
in octaves is the pair-weighted mean of the fine buckets.
"""

from __future__ import annotations

import numpy as np

FINE, COARSE = 4, 1  # buckets per octave: the CSV, JSON and plots; the markdown tables


def distance_buckets(low: int, high: int, per_octave: int) -> np.ndarray:
    """``[n, 2]`` int64 inclusive ``(first, last)`` distances of the buckets covering
    ``low .. high`` (``per_octave`` per octave of ``|d|``, fewer where two would hold the same
    integers)."""
    d = np.arange(low, high + 1)
    magnitude = np.floor(per_octave * np.log2(np.maximum(np.abs(d), 1))).astype(np.int64)
    key = np.sign(d) * (1 + magnitude) * (d != 0)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(d)] - 1
    return np.stack([d[starts], d[ends]], axis=1)


def bucket_sums(x: np.ndarray, buckets: np.ndarray, low: int) -> np.ndarray:
    """Sums the last axis of ``x`` (entry ``c`` is distance ``low + c``) over ``buckets``
    (contiguous, covering it): ``[..., n_d] -> [..., n]``."""
    return np.add.reduceat(x, buckets[:, 0] - low, axis=-1)
