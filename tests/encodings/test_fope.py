"""FoPE (Hua et al. 2024) against a float64 transcription of its formula: each unclipped pair a
Fourier series over the head's unclipped frequencies (separate cosine and sine coefficients per
head), frequencies below ``2 pi / L`` clipped to 0; on every attention path at 1x and 16x the
tile and through a cache's call; with identity coefficients it is RoPE with the clipped
frequencies (p-RoPE, and HoPE at the same training length)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _rotary_paths import CASES, DH, H, cached_last_query, inputs, naive, run

from posenc import encodings
from posenc.encodings import Dims, apply_rope

L = 64  # with Dh = 16: pairs 0, 1, 2 keep their frequency (>= 2 pi / 64), 3 .. 7 are clipped
D = 3


def fope(x, positions, cos_coef, sin_coef, train_len=L, base=1e4):
    """Float64, from the paper: ``omega_d = base^(-2d/Dh)``, 0 below ``2 pi / L``; for an
    unclipped pair ``d`` (channels ``d`` and ``d + Dh/2``) ``C = sum_j A[h, j, d] cos(m
    omega_j)``, ``S = sum_j B[h, j, d] sin(m omega_j)`` over the unclipped ``j``, and
    ``(a, b) -> (a C - b S, a S + b C)``; clipped pairs unchanged."""
    x = np.asarray(x, np.float64)
    dh = x.shape[-1]
    omega = [base ** (-2.0 * d / dh) for d in range(dh // 2)]
    kept = [d for d in range(dh // 2) if omega[d] >= 2 * math.pi / train_len]
    m = np.asarray(positions, np.float64)  # [B, T]
    out = x.copy()
    for h in range(x.shape[2]):
        for d in kept:
            c = sum(cos_coef[h, j, d] * np.cos(m * omega[j]) for j in kept)  # [B, T]
            s = sum(sin_coef[h, j, d] * np.sin(m * omega[j]) for j in kept)
            a, b = x[:, :, h, d], x[:, :, h, d + dh // 2]
            out[:, :, h, d] = a * c - b * s
            out[:, :, h, d + dh // 2] = a * s + b * c
    return out


def _setup(seed=0, **hparams):
    enc = encodings.get("fope", **{"train_len": L, **hparams}).bind(Dims(H, DH, H * DH))
    params = enc.init(jax.random.key(seed), enc.dims)
    return enc, params, {n: np.asarray(p, np.float64) for n, p in params.items()}


def test_init_is_the_identity_plus_noise_per_head():
    enc, params, p = _setup(init_std=0.3)
    assert enc.param_shapes(enc.dims) == {"cos_coef": (H, D, D), "sin_coef": (H, D, D)}
    for name in ("cos_coef", "sin_coef"):
        noise = p[name] - np.eye(D)
        assert 0.05 < noise.std() < 1.0 and not np.allclose(noise[0], noise[1])
    assert not np.allclose(p["cos_coef"], p["sin_coef"])


def test_rotate_is_the_papers_formula():
    enc, params, p = _setup(init_std=0.3)
    q, k, _, q_pos, k_pos = inputs(6)
    qr, kr = enc.rotate(params, *map(jnp.asarray, (q, k, q_pos, k_pos)))
    np.testing.assert_allclose(qr, fope(q, q_pos, p["cos_coef"], p["sin_coef"]), atol=1e-4)
    np.testing.assert_allclose(kr, fope(k, k_pos, p["cos_coef"], p["sin_coef"]), atol=1e-4)
    clipped = np.r_[np.arange(D, DH // 2), np.arange(D, DH // 2) + DH // 2]
    np.testing.assert_array_equal(np.asarray(kr)[..., clipped], k[..., clipped])


@pytest.mark.parametrize("t,causal,path,block", CASES)
def test_every_path_matches_the_transcription(t, causal, path, block):
    enc, params, p = _setup(seed=t, init_std=0.3)
    q, k, v, q_pos, k_pos = inputs(t, seed=t)
    coef = (p["cos_coef"], p["sin_coef"])
    want = naive(fope(q, q_pos, *coef), fope(k, k_pos, *coef), v, causal)
    got = run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=5e-5)


@pytest.mark.parametrize("t", [4, 64])
def test_a_caches_single_query_matches_the_transcription(t):
    enc, params, p = _setup(seed=1, init_std=0.3)
    q, k, v, q_pos, k_pos = inputs(t, seed=4)
    coef = (p["cos_coef"], p["sin_coef"])
    want = naive(fope(q, q_pos, *coef), fope(k, k_pos, *coef), v)[:, -1:]
    got = cached_last_query(enc, params, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, want, atol=5e-5)


@pytest.mark.parametrize("train_len", [8, 64, 1000])
def test_identity_coefficients_are_rope_with_the_clipped_frequencies(train_len):
    """``A = B = I``: pair ``d`` turns by ``m omega_d`` or, clipped, not at all, which is p-RoPE
    keeping the fast pairs, and HoPE at the same training length."""
    enc, params, _ = _setup(train_len=train_len)
    identity = {n: jnp.broadcast_to(jnp.eye(x.shape[-1]), x.shape) for n, x in params.items()}
    x = jax.random.normal(jax.random.key(5), (2, 9, H, DH))
    positions = jnp.stack([jnp.arange(9), jnp.arange(9) * 11 + 70])
    got, _ = enc.rotate(identity, x, x, positions, positions)
    kept = params["cos_coef"].shape[-1]
    p_rope = apply_rope(x, positions, rotated_frequencies=2 * kept / DH)
    np.testing.assert_allclose(got, p_rope, rtol=1e-5, atol=1e-5)
    hope = encodings.get("hope", train_len=train_len).bind(enc.dims)
    np.testing.assert_allclose(got, hope.rotate({}, x, x, positions, positions)[0], atol=1e-5)


def test_not_relative_unless_the_coefficients_are_the_identity():
    enc, params, _ = _setup(init_std=0.3)
    q = jax.random.normal(jax.random.key(2), (1, 1, H, DH))
    k = jax.random.normal(jax.random.key(3), (1, 1, H, DH))

    def logit(p, m, n):
        qr, kr = enc.rotate(p, q, k, jnp.array([[m]]), jnp.array([[n]]))
        return np.asarray(jnp.einsum("bthd,bshd->bh", qr, kr))

    assert not np.allclose(logit(params, 3, 10), logit(params, 40, 47), atol=1e-3)
    identity = {n: jnp.broadcast_to(jnp.eye(D), x.shape) for n, x in params.items()}
    np.testing.assert_allclose(logit(identity, 3, 10), logit(identity, 40, 47), atol=1e-4)
    assert not enc.relative


@pytest.mark.parametrize("learnable", [True, False])
def test_gradients_reach_the_coefficients_when_learnable(learnable):
    enc, params, _ = _setup(init_std=0.3, learnable=learnable)
    x = jax.random.normal(jax.random.key(6), (1, 5, H, DH))
    pos = jnp.arange(5)[None]

    def loss(p):
        qr, kr = enc.rotate(p, x, x, pos, pos)
        return jnp.einsum("bthd,bshd->", qr, kr)

    grads = jax.grad(loss)(params)
    assert all(bool(jnp.any(g != 0)) == learnable for g in grads.values())


@pytest.mark.parametrize(
    "hparams,message",
    [
        ({"train_len": -3}, "train_len must be a positive integer"),
        ({"init_std": -0.1}, "init_std must be a number >= 0"),
        ({"learnable": 1}, r"learnable must be one of \[False, True\]"),
    ],
)
def test_bad_hyperparameters_are_refused_in_one_line(hparams, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get("fope", **hparams)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "hparams,dims,message",
    [
        ({}, Dims(2, 15, 30), "odd"),
        ({"train_len": 5}, Dims(2, 16, 32), "clips every frequency"),
    ],
)
def test_shapes_it_cannot_take_are_refused_in_one_line(hparams, dims, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get("fope", **hparams).bind(dims)
    assert "\n" not in str(error.value)
