"""Shaw et al. (2018) relative position representations against the paper's explicit L x L x D
formulas (Eqs. 3-4): a_ij = table[clip(j - i, -k, k) + k],
e_ij = q_i . (k_j + a^K_ij) / sqrt(d), z_i = sum_j alpha_ij (v_j + a^V_ij); on every path at a
few tokens and at 16 times the training length."""

from __future__ import annotations

import functools

import _long_window as lw
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import attend
from posenc.encodings import Dims, clipped_relative_index

H, DH, D = 2, 8, 16

# One compiled program per (encoder, path, shapes); compiling dominates at these sizes, and LLVM
# at -O0 compiles about twice as fast while computing the same program.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
_attend = _jit(attend, static_argnames=("encoding", "causal", "implementation", "block_size"))


def _bound(**hparams):
    return encodings.get("shaw", **hparams).bind(Dims(num_heads=H, head_dim=DH, model_dim=D))


def _run(enc, params, q, k, v, q_pos, k_pos, impl, block=512, causal=True) -> np.ndarray:
    """``attend`` on path ``impl`` with numpy inputs and parameters."""
    out = _attend(
        *(jnp.asarray(a) for a in (q, k, v)),
        encoding=enc,
        params={n: jnp.asarray(x) for n, x in params.items()},
        q_pos=jnp.asarray(q_pos),
        k_pos=jnp.asarray(k_pos),
        causal=causal,
        implementation=impl,
        block_size=block,
    )
    return np.asarray(out)


def _naive_a(table: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray, k: int) -> np.ndarray:
    """The explicit [B, T, S, Dh] tensor a_ij = table[clip(j - i, -k, k) + k]."""
    b, t, s = q_pos.shape[0], q_pos.shape[1], k_pos.shape[1]
    out = np.zeros((b, t, s, table.shape[1]), np.float64)
    for bb in range(b):
        for i in range(t):
            for j in range(s):
                rel = int(k_pos[bb, j]) - int(q_pos[bb, i])
                out[bb, i, j] = table[min(max(rel, -k), k) + k]
    return out


