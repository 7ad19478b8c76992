"""HoPE (Chen et al., ACL 2025) against a float64 transcription of its definition: RoPE's pairs
that complete at least ``min_turns`` turns over the training length rotate, the others are left
as they are (position-independent); on every attention path at 1x and 16x the tile, through a
cache's call, and equal to p-RoPE with the same pairs kept."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _rotary_paths import CASES, DH, H, cached_last_query, inputs, naive, run

from posenc import encodings
from posenc.encodings import Dims, apply_rope

L = 40  # training length: with Dh = 16 pairs 0 and 1 complete a turn (theta L >= 2 pi)


def hope(x, positions, train_len, base=1e4, layout="half", min_turns=1.0):
    """Float64, from the paper: pair ``i`` turns by ``m theta_i``, ``theta_i = base^(-2i/Dh)``,
    if ``theta_i L >= 2 pi min_turns`` (it completes ``min_turns`` periods within ``L``), and is
    the identity otherwise. ``x: [B, T, H, Dh]``, ``positions: [B, T]``."""
    x = np.asarray(x, np.float64)
    dh = x.shape[-1]
    out = x.copy()
    for i in range(dh // 2):
        theta = base ** (-2.0 * i / dh)
        if theta * train_len < 2 * math.pi * min_turns:
            continue
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + dh // 2)
        angle = np.asarray(positions, np.float64)[..., None] * theta  # [B, T, 1]
        c, s = np.cos(angle), np.sin(angle)
        out[..., a] = c * x[..., a] - s * x[..., b]
        out[..., b] = s * x[..., a] + c * x[..., b]
    return out


def _enc(**hparams):
    return encodings.get("hope", **{"train_len": L, **hparams}).bind(Dims(H, DH, H * DH))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("min_turns,rotating", [(1.0, 2), (3.0, 1)])
def test_rotation_is_the_papers(layout, min_turns, rotating):
    enc = _enc(layout=layout, min_turns=min_turns)
    q, k, _, q_pos, k_pos = inputs(6)
    qr, kr = enc.rotate({}, jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos), jnp.asarray(k_pos))
    np.testing.assert_allclose(qr, hope(q, q_pos, L, layout=layout, min_turns=min_turns), atol=2e-5)
    np.testing.assert_allclose(kr, hope(k, k_pos, L, layout=layout, min_turns=min_turns), atol=2e-5)
    # The pairs that do not turn min_turns times are the input exactly, at every position.
    still = np.arange(rotating, DH // 2)
    chans = np.r_[still, still + DH // 2] if layout == "half" else np.r_[2 * still, 2 * still + 1]
    np.testing.assert_array_equal(np.asarray(kr)[..., chans], k[..., chans])
    assert not np.allclose(np.asarray(kr)[..., rotating - 1], k[..., rotating - 1])


@pytest.mark.parametrize("t,causal,path,block", CASES)
def test_every_path_matches_the_transcription(t, causal, path, block):
    enc = _enc()
    q, k, v, q_pos, k_pos = inputs(t, seed=t)
    want = naive(hope(q, q_pos, L), hope(k, k_pos, L), v, causal)
    got = run(enc, {}, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("t", [4, 64])
def test_a_caches_single_query_matches_the_transcription(t):
    enc = _enc()
    q, k, v, q_pos, k_pos = inputs(t, seed=1)
    want = naive(hope(q, q_pos, L), hope(k, k_pos, L), v)[:, -1:]
    np.testing.assert_allclose(cached_last_query(enc, {}, q, k, v, q_pos, k_pos), want, atol=2e-5)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("train_len", [8, 40, 400, 4000])
def test_hope_is_p_rope_with_the_pairs_that_turn_within_the_training_length(layout, train_len):
    """p-RoPE's ``p = 2k / Dh`` with ``k`` the pairs that complete a turn within ``L``."""
    x = jax.random.normal(jax.random.key(0), (2, 9, H, DH))
    positions = jnp.stack([jnp.arange(9), jnp.arange(9) * 13 + 100])
    kept = sum(1e4 ** (-2 * i / DH) * train_len >= 2 * math.pi for i in range(DH // 2))
    enc = _enc(layout=layout, train_len=train_len)
    got, _ = enc.rotate({}, x, x, positions, positions)
    p_rope = apply_rope(x, positions, layout=layout, rotated_frequencies=2 * kept / DH)
    np.testing.assert_allclose(got, p_rope, rtol=1e-6, atol=1e-6)


def test_logits_are_relative_and_need_no_decay():
    enc = _enc()
    q = jax.random.normal(jax.random.key(2), (1, 1, H, DH))
    k = jax.random.normal(jax.random.key(3), (1, 1, H, DH))

    def logit(m, n):
        qr, kr = enc.rotate({}, q, k, jnp.array([[m]]), jnp.array([[n]]))
        return np.asarray(jnp.einsum("bthd,bshd->bh", qr, kr))

    np.testing.assert_allclose(logit(3, 10), logit(503, 510), rtol=1e-4, atol=1e-4)
    assert not np.allclose(logit(3, 10), logit(3, 11))
    assert enc.relative and enc.cacheable and enc.key_lookback == 0


def test_a_run_fills_train_len_from_train_seq_len():
    from posenc.models.build import make_encoding
    from posenc.runs.config import load_config

    config = load_config("configs/base.py:tiny")
    config.encoding.name = "hope"
    assert make_encoding(config).train_len == config.train.seq_len
    with config.encoding.hparams.unlocked():
        config.encoding.hparams.train_len = 7
    assert make_encoding(config).train_len == 7
    config.encoding.name = "rope"  # an encoder without the field gets nothing
    with config.encoding.hparams.unlocked():
        del config.encoding.hparams["train_len"]
    assert "train_len" not in make_encoding(config).hparams()


@pytest.mark.parametrize(
    "hparams,message",
    [
        ({"train_len": 0}, "train_len must be a positive integer"),
        ({"train_len": 12.5}, "train_len must be a positive integer"),
        ({"min_turns": 0}, "min_turns must be a number > 0"),
        ({"layout": "spiral"}, "layout must be one of"),
        ({"base": -1.0}, "base must be a number > 0"),
    ],
)
def test_bad_hyperparameters_are_refused_in_one_line(hparams, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get("hope", **hparams)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "hparams,dims,message",
    [
        ({}, Dims(2, 15, 30), "odd"),
        ({"train_len": 64, "min_turns": 20.0}, Dims(2, 16, 32), "rotates no pair"),
    ],
)
def test_shapes_it_cannot_take_are_refused_in_one_line(hparams, dims, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get("hope", **hparams).bind(dims)
    assert "\n" not in str(error.value)
