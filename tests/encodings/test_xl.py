"""Transformer-XL relative attention (Dai et al. 2019, Sec. 3.3) against its four terms built for
every (query, key) pair:

    A_ij = q_i . k_j + q_i . W_kR R_{i-j} + u . k_j + v . W_kR R_{i-j}

with R the sinusoids of Vaswani et al. (R[2m] = sin(d / base^(2m/D)), R[2m+1] = cos(...)) at the
distance d = i - j, clamped to [-clamp_len, clamp_len] when set (XLNet's clamp for keys after the
query, which a bidirectional model sees; a causal one sees only d >= 0, the original clamp). On
every path at a few tokens and at 16 times the training length."""

from __future__ import annotations

import functools

import _long_window as lw
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import attend
from posenc.encodings import Dims

H, DH, D = 2, 8, 16

# One compiled program per (encoder, path, shapes); compiling dominates at these sizes, and LLVM
# at -O0 compiles about twice as fast while computing the same program.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
_attend = _jit(attend, static_argnames=("encoding", "causal", "implementation", "block_size"))


def _bound(**hparams):
    return encodings.get("xl", **hparams).bind(Dims(num_heads=H, head_dim=DH, model_dim=D))


def _sinusoid(distance: float, dim: int, base: float) -> np.ndarray:
    out = np.zeros(dim)
    for m in range(dim // 2):
        out[2 * m] = np.sin(distance / base ** (2 * m / dim))
        out[2 * m + 1] = np.cos(distance / base ** (2 * m / dim))
    return out


def _naive_terms(params, q, k, q_pos, k_pos, clamp_len, base=10000.0):
    """Terms (b) + (c) + (d) for every pair, float64, [B, H, T, S]."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    u, v, w_r = (np.asarray(params[n], np.float64) for n in ("u", "v", "w_r"))
    b, t, s = q.shape[0], q.shape[1], k.shape[1]
    out = np.zeros((b, H, t, s))
    for bb in range(b):
        for i in range(t):
            for j in range(s):
                dist = int(q_pos[bb, i]) - int(k_pos[bb, j])
                if clamp_len is not None:
                    dist = max(-clamp_len, min(dist, clamp_len))
                rel_key = np.einsum("m,mhd->hd", _sinusoid(dist, D, base), w_r)  # W_kR R_{i-j}
                for h in range(H):
                    out[bb, h, i, j] = (
                        q[bb, i, h] @ rel_key[h]  # (b)
                        + u[h] @ k[bb, j, h]  # (c)
                        + v[h] @ rel_key[h]  # (d)
                    )
    return out


def _naive_attention(params, q, k, v, q_pos, k_pos, clamp_len, causal=True):
    logits = np.einsum("bthd,bshd->bhts", np.float64(q), np.float64(k))  # (a)
    logits = logits + _naive_terms(params, q, k, q_pos, k_pos, clamp_len)
    logits /= np.sqrt(DH)
    t, s = q.shape[1], k.shape[1]
    if causal:
        mask = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(mask, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, np.float64(v))


def _setup(seed, t, s, offsets, clamp_len):
    enc = _bound(clamp_len=clamp_len)
    p = enc.init(jax.random.key(seed), enc.bound_dims)
    # u and v at unit scale (init is 0.02) so terms (c) and (d) are visible in the comparison.
    params = {n: np.asarray(x) * (50.0 if n in ("u", "v") else 1.0) for n, x in p.items()}
    r = np.random.default_rng(seed)
    q = r.standard_normal((len(offsets), t, H, DH)).astype(np.float32)
    k = r.standard_normal((len(offsets), s, H, DH)).astype(np.float32)
    v = r.standard_normal((len(offsets), s, H, DH)).astype(np.float32)
    k_pos = np.stack([o + np.arange(s) for o in offsets])
    return enc, params, q, k, v, k_pos[:, s - t :], k_pos


def _j(params):
    return {n: jnp.asarray(x) for n, x in params.items()}


def _run(enc, params, q, k, v, q_pos, k_pos, impl, block, causal=True) -> np.ndarray:
    """``attend`` on path ``impl`` with numpy inputs and parameters."""
    out = _attend(
        *(jnp.asarray(a) for a in (q, k, v)),
        encoding=enc,
        params=_j(params),
        q_pos=jnp.asarray(q_pos),
        k_pos=jnp.asarray(k_pos),
        causal=causal,
        implementation=impl,
        block_size=block,
    )
    return np.asarray(out)


def test_parameters_are_u_v_and_w_r():
    enc = _bound()
    params = enc.init(jax.random.key(0), enc.bound_dims)
    assert {n: x.shape for n, x in params.items()} == {
        "u": (H, DH),
        "v": (H, DH),
        "w_r": (D, H, DH),
    }
    assert enc.param_scope == "layer"


@pytest.mark.parametrize(
    "clamp_len,t,s,offsets",
    [
        (None, 6, 6, [0, 0]),
        (None, 6, 6, [9, 40]),  # per-batch-row offsets
        (None, 3, 7, [5, 0]),  # queries are the last T of S keys
        (3, 6, 6, [1000, 3]),
        (0, 3, 7, [2, 8]),
    ],
)
def test_content_logits_equal_terms_b_c_d(clamp_len, t, s, offsets):
    enc, params, q, k, _, q_pos, k_pos = _setup(1, t, s, offsets, clamp_len)
    got = _jit(enc.content_logits)(
        _j(params), jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos), jnp.asarray(k_pos)
    )
    expected = _naive_terms(params, q, k, q_pos, k_pos, clamp_len)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_clamp_len_changes_only_distances_beyond_it():
    enc, params, q, k, _, q_pos, k_pos = _setup(2, 8, 8, [0], None)
    args = (_j(params), jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos), jnp.asarray(k_pos))
    free = np.asarray(enc.content_logits(*args))
    clamped = np.asarray(_bound(clamp_len=3).content_logits(*args))
    dist = np.abs(q_pos[0][:, None] - k_pos[0][None, :])  # |i - j|, [T, S], keys on both sides
    np.testing.assert_allclose(clamped[..., dist <= 3], free[..., dist <= 3], rtol=1e-5, atol=1e-5)
    assert np.abs(clamped[..., dist > 3] - free[..., dist > 3]).min() > 1e-4
    # Beyond the clamp every distance sees R_3: columns at distance 4 and 5 differ only by (c).
    i = 7
    c_term = np.einsum("hd,shd->hs", params["u"], k[0])
    row = clamped[0, :, i] - c_term  # (b) + (d), [H, S]
    np.testing.assert_allclose(row[:, i - 4], row[:, i - 5], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "clamp_len,impl,block",
    [(None, "einsum", 512), (2, "einsum", 512), (2, "blocked", 3), (None, "xla", 512)],
)
@pytest.mark.parametrize("t,s,offsets", [(7, 7, [0, 0]), (7, 7, [11, 2]), (4, 9, [3, 70])])
def test_attention_equals_four_term_formula(clamp_len, impl, block, t, s, offsets):
    enc, params, q, k, v, q_pos, k_pos = _setup(3, t, s, offsets, clamp_len)
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, block)
    expected = _naive_attention(params, q, k, v, q_pos, k_pos, clamp_len)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "clamp_len,impl,block",
    [(None, "einsum", 512), (2, "einsum", 512), (2, "blocked", 3), (None, "xla", 512)],
)
def test_bidirectional_attention_equals_four_term_formula(clamp_len, impl, block):
    # Without the mask every query also sees the keys after it (negative i - j, clamped to
    # -clamp_len); 4 queries, the last of 9 keys, so both sides are long.
    enc, params, q, k, v, q_pos, k_pos = _setup(8, 4, 9, [3, 70], clamp_len)
    q_pos = k_pos[:, 2:6]  # queries in the middle of the keys
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, block, causal=False)
    expected = _naive_attention(params, q, k, v, q_pos, k_pos, clamp_len, causal=False)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [-1, 2.5])
def test_bad_clamp_len_is_rejected(bad):
    with pytest.raises(ValueError, match="clamp_len"):
        encodings.get("xl", clamp_len=bad)


def test_odd_model_dim_is_rejected():
    with pytest.raises(ValueError, match="model_dim"):
        encodings.get("xl").bind(Dims(num_heads=1, head_dim=8, model_dim=15))


def _random_positions(seed, b, t, s, max_position, sort=True):
    """Randomized positions (Ruoss et al. 2023): a random subset of [0, max_position) per row,
    sorted; the queries are the last T of the S keys. ``sort=False``: any order."""
    r = np.random.default_rng(seed)
    k_pos = np.stack([r.choice(max_position, s, replace=False) for _ in range(b)])
    k_pos = np.sort(k_pos, axis=1) if sort else k_pos
    return k_pos[:, s - t :], k_pos


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("clamp_len", [None, 5, 0])
@pytest.mark.parametrize("t,s,max_position", [(7, 7, 40), (4, 9, 2048)])
def test_non_contiguous_positions_equal_terms_b_c_d(sort, clamp_len, t, s, max_position):
    """The separable path: sin/cos of i and j apart, any gaps, any order, with clamping."""
    enc, params, q, k, _, _, _ = _setup(4, t, s, [0, 0], clamp_len)
    q_pos, k_pos = _random_positions(5, 2, t, s, max_position, sort)
    if clamp_len and max_position < 100:  # dense enough for pairs on both sides of the clamp
        distance = q_pos[:, :, None] - k_pos[:, None, :]
        assert (distance > clamp_len).any() and ((distance <= clamp_len) & (distance > 0)).any()
    got = _jit(enc.content_logits)(
        _j(params), jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos), jnp.asarray(k_pos)
    )
    expected = _naive_terms(params, q, k, q_pos, k_pos, clamp_len)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("impl,block", [("einsum", 512), ("blocked", 3), ("xla", 512)])
@pytest.mark.parametrize("shared", [False, True])
def test_attention_with_randomized_positions_equals_four_term_formula(impl, block, shared):
    enc, params, q, k, v, _, _ = _setup(6, 8, 8, [0, 0], None)
    q_pos, k_pos = _random_positions(7, 1 if shared else 2, 8, 8, 64)
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, block)
    b_pos = (np.repeat(q_pos, 2, 0), np.repeat(k_pos, 2, 0)) if shared else (q_pos, k_pos)
    expected = _naive_attention(params, q, k, v, *b_pos, None)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


# -- 16 times the training length ----------------------------------------------------------


@functools.lru_cache
def _long_case(clamp_len: int | None):
    """Sinusoids at distances up to 130 unclamped, or clamped at the training length (8)."""
    enc, params, *_ = _setup(12, 1, 1, [0], clamp_len)
    q, k, v, q_pos, k_pos = lw.inputs(H, DH, seed=13)
    expected = _naive_attention(params, q, k, v, q_pos, k_pos, clamp_len)
    return enc, params, (q, k, v, q_pos, k_pos), expected


@pytest.mark.parametrize("impl", ["einsum", "blocked", "xla", "auto"])
@pytest.mark.parametrize("clamp_len", [None, lw.TRAIN_LENGTH])
def test_attention_equals_four_term_formula_at_16x_the_training_length(clamp_len, impl):
    enc, params, (q, k, v, q_pos, k_pos), expected = _long_case(clamp_len)
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, lw.PATHS[impl])
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("t,s", [(96, 100), (128, 128)])  # sub-blocks of 48 and 64 queries
def test_relative_table_in_query_sub_blocks_equals_the_separable_path(t, s):
    """Past 64 queries the relative table is scored in sub-blocks (each against the distances
    its rows use); terms and gradients equal the separable path's, which is tested against the
    four-term formula above, at per-row offsets."""
    enc, params, q, _, _, q_pos, k_pos = _setup(3, t, s, [4, 900], None)
    weight = jnp.asarray(np.random.default_rng(4).standard_normal((2, H, t, s)), jnp.float32)

    def loss(path):
        def f(w_r, query):
            return jnp.sum(path(w_r, query, jnp.asarray(q_pos), jnp.asarray(k_pos)) * weight)

        return _jit(jax.value_and_grad(f, argnums=(0, 1)))

    args = (jnp.asarray(params["w_r"]), jnp.asarray(q))
    got, expected = loss(enc._positions_by_offset)(*args), loss(enc._positions_by_pair)(*args)
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        # Float32 sums over 65k pairs, the separable path's at positions near 1000: relative
        # to the largest entry.
        scale = float(np.abs(e).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-4, atol=2e-5 * scale)
