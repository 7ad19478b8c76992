"""rel_shift / rel_unshift (posenc.encodings.relative) against their documented index formulas."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from posenc.encodings import rel_shift, rel_unshift
from posenc.encodings.relative import pairwise_offsets, relative_offsets

# (T, S): a single query, square, more queries than keys, more keys than queries.
SHAPES = [(1, 1), (1, 6), (4, 4), (5, 2), (6, 1), (3, 8), (7, 7)]


def _naive_shift(x: np.ndarray) -> np.ndarray:
    """out[..., i, j] = x[..., i, j + T - 1 - i] by explicit loops."""
    *lead, t, r = x.shape
    s = r - t
    out = np.zeros((*lead, t, s), x.dtype)
    for i in range(t):
        for j in range(s):
            out[..., i, j] = x[..., i, j + t - 1 - i]
    return out


def _naive_unshift(y: np.ndarray) -> np.ndarray:
    """out[..., i, r] = y[..., i, r - (T - 1 - i)] where that key exists, else 0."""
    *lead, t, s = y.shape
    out = np.zeros((*lead, t, t + s), y.dtype)
    for i in range(t):
        for r in range(t + s):
            j = r - (t - 1 - i)
            if 0 <= j < s:
                out[..., i, r] = y[..., i, j]
    return out


@pytest.mark.parametrize("t,s", SHAPES)
def test_rel_shift_matches_index_formula(t, s):
    rng = np.random.default_rng(t * 100 + s)
    x = rng.standard_normal((2, 3, t, t + s)).astype(np.float32)
    got = np.asarray(rel_shift(jnp.asarray(x)))
    assert got.shape == (2, 3, t, s)
    np.testing.assert_array_equal(got, _naive_shift(x))


def test_rel_shift_docstring_example():
    # T = 2, S = 3; the docstring's a..h, with the pad column set to a value no output may use.
    x = np.array([[1, 2, 3, 4, -99], [5, 6, 7, 8, -99]], np.float32)
    np.testing.assert_array_equal(np.asarray(rel_shift(jnp.asarray(x))), [[2, 3, 4], [5, 6, 7]])


def test_rel_shift_never_reads_the_pad_column():
    # Every output value must come from columns 0..T+S-2; the last column is padding.
    t, s = 5, 4
    x = np.zeros((t, t + s), np.float32)
    x[:, -1] = np.nan
    assert np.isfinite(np.asarray(rel_shift(jnp.asarray(x)))).all()


@pytest.mark.parametrize("t,s", SHAPES)
def test_rel_unshift_matches_index_formula(t, s):
    rng = np.random.default_rng(7 + t * 10 + s)
    y = rng.standard_normal((2, t, s)).astype(np.float32)
    got = np.asarray(rel_unshift(jnp.asarray(y)))
    assert got.shape == (2, t, t + s)
    np.testing.assert_array_equal(got, _naive_unshift(y))


@pytest.mark.parametrize("t,s", SHAPES)
def test_rel_unshift_is_the_transpose_of_rel_shift(t, s):
    # <rel_shift(x), y> == <x, rel_unshift(y)> for random x, y.
    rng = np.random.default_rng(11 + t * 10 + s)
    x = rng.standard_normal((3, t, t + s)).astype(np.float32)
    y = rng.standard_normal((3, t, s)).astype(np.float32)
    lhs = np.sum(np.asarray(rel_shift(jnp.asarray(x)), np.float64) * y)
    rhs = np.sum(x.astype(np.float64) * np.asarray(rel_unshift(jnp.asarray(y)), np.float64))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5, atol=1e-5)


def test_rel_shift_rejects_too_few_columns():
    with pytest.raises(ValueError, match="S >= 1"):
        rel_shift(jnp.zeros((4, 4)))


def test_relative_offsets_columns_hold_key_minus_query_offset():
    # Column r holds (k0 - q0) + r - (T - 1), per batch row.
    q_pos = np.array([[10, 11, 12], [0, 1, 2]])
    k_pos = np.array([[5, 6, 7, 8, 9, 10, 11, 12], [0, 1, 2, 3, 4, 5, 6, 7]])
    got = np.asarray(relative_offsets(jnp.asarray(q_pos), jnp.asarray(k_pos)))
    t, s = 3, 8
    for b in range(2):
        expected = [(k_pos[b, 0] - q_pos[b, 0]) + r - (t - 1) for r in range(t + s)]
        np.testing.assert_array_equal(got[b], expected)
    # The pair (i, j) sits at column j - i + T - 1.
    pair = np.asarray(pairwise_offsets(jnp.asarray(q_pos), jnp.asarray(k_pos)))
    for b in range(2):
        for i in range(t):
            for j in range(s):
                assert pair[b, i, j] == k_pos[b, j] - q_pos[b, i] == got[b, j - i + t - 1]
