"""T5 relative position buckets (Raffel et al. 2020, Sec. 2.1; the Mesh-TF/T5 reference code)
against values worked out by hand, and the bias as a lookup of one shared [buckets, H] table;
attention with it on every path at the training length and at 16 times it."""

from __future__ import annotations

import math

import _bias_attention as ba
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, relative_position_bucket

_bucket = jax.jit(
    relative_position_bucket, static_argnames=("bidirectional", "num_buckets", "max_distance")
)


def _hand_bucket(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int):
    """The paper's definition, scalar by scalar: n = i - j is how far back the key is.

    Causal: all buckets for n >= 0 (future keys go to 0). Bidirectional: half the buckets per
    direction, keys after the query (n < 0) in the upper half. Within a direction, half of the
    buckets are exact (n < max_exact), the rest log-spaced up to max_distance, then capped.
    """
    n = -relative_position
    offset = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            offset = num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return offset + n
    log_part = math.log(n / max_exact) / math.log(max_distance / max_exact)
    return offset + min(num_buckets - 1, max_exact + int(log_part * (num_buckets - max_exact)))


def test_causal_32_buckets_128_distance_by_hand():
    # Exact: n = 0..15 -> bucket n. Then 16 + int(log(n/16) / log(8) * 16), capped at 31:
    #   n=16: log 1 = 0                      -> 16
    #   n=17: 0.0606 / 2.0794 * 16 = 0.47    -> 16
    #   n=20: 0.2231 / 2.0794 * 16 = 1.72    -> 17
    #   n=24: 0.4055 / 2.0794 * 16 = 3.12    -> 19
    #   n=32: log 2 / log 8 * 16 = 5.33      -> 21
    #   n=45: 1.0341 / 2.0794 * 16 = 7.96    -> 23
    #   n=46: 1.0561 / 2.0794 * 16 = 8.13    -> 24
    #   n=64: log 4 / log 8 * 16 = 10.67     -> 26
    #   n=100: 1.8326 / 2.0794 * 16 = 14.10  -> 30
    #   n=127: 2.0716 / 2.0794 * 16 = 15.94  -> 31
    #   n=128: 16 + 16 = 32, capped          -> 31
    by_hand = {n: n for n in range(16)}
    by_hand.update(
        {16: 16, 17: 16, 20: 17, 24: 19, 32: 21, 45: 23, 46: 24, 64: 26, 100: 30, 127: 31}
    )
    by_hand.update({128: 31, 129: 31, 500: 31, 10**6: 31})
    n = np.array(sorted(by_hand))
    got = np.asarray(_bucket(jnp.asarray(-n), bidirectional=False))  # argument is j - i = -n
    np.testing.assert_array_equal(got, [by_hand[x] for x in n])
    # Future keys (j > i) share bucket 0 in a causal model.
    future = np.asarray(_bucket(jnp.asarray([1, 5, 1000]), bidirectional=False))
    np.testing.assert_array_equal(future, [0, 0, 0])


def test_bidirectional_32_buckets_by_hand():
    # 16 buckets per direction, 8 exact, then 8 + int(log(n/8) / log(16) * 8), capped at 15;
    # keys after the query (j - i > 0) use buckets 16..31.
    #   n=9:  0.1178 / 2.7726 * 8 = 0.34 -> 8;   n=12: 0.4055 / 2.7726 * 8 = 1.17 -> 9
    #   n=16: log 2 / log 16 * 8 = 2 -> 10;       n=32: -> 12;   n=64: -> 14;   n=128: -> 15
    rel = np.array([0, -1, -7, -9, -12, -16, -32, -64, -128, -5000, 1, 7, 12, 16, 64, 5000])
    expected = [0, 1, 7, 8, 9, 10, 12, 14, 15, 15, 17, 23, 25, 26, 30, 31]
    got = np.asarray(_bucket(jnp.asarray(rel), bidirectional=True))
    np.testing.assert_array_equal(got, expected)


