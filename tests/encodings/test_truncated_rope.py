"""Truncated RoPE with the partial key offset (modded-nanogpt's ``Yarn.rotary`` and
``CausalSelfAttention``'s ``key_offset``) against a float64 transcription of that code, on every
attention path at 1x and 16x the tile, through a cache's call, and in a model whose sliding
window layer decodes with a window-sized cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _rotary_paths import CASES, DH, H, cached_last_query, inputs, naive, run

from posenc import encodings, testing
from posenc.attention.core import check_implementation
from posenc.encodings import Dims


def rotary(x, positions):
    """Float64 transcription of modded-nanogpt's ``Yarn.reset`` + ``rotary``:
    ``angular_freq = (1/1024)^linspace(0, 1, Dh/4)`` repeated twice (interleaved), then
    ``Dh/2`` zeros; ``theta = t * angular_freq``; ``factor1 = cos(theta)``, ``factor2 =
    sin(theta)`` with its odd entries negated; ``x_flip`` swaps each pair ``(2j, 2j+1)``;
    ``out = factor1 * x + factor2 * x_flip``."""
    x = np.asarray(x, np.float64)
    dh = x.shape[-1]
    freq = (1 / 1024) ** np.linspace(0, 1, dh // 4)
    freq = np.concatenate([np.repeat(freq, 2), np.zeros(dh // 2)])  # [Dh]
    theta = np.asarray(positions, np.float64)[..., None, None] * freq  # [B, T, 1, Dh]
    factor1, factor2 = np.cos(theta), np.sin(theta)
    factor2[..., 1::2] *= -1
    flip = x.reshape(*x.shape[:-1], dh // 2, 2)[..., ::-1].reshape(x.shape)
    return factor1 * x + factor2 * flip


def key_offset(k):
    """``k[:, 1:, :, Dh/2:] = k[:, :-1, :, Dh/2:]`` (the previous token's stationary half)."""
    out = np.array(k, np.float64)
    out[:, 1:, :, k.shape[-1] // 2 :] = np.asarray(k, np.float64)[:, :-1, :, k.shape[-1] // 2 :]
    return out


def _enc(**hparams):
    return encodings.get("truncated_rope", **hparams).bind(Dims(H, DH, H * DH))


@pytest.mark.parametrize("offset", [False, True])
def test_rotate_is_the_codes(offset):
    q, k, _, q_pos, k_pos = inputs(7)
    qr, kr = _enc(key_offset=offset).rotate({}, *map(jnp.asarray, (q, k, q_pos, k_pos)))
    want_k = rotary(k, k_pos)
    want_k = key_offset(want_k) if offset else want_k
    np.testing.assert_allclose(qr, rotary(q, q_pos), atol=2e-5)
    np.testing.assert_allclose(kr, want_k, atol=2e-5)
    # The stationary half is never rotated: queries keep theirs, keys take the previous key's.
    np.testing.assert_array_equal(np.asarray(qr)[..., DH // 2 :], q[..., DH // 2 :])
    if offset:
        np.testing.assert_array_equal(np.asarray(kr)[:, 1:, :, DH // 2 :], k[:, :-1, :, DH // 2 :])
        np.testing.assert_array_equal(np.asarray(kr)[:, 0, :, DH // 2 :], k[:, 0, :, DH // 2 :])


def test_frequencies_run_from_one_to_one_over_1024():
    from posenc.encodings.truncated_rope import truncated_frequencies

    freq = np.asarray(truncated_frequencies(64))
    assert freq.shape == (16,) and freq[0] == 1.0
    np.testing.assert_allclose(freq[-1], 1 / 1024, rtol=1e-6)
    np.testing.assert_allclose(freq[1:] / freq[:-1], 1024 ** (-1 / 15), rtol=1e-5)


@pytest.mark.parametrize("t,causal,path,block", CASES)
def test_every_path_matches_the_transcription(t, causal, path, block):
    """With the key offset, which adds the shift to the rotation (the rotation alone is
    ``test_rotate_is_the_codes[False]``, and the battery runs it on every path)."""
    q, k, v, q_pos, k_pos = inputs(t, seed=t)
    want = naive(rotary(q, q_pos), key_offset(rotary(k, k_pos)), v, causal)
    got = run(_enc(key_offset=True), {}, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("t", [4, 64])
def test_a_caches_single_query_matches_the_transcription(t):
    """The cache keeps keys before ``rotate`` in time order and ``rotate`` reads them all, so the
    offset reads the previous slot; the empty slots after it change nothing."""
    q, k, v, q_pos, k_pos = inputs(t, seed=2)
    want = naive(rotary(q, q_pos), key_offset(rotary(k, k_pos)), v)[:, -1:]
    got = cached_last_query(_enc(key_offset=True), {}, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_logits_stay_relative_with_the_offset():
    enc = _enc(key_offset=True)
    q, k, _, _, _ = inputs(5, seed=3)
    pos = jnp.arange(k.shape[1])[None]

    def logits(shift):
        qr, kr = enc.rotate({}, jnp.asarray(q), jnp.asarray(k), pos[:, -5:] + shift, pos + shift)
        return np.asarray(jnp.einsum("bthd,bshd->bhts", qr, kr))

    np.testing.assert_allclose(logits(0), logits(300), rtol=1e-4, atol=1e-4)
    assert enc.relative and enc.cacheable and enc.key_lookback == 1
    assert _enc().key_lookback == 0


@pytest.mark.slow  # about 35 s on a CPU: two-layer models compiled for decoding
def test_a_sliding_window_cache_keeps_the_key_the_offset_reads():
    """The battery's pattern check decodes a sliding-window layer with a window-sized cache and
    compares with a full pass; with the offset the cache keeps one slot more."""
    testing.check_encoder(encodings.get("truncated_rope", key_offset=True), checks=("patterns",))


def test_the_linear_paths_refuse_the_offset_in_one_line():
    check_implementation(_enc(), "linear")  # the rotation alone is a rotation of the features
    with pytest.raises(ValueError, match="key_lookback") as error:
        check_implementation(_enc(key_offset=True), "linear")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("head_dim", [6, 18])
def test_a_head_not_divisible_by_4_is_refused_in_one_line(head_dim):
    with pytest.raises(ValueError, match="divisible by 4") as error:
        encodings.get("truncated_rope").bind(Dims(2, head_dim, 2 * head_dim))
    assert "\n" not in str(error.value)


def test_bad_key_offset_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"key_offset must be one of \[False, True\]") as error:
        encodings.get("truncated_rope", key_offset="yes")
    assert "\n" not in str(error.value)


def test_gradients_flow_through_the_shifted_keys():
    enc = _enc(key_offset=True)
    k = jax.random.normal(jax.random.key(0), (1, 4, H, DH))
    pos = jnp.arange(4)[None]
    grad = jax.grad(lambda k: enc.rotate({}, k, k, pos, pos)[1][:, 2, :, DH // 2 :].sum())(k)
    # Key 2's stationary half is key 1's: the gradient lands on key 1 only.
    assert np.asarray(grad)[:, 1, :, DH // 2 :].all() and not np.asarray(grad)[:, 2].any()
