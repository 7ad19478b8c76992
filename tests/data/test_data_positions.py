"""Randomized positions (Ruoss et al. 2023): sorted random subsets of [0, max_position)."""

from __future__ import annotations

import numpy as np
import pytest

from posenc.data import batch_positions, random_positions


def test_a_sorted_subset_of_the_range_drawn_deterministically():
    draw = random_positions(seed=3, index=7, length=40, max_position=2048)
    assert draw.dtype == np.int32 and draw.shape == (40,)
    assert (np.diff(draw) > 0).all(), "strictly increasing: distinct and sorted"
    assert draw.min() >= 0 and draw.max() < 2048
    np.testing.assert_array_equal(draw, random_positions(3, 7, 40, 2048))
    others = [random_positions(3, 8, 40, 2048), random_positions(4, 7, 40, 2048)]
    others.append(random_positions(3, 7, 40, 2048, purpose="eval"))
    assert all(not np.array_equal(draw, other) for other in others)
    # Drawing every position leaves nothing to choose.
    np.testing.assert_array_equal(random_positions(0, 0, 16, 16), np.arange(16))


def test_draws_cover_the_range_uniformly():
    """Each position is drawn with probability length / max_position."""
    counts = np.zeros(64)
    for step in range(2000):
        counts[random_positions(1, step, 8, 64)] += 1
    expected = 2000 * 8 / 64  # 250
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)


def test_a_batch_shares_one_draw():
    batch = batch_positions(2, 5, rows=3, length=10, max_position=100)
    assert batch.shape == (3, 10) and batch.flags.writeable
    for row in batch:
        np.testing.assert_array_equal(row, random_positions(2, 5, 10, 100))


def test_more_positions_than_the_range_is_a_clear_error():
    with pytest.raises(ValueError, match=r"draw 50 distinct positions .* train.max_position"):
        random_positions(0, 0, 50, 40)
