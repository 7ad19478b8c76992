"""DeBERTa's disentangled attention against an explicit float64 transcription of He et al. 2021,
eq. (2)-(4): A_ij = Q^c_i K^c_j + Q^c_i K^r_delta(i,j) + K^c_j Q^r_delta(j,i), softmax(A /
sqrt(3d)), delta(i, j) = clip(i - j + k, 0, 2k - 1); and DeBERTa-v2's log buckets. On every path
(the fused ``xla`` one too) at a few tokens and at 16 times the training length."""

from __future__ import annotations

import functools
import math

import _long_window as lw
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import attend
from posenc.encodings import Dims
from posenc.encodings.deberta import relative_index

H, DH, D = 2, 4, 8
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
_attend = _jit(attend, static_argnames=("encoding", "causal", "implementation", "block_size"))


def _v2_bucket(r: int, bucket_size: int, max_position: int) -> int:
    """DeBERTa-v2's make_log_bucket_position for one distance, in float64 (with the released
    code's clamp to [-(max_position - 1), max_position - 1] first)."""
    r = min(max(r, -(max_position - 1)), max_position - 1)
    mid = bucket_size // 2
    if abs(r) <= mid:
        return r
    log_pos = math.ceil(math.log(abs(r) / mid) / math.log((max_position - 1) / mid) * (mid - 1))
    return int(np.sign(r)) * (log_pos + mid)


def _delta(i: int, j: int, k: int, buckets: int | None) -> int:
    """Eq. (3): delta(i, j) = 0 if i - j <= -k, 2k - 1 if i - j >= k, i - j + k otherwise (with
    v2's buckets: of bucket(i - j), over 2 * buckets rows)."""
    if buckets is None:
        rel, span = i - j, k
    else:
        rel, span = _v2_bucket(i - j, buckets, k), buckets
    if rel <= -span:
        return 0
    if rel >= span:
        return 2 * span - 1
    return rel + span


