"""ALiBi (Press, Smith, Lewis 2022): the paper's head slopes and the bias -m_h * (i - j), and
attention with it on every path at the training length and at 16 times it (where the paper's
claim is made)."""

from __future__ import annotations

import _bias_attention as ba
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, alibi_slopes


def test_eight_heads_are_one_half_to_one_256th():
    # Sec. 3: "For models with 8 heads, the slopes that we used are the geometric sequence
    # 1/2^1, 1/2^2, ..., 1/2^8" — powers of two, exact in float32.
    np.testing.assert_array_equal(alibi_slopes(8), [2.0**-h for h in range(1, 9)])
    assert alibi_slopes(8).dtype == np.float32


def test_power_of_two_head_counts_follow_two_to_minus_eight_h_over_n():
    np.testing.assert_array_equal(alibi_slopes(1), [2.0**-8])
    np.testing.assert_array_equal(alibi_slopes(4), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    np.testing.assert_allclose(alibi_slopes(16), [2.0 ** (-h / 2) for h in range(1, 17)], rtol=1e-7)


def test_twelve_heads_by_the_non_power_of_two_rule():
    # 12 is not a power of two: take the 8-head slopes 2^-1 .. 2^-8, then every other slope of
    # the 16-head sequence 2^(-8h/16) = 2^(-h/2), h = 1..16, i.e. h = 1, 3, 5, 7, ... and keep the
    # first 12 - 8 = 4 of them: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
    expected = [2.0**-h for h in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    np.testing.assert_allclose(alibi_slopes(12), expected, rtol=1e-7)
    # 6 heads: 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3 from the 8-head sequence.
    np.testing.assert_array_equal(
        alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    )


@pytest.mark.parametrize("bad", [0, -4, 2.0])
def test_bad_head_count_is_rejected(bad):
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(bad)


@pytest.mark.parametrize("heads", [8, 12])
def test_bias_is_minus_slope_times_distance(heads):
    enc = encodings.get("alibi").bind(Dims(num_heads=heads, head_dim=4, model_dim=4 * heads))
    assert enc.hooks == ("bias",)
    assert enc.init(jax.random.key(0), enc.bound_dims) == {}
    q_pos = np.array([[5, 6, 7], [100, 101, 102]])  # per-row offsets, keys around the queries
    k_pos = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8], [95, 96, 97, 98, 99, 100, 101, 102, 103]])
    got = np.asarray(jax.jit(enc.bias)({}, jnp.asarray(q_pos), jnp.asarray(k_pos)))
    assert got.shape == (2, heads, 3, 9)
    slopes = 2.0 ** -np.arange(1.0, 9.0)
    if heads == 12:
        slopes = np.concatenate([slopes, 2.0 ** -np.array([0.5, 1.5, 2.5, 3.5])])
    for b in range(2):
        for h in range(heads):
            for i in range(3):
                for j in range(9):
                    qi, kj = q_pos[b, i], k_pos[b, j]
                    if kj <= qi:  # the paper's -m (i - j) on the keys a causal query sees
                        expected = -slopes[h] * (qi - kj)
                    else:  # keys after the query (bidirectional use): -m (j - i)
                        expected = -slopes[h] * (kj - qi)
                    np.testing.assert_allclose(got[b, h, i, j], expected, rtol=1e-6)


# Three heads, not a power of two: the 2-head slopes 2^-4, 2^-8, then every other slope of the
# 4-head sequence 2^(-2h) (h = 1, 3, ...), keeping the first 3 - 2 = 1 of them: 2^-2.
THREE_HEAD_SLOPES = np.array([2.0**-4, 2.0**-8, 2.0**-2])


def _paper_bias(q_pos, k_pos):
    distance = np.abs(q_pos[:, None, :, None] - k_pos[:, None, None, :])  # [B, 1, T, S]
    return -THREE_HEAD_SLOPES[None, :, None, None] * distance


@pytest.mark.parametrize("length,causal,path,block", ba.CASES)
def test_every_path_equals_naive_attention_with_the_paper_bias(length, causal, path, block):
    enc = encodings.get("alibi").bind(Dims(num_heads=ba.H, head_dim=ba.DH, model_dim=ba.H * ba.DH))
    q, k, v, q_pos, k_pos = ba.inputs(length, seed=length)
    block = ba.block_for(path, block, length)
    got = ba.run(enc, {}, path, block, q, k, v, q_pos, k_pos, causal)
    expected = ba.naive(q, k, v, q_pos, k_pos, _paper_bias, causal)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