def _naive_attention(q, k, v, key_table, value_table, q_pos, k_pos, clip, causal=True):
    """Shaw attention with the L x L x D tensors built explicitly, causal, float64."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    t, s = q.shape[1], k.shape[1]
    logits = np.einsum("bthd,bshd->bhts", q, k)
    if key_table is not None:
        a_k = _naive_a(key_table, q_pos, k_pos, clip)  # [B, T, S, Dh]
        logits = logits + np.einsum("bthd,btsd->bhts", q, a_k)
    logits /= np.sqrt(q.shape[-1])
    if causal:
        mask = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(mask, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshd->bthd", p, v)
    if value_table is not None:
        a_v = _naive_a(value_table, q_pos, k_pos, clip)
        out += np.einsum("bhts,btsd->bthd", p, a_v)
    return out


def _positions(b, t, s, offsets):
    """Contiguous rows: keys k0 + arange(S), queries the last T of them."""
    k_pos = np.stack([o + np.arange(s) for o in offsets])
    return k_pos[:, s - t :], k_pos


def _inputs(seed, b, t, s):
    r = np.random.default_rng(seed)
    q = r.standard_normal((b, t, H, DH)).astype(np.float32)
    k = r.standard_normal((b, s, H, DH)).astype(np.float32)
    v = r.standard_normal((b, s, H, DH)).astype(np.float32)
    return q, k, v


def _params(enc, seed, scale=1.0):
    # Larger-than-init tables so the relative terms are not negligible next to q . k.
    p = enc.init(jax.random.key(seed), enc.bound_dims)
    return {name: scale * np.asarray(x) / enc.init_std for name, x in p.items()}


def test_clipped_relative_index_formula():
    q_pos = np.array([[0, 1, 2, 3, 4, 5]]) + 100
    k_pos = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8]]) + 97
    got = np.asarray(clipped_relative_index(jnp.asarray(q_pos), jnp.asarray(k_pos), 2))
    for i in range(6):
        for j in range(9):
            rel = k_pos[0, j] - q_pos[0, i]
            assert got[0, i, j] == min(max(rel, -2), 2) + 2
    assert got.min() == 0 and got.max() == 4


def test_tables_are_shared_across_heads():
    enc = _bound(max_distance=3)
    params = enc.init(jax.random.key(0), enc.bound_dims)
    assert set(params) == {"key_table", "value_table"}
    assert params["key_table"].shape == (2 * 3 + 1, DH)
    assert params["value_table"].shape == (2 * 3 + 1, DH)
    keys_only = _bound(max_distance=3, values=False)
    assert set(keys_only.init(jax.random.key(0), keys_only.bound_dims)) == {"key_table"}
    assert "value_term" not in keys_only.hooks and "value_term" in enc.hooks


@pytest.mark.parametrize(
    "t,s,offsets,clip",
    [
        (7, 7, [0, 0], 3),  # default positions
        (7, 7, [13, 200], 2),  # non-zero, per-batch-row offsets
        (4, 9, [5, 31], 3),  # queries are the last T of S keys
        (9, 9, [3, 3], 0),  # k = 0: one relative vector for all pairs
        (6, 6, [1, 50], 20),  # k larger than any distance in the window
    ],
)
def test_content_logits_equal_q_dot_a_k(t, s, offsets, clip):
    enc = _bound(max_distance=clip)
    params = _params(enc, 1)
    q, k, _ = _inputs(2, len(offsets), t, s)
    q_pos, k_pos = _positions(len(offsets), t, s, offsets)
    got = _jit(enc.content_logits)(
        {n: jnp.asarray(x) for n, x in params.items()},
        jnp.asarray(q),
        jnp.asarray(k),
        jnp.asarray(q_pos),
        jnp.asarray(k_pos),
    )
    a_k = _naive_a(params["key_table"], q_pos, k_pos, clip)
    expected = np.einsum("bthd,btsd->bhts", q.astype(np.float64), a_k)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("t,s,offsets,clip", [(6, 6, [0, 0], 2), (5, 8, [7, 40], 3)])
def test_value_term_equals_sum_p_a_v(t, s, offsets, clip):
    enc = _bound(max_distance=clip)
    params = _params(enc, 3)
    b = len(offsets)
    probs = np.random.default_rng(4).random((b, H, t, s)).astype(np.float32)  # any weights
    q_pos, k_pos = _positions(b, t, s, offsets)
    got = _jit(enc.value_term)(
        {n: jnp.asarray(x) for n, x in params.items()},
        jnp.asarray(probs),
        jnp.asarray(q_pos),
        jnp.asarray(k_pos),
    )
    a_v = _naive_a(params["value_table"], q_pos, k_pos, clip)
    expected = np.einsum("bhts,btsd->bthd", probs.astype(np.float64), a_v)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "values,impl,block",
    [
        (True, "einsum", 512),
        (True, "blocked", 3),  # 3 divides neither T = 8 nor T = 5
        (True, "blocked", 4),  # 4 divides T = 8
        (False, "einsum", 512),
    ],
)
@pytest.mark.parametrize("t,s,offsets", [(8, 8, [0, 0]), (8, 8, [17, 3]), (5, 11, [2, 60])])
def test_attention_equals_explicit_formula(values, impl, block, t, s, offsets):
    clip = 3
    enc = _bound(max_distance=clip, values=values)
    params = _params(enc, 5, scale=0.5)
    q, k, v = _inputs(6, len(offsets), t, s)
    q_pos, k_pos = _positions(len(offsets), t, s, offsets)
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, block)
    expected = _naive_attention(
        q, k, v, params["key_table"], params.get("value_table"), q_pos, k_pos, clip
    )
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keys,values", [(False, True), (False, False)])
def test_values_only_and_neither_equal_the_explicit_formula(keys, values):
    """Shaw et al.'s Table 3 ablations: the value term alone, and no relative term at all (plain
    attention: no position information)."""
    enc = _bound(max_distance=3, keys=keys, values=values)
    params = _params(enc, 5, scale=0.5)
    assert set(params) == ({"value_table"} if values else set())
    q, k, v = _inputs(6, 2, 8, 8)
    q_pos, k_pos = _positions(2, 8, 8, [0, 5])
    for impl in ("einsum", "blocked"):
        got = _run(enc, params, q, k, v, q_pos, k_pos, impl, 3)
        expected = _naive_attention(q, k, v, None, params.get("value_table"), q_pos, k_pos, 3)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl,block", [("einsum", 512), ("blocked", 2)])
def test_bidirectional_attention_equals_explicit_formula(impl, block):
    # The paper's setting is an encoder: keys after the query use the positive-offset rows.
    enc = _bound(max_distance=3)
    params = _params(enc, 10, scale=0.5)
    q, k, v = _inputs(11, 2, 5, 11)
    q_pos, k_pos = (
        np.array([[4, 5, 6, 7, 8], [63, 64, 65, 66, 67]]),
        _positions(2, 11, 11, [2, 60])[1],
    )
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, block, causal=False)
    expected = _naive_attention(
        q, k, v, params["key_table"], params["value_table"], q_pos, k_pos, 3, causal=False
    )
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_keys_only_shaw_runs_on_the_fused_xla_path():
    enc = _bound(max_distance=2, values=False)
    params = _params(enc, 8, scale=0.5)
    q, k, v = _inputs(9, 2, 6, 6)
    q_pos, k_pos = _positions(2, 6, 6, [4, 9])
    got = _run(enc, params, q, k, v, q_pos, k_pos, "xla")
    expected = _naive_attention(q, k, v, params["key_table"], None, q_pos, k_pos, 2)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bad", [-1, -16, 2.5, "4"])
def test_bad_clip_distance_is_rejected(bad):
    with pytest.raises(ValueError, match="max_distance"):
        encodings.get("shaw", max_distance=bad)
    with pytest.raises(ValueError, match="max_distance"):
        clipped_relative_index(jnp.arange(3), jnp.arange(3), bad)


def _random_positions(seed, b, t, s, max_position=2048, sort=True):
    """Randomized positions (Ruoss et al. 2023): a random subset of [0, max_position) per row,
    sorted; the queries are the last T of the S keys. ``sort=False``: any order."""
    r = np.random.default_rng(seed)
    k_pos = np.stack([r.choice(max_position, s, replace=False) for _ in range(b)])
    k_pos = np.sort(k_pos, axis=1) if sort else k_pos
    return k_pos[:, s - t :], k_pos


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("t,s,clip", [(7, 7, 3), (4, 9, 20), (6, 6, 0)])
def test_non_contiguous_positions_equal_the_explicit_formula(sort, t, s, clip):
    """The pairwise path: every pair clips its own distance, any gaps, any order."""
    enc = _bound(max_distance=clip)
    params = {n: jnp.asarray(x) for n, x in _params(enc, 7).items()}
    q, k, _ = _inputs(8, 2, t, s)
    q_pos, k_pos = _random_positions(9, 2, t, s, max_position=40, sort=sort)
    # Neighbouring random positions are often within the clip distance, and often beyond it.
    distance = np.abs(k_pos[:, None, :] - q_pos[:, :, None])
    assert clip == 0 or ((distance <= clip) & (distance > 0)).any()
    assert (distance > clip).any()
    logits = _jit(enc.content_logits)(params, q, k, jnp.asarray(q_pos), jnp.asarray(k_pos))
    a_k = _naive_a(np.asarray(params["key_table"]), q_pos, k_pos, clip)
    expected = np.einsum("bthd,btsd->bhts", q.astype(np.float64), a_k)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-4)

    probs = np.random.default_rng(10).random((2, H, t, s)).astype(np.float32)
    values = _jit(enc.value_term)(params, probs, jnp.asarray(q_pos), jnp.asarray(k_pos))
    a_v = _naive_a(np.asarray(params["value_table"]), q_pos, k_pos, clip)
    expected = np.einsum("bhts,btsd->bthd", probs.astype(np.float64), a_v)
    np.testing.assert_allclose(np.asarray(values), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("impl,block", [("einsum", 512), ("blocked", 3)])
@pytest.mark.parametrize("shared", [False, True])
def test_attention_with_randomized_positions_equals_the_explicit_formula(impl, block, shared):
    clip = 3
    enc = _bound(max_distance=clip)
    params = _params(enc, 11, scale=0.5)
    q, k, v = _inputs(12, 2, 8, 8)
    q_pos, k_pos = _random_positions(13, 1 if shared else 2, 8, 8, max_position=30)
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, block)
    b_pos = (np.repeat(q_pos, 2, 0), np.repeat(k_pos, 2, 0)) if shared else (q_pos, k_pos)
    expected = _naive_attention(q, k, v, params["key_table"], params["value_table"], *b_pos, clip)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


# -- 16 times the training length ----------------------------------------------------------


@functools.lru_cache
def _long_case(values: bool):
    """The default clip distance (16): the training window (8) never clips, the long one does."""
    enc = _bound(values=values)
    params = _params(enc, 14, scale=0.5)
    q, k, v, q_pos, k_pos = lw.inputs(H, DH, seed=15)
    expected = _naive_attention(
        q, k, v, params["key_table"], params.get("value_table"), q_pos, k_pos, enc.max_distance
    )
    return enc, params, (q, k, v, q_pos, k_pos), expected


# Every path that serves each variant: with values einsum and blocked (and auto, which tiles),
# keys only also the fused xla path.
@pytest.mark.parametrize(
    "values,impl",
    [(True, "einsum"), (True, "blocked"), (True, "auto"), (False, "xla"), (False, "auto")],
)
def test_attention_equals_explicit_formula_at_16x_the_training_length(values, impl):
    enc, params, (q, k, v, q_pos, k_pos), expected = _long_case(values)
    got = _run(enc, params, q, k, v, q_pos, k_pos, impl, lw.PATHS[impl])
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_relative_table_paths_and_their_gradients_equal_the_explicit_formula():
    """Both terms and their gradients (queries, probabilities, tables) against
    ``table[clip(j - i) + k]`` gathered per pair, on each way of laying the distances out."""
    clip, t, s, b = 3, 5, 7, 2
    enc = _bound(max_distance=clip)
    params = {n: jnp.asarray(x) for n, x in _params(enc, 6).items()}
    q, _, _ = _inputs(7, b, t, s)
    probs = jnp.asarray(np.random.default_rng(8).random((b, H, t, s)), jnp.float32)
    w_k, w_v = (
        jnp.asarray(np.random.default_rng(n).standard_normal(shape), jnp.float32)
        for n, shape in ((9, (b, H, t, s)), (10, (b, t, H, DH)))
    )

    def fast(q, probs, params, q_pos, k_pos):
        keys = enc.content_logits(params, q, None, q_pos, k_pos)
        values = enc.value_term(params, probs, q_pos, k_pos)
        return jnp.sum(keys * w_k) + jnp.sum(values * w_v)

    def naive(q, probs, params, q_pos, k_pos):
        index = clipped_relative_index(q_pos, k_pos, clip)  # [B, T, S]
        keys = jnp.einsum("BTHD,BTSD->BHTS", q, params["key_table"][index])
        values = jnp.einsum("BHTS,BTSD->BTHD", probs, params["value_table"][index])
        return jnp.sum(keys * w_k) + jnp.sum(values * w_v)

    fast, naive = (_jit(jax.value_and_grad(f, argnums=(0, 1, 2))) for f in (fast, naive))
    cases = {
        "one offset for every row: the band": ([9, 9], [4, 4]),
        "rows at different offsets: the one-hot table": ([9, 40], [4, 4]),
        "every key past -k: only the clipped end": ([200, 200], [4, 4]),
        "every key past +k": ([0, 0], [60, 60]),
        "randomized positions: per pair": ([0, 0], [4, 4]),
    }
    for case, (q_start, k_start) in cases.items():
        q_pos = np.stack([o + np.arange(t) for o in q_start])
        k_pos = np.stack([o + np.arange(s) for o in k_start])
        if case.startswith("randomized"):
            k_pos = k_pos * 3
        args = (jnp.asarray(q), probs, params, jnp.asarray(q_pos), jnp.asarray(k_pos))
        got, expected = fast(*args), naive(*args)
        for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-4, err_msg=case
            )