def _naive(q, k, v, params, q_pos, k_pos, max_distance, buckets, causal):
    """Eq. (2)-(4) per head with explicit loops, float64; q, k, v: [B, T|S, H, Dh]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    p = np.asarray(params["p"], np.float64)
    q_r = np.einsum("rm,mhd->rhd", p, np.asarray(params["w_qr"], np.float64))
    k_r = np.einsum("rm,mhd->rhd", p, np.asarray(params["w_kr"], np.float64))
    b, t, h, d = q.shape
    s = k.shape[1]
    out = np.zeros((b, t, h, d))
    for bb in range(b):
        for hh in range(h):
            a = np.zeros((t, s))
            for i in range(t):
                for j in range(s):
                    pi, pj = int(q_pos[bb, i]), int(k_pos[bb, j])
                    a[i, j] = (
                        q[bb, i, hh] @ k[bb, j, hh]
                        + q[bb, i, hh] @ k_r[_delta(pi, pj, max_distance, buckets), hh]
                        + k[bb, j, hh] @ q_r[_delta(pj, pi, max_distance, buckets), hh]
                    )
                    if causal and j > i + (s - t):
                        a[i, j] = -np.inf
            a = a / math.sqrt(3 * d)
            probs = np.exp(a - a.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[bb, :, hh] = probs @ v[bb, :, hh]
    return out


def test_log_buckets_match_deberta_v2_formula_at_every_distance():
    q_pos = jnp.zeros((1, 1), jnp.int32)
    k_pos = jnp.arange(-700, 700, dtype=jnp.int32)[None]
    got = np.asarray(relative_index(q_pos, k_pos, 512, 256))[0, 0]
    expected = [_delta(0, int(j), 512, 256) for j in np.asarray(k_pos[0])]
    np.testing.assert_array_equal(got, expected)
    assert len(set(got.tolist())) > 300  # log buckets beyond 128, clipping far out


@pytest.mark.parametrize("buckets", [None, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("implementation", ["einsum", "blocked", "xla"])
def test_attention_matches_the_papers_equations(buckets, causal, implementation):
    enc = encodings.get("deberta", max_distance=6, buckets=buckets)
    enc = enc.bind(Dims(num_heads=H, head_dim=DH, model_dim=D))
    params = enc.init(jax.random.key(0), enc.bound_dims)
    params = {n: 10.0 * x if n == "p" else x for n, x in params.items()}  # visible terms
    rng = np.random.default_rng(0)
    b, t, s = 2, 9, 11
    q, k, v = (rng.standard_normal((b, n, H, DH)).astype(np.float32) for n in (t, s, s))
    # Row 0 contiguous from 5; row 1 sorted with gaps wider than k (clipping, buckets).
    k_pos = np.stack([5 + np.arange(s), np.sort(rng.choice(60, s, replace=False))]).astype(np.int32)
    q_pos = k_pos[:, s - t :]
    got = _attend(
        q, k, v, encoding=enc, params=params, q_pos=q_pos, k_pos=k_pos, causal=causal,
        implementation=implementation, block_size=4,
    )  # fmt: skip
    expected = _naive(q, k, v, params, q_pos, k_pos, 6, buckets, causal)
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=2e-5, atol=2e-5)


@functools.lru_cache
def _long_case(max_distance: int, buckets: int | None):
    enc = encodings.get("deberta", max_distance=max_distance, buckets=buckets)
    enc = enc.bind(Dims(num_heads=H, head_dim=DH, model_dim=D))
    params = enc.init(jax.random.key(2), enc.bound_dims)
    params = {n: 10.0 * x if n == "p" else x for n, x in params.items()}  # visible terms
    q, k, v, q_pos, k_pos = lw.inputs(H, DH, seed=3)
    expected = _naive(q, k, v, params, q_pos, k_pos, max_distance, buckets, causal=True)
    return enc, params, (q, k, v, q_pos, k_pos), expected


# v1 clipping at 16 (beyond the training length, inside the long window); v2's log buckets
# from 4 to 64, then clipping: both regimes within the 131 keys.
@pytest.mark.parametrize("implementation", ["einsum", "blocked", "xla", "auto"])
@pytest.mark.parametrize("max_distance,buckets", [(16, None), (64, 8)])
def test_attention_matches_the_papers_equations_at_16x_the_training_length(
    max_distance, buckets, implementation
):
    enc, params, (q, k, v, q_pos, k_pos), expected = _long_case(max_distance, buckets)
    got = _attend(
        q, k, v, encoding=enc, params=params, q_pos=q_pos, k_pos=k_pos,
        implementation=implementation, block_size=lw.PATHS[implementation],
    )  # fmt: skip
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=2e-5, atol=2e-5)


def test_p2c_reads_the_query_position_from_the_key_and_both_terms_matter():
    """Swapping delta(j, i) for delta(i, j) in p2c (or dropping a term) changes the output."""
    enc = encodings.get("deberta", max_distance=3).bind(Dims(H, DH, D))
    params = enc.init(jax.random.key(1), enc.bound_dims)
    params = {n: 10.0 * x if n == "p" else x for n, x in params.items()}
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 5, H, DH)).astype(np.float32)
    pos = np.arange(5)[None]
    rq, rk = enc.rotate(params, jnp.asarray(q), jnp.asarray(q), pos, pos)
    got = np.asarray(enc.content_logits(params, rq, rk, pos, pos), np.float64)
    # Row-index swap: p2c with delta(i, j) instead of delta(j, i) differs.
    p = np.asarray(params["p"], np.float64)
    k_r = np.einsum("rm,mhd->rhd", p, np.asarray(params["w_kr"], np.float64))
    q_r = np.einsum("rm,mhd->rhd", p, np.asarray(params["w_qr"], np.float64))
    qq = q.astype(np.float64)
    c2p = np.array([[[qq[0, i, h] @ k_r[_delta(i, j, 3, None), h] for j in range(5)]
                     for i in range(5)] for h in range(H)]) / math.sqrt(3)  # fmt: skip
    p2c = np.array([[[qq[0, j, h] @ q_r[_delta(j, i, 3, None), h] for j in range(5)]
                     for i in range(5)] for h in range(H)]) / math.sqrt(3)  # fmt: skip
    swapped = np.array([[[qq[0, j, h] @ q_r[_delta(i, j, 3, None), h] for j in range(5)]
                         for i in range(5)] for h in range(H)]) / math.sqrt(3)  # fmt: skip
    np.testing.assert_allclose(got[0], c2p + p2c, rtol=1e-5, atol=1e-5)
    assert np.abs(got[0] - (c2p + swapped)).max() > 1e-2
    assert np.abs(c2p).max() > 1e-2 and np.abs(p2c).max() > 1e-2


@pytest.mark.parametrize(
    "hparams",
    [
        {"max_distance": 0},
        {"max_distance": 2.5},
        {"buckets": 2},
        {"max_distance": 8, "buckets": 16},
    ],
)
def test_bad_hyperparameters_name_the_field(hparams):
    with pytest.raises(ValueError, match=r"encoding\.hparams\.(max_distance|buckets)"):
        encodings.get("deberta", **hparams)