def test_docstring_example_8_buckets_16_distance():
    n = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 15, 16, 1000])
    expected = [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 7, 7, 7]
    got = _bucket(jnp.asarray(-n), bidirectional=False, num_buckets=8, max_distance=16)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize(
    "bidirectional,num_buckets,max_distance",
    [(False, 32, 128), (True, 32, 128), (False, 8, 16), (True, 64, 256), (False, 16, 100)],
)
def test_every_distance_matches_the_definition(bidirectional, num_buckets, max_distance):
    rel = np.arange(-1500, 1500)
    got = np.asarray(
        _bucket(
            jnp.asarray(rel),
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
    )
    expected = [_hand_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.int32 and got.min() == 0 and got.max() == num_buckets - 1
    # Monotone non-decreasing in how far back the key is, and capped beyond max_distance.
    back = got[rel <= 0][::-1]  # n = 0, 1, 2, ...
    assert (np.diff(back) >= 0).all()
    half = num_buckets // 2 if bidirectional else num_buckets
    assert (back[max_distance:] == half - 1).all()
    if bidirectional:
        ahead = got[rel > 0]  # j - i = 1, 2, ...
        assert (np.diff(ahead) >= 0).all() and (ahead >= half).all()


def test_bias_is_table_lookup_by_bucket_per_head():
    h = 3
    enc = encodings.get("t5", num_buckets=8, max_distance=16).bind(
        Dims(num_heads=h, head_dim=8, model_dim=24)
    )
    assert enc.hooks == ("bias",) and enc.param_scope == "shared"
    params = enc.init(jax.random.key(0), enc.bound_dims)
    table = np.asarray(params["table"])
    assert table.shape == (8, h)
    q_pos = np.array([[20, 21, 22, 23, 24], [0, 1, 2, 3, 4]])
    k_pos = np.array([[0, 4, 8, 12, 16, 20, 24], [0, 1, 2, 3, 4, 5, 6]])
    got = np.asarray(jax.jit(enc.bias)(params, jnp.asarray(q_pos), jnp.asarray(k_pos)))
    assert got.shape == (2, h, 5, 7)
    for b in range(2):
        for i in range(5):
            for j in range(7):
                bucket = _hand_bucket(int(k_pos[b, j] - q_pos[b, i]), False, 8, 16)
                np.testing.assert_array_equal(got[b, :, i, j], table[bucket])


@pytest.mark.parametrize(
    "hparams,field",
    [
        ({"bidirectional": True, "num_buckets": 30}, "num_buckets"),
        ({"bidirectional": True, "num_buckets": 6}, "multiple of 4"),
        ({"num_buckets": 1}, "num_buckets"),
        ({"num_buckets": 32, "max_distance": 16}, "max_distance"),
    ],
)
def test_bad_hyperparameters_are_rejected(hparams, field):
    with pytest.raises(ValueError, match=field):
        encodings.get("t5", **hparams)


@pytest.mark.parametrize("length,causal,path,block", ba.CASES)
def test_every_path_equals_naive_attention_with_the_bucket_bias(length, causal, path, block):
    """The default 32 buckets up to distance 128: the long window (2048) reaches the log buckets
    and, far past it, the cap; bidirectional attention takes the bidirectional buckets."""
    bidirectional = not causal
    enc = encodings.get("t5", bidirectional=bidirectional).bind(Dims(ba.H, ba.DH, ba.H * ba.DH))
    params = enc.init(jax.random.key(4), enc.bound_dims)
    table = 50.0 * np.asarray(params["table"], np.float64)  # [buckets, H], init_std 0.02 -> 1
    bucket = np.vectorize(lambda r: _hand_bucket(int(r), bidirectional, 32, 128))

    def bias(q_pos, k_pos):
        rel = k_pos[:, None, :] - q_pos[:, :, None]  # [B, T, S]: j - i
        distances, where = np.unique(rel, return_inverse=True)  # the hand rule once per distance
        return table[bucket(distances)[where.reshape(rel.shape)]].transpose(0, 3, 1, 2)

    q, k, v, q_pos, k_pos = ba.inputs(length, seed=length)
    block = ba.block_for(path, block, length)
    scaled = {"table": jnp.asarray(table, jnp.float32)}
    got = ba.run(enc, scaled, path, block, q, k, v, q_pos, k_pos, causal)
    expected = ba.naive(q, k, v, q_pos, k_pos, bias, causal)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
