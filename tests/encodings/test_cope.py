"""CoPE (Golovneva et al. 2024) against a float64 numpy transcription of the paper's formulas:

    g_ik = sigmoid(q_i . k_k / sqrt(d)) for visible keys, p_ij = min(sum_{k=j..i} g_ik, P - 1),
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]  (vectors, as the paper has it)
    a_ij = softmax_j(q_i . k_j / sqrt(d) + q_i . e[p_ij]),  out_i = sum_j a_ij v_j

on the `einsum` and `blocked` paths (tiles that divide no length, so the running count crosses
tiles) and `auto`, at the training length and 16 times it; an 8192-token window on the blocked
path, checked on a few rows; the fused paths refused. Contract, causality and memory: the battery
(tests/test_testing.py) and tests/test_memory.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.attention.core import attend, choose_implementation
from posenc.encodings import Dims
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer

H, DH = 2, 8
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=H * DH)
TRAIN_LENGTH = 12
EXTRA_KEYS = 3  # S = T + 3 keys; the queries are the last T
OFFSETS = (0, 37)  # positions never matter to CoPE; the rows start apart anyway

_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def _naive(q, k, v, table, max_pos, rows=None, causal=True):
    """CoPE attention in float64 for query rows ``rows`` (default all): ``[B, len(rows), H, d]``."""
    q, k, v, table = (np.asarray(x, np.float64) for x in (q, k, v, table))
    t, s, d = q.shape[1], k.shape[1], q.shape[-1]
    rows = range(t) if rows is None else rows
    out = []
    for i in rows:
        seen = i + s - t + 1 if causal else s  # keys 0 .. seen-1 are visible to query i
        logits = np.einsum("bhd,bshd->bhs", q[:, i], k[:, :seen]) / np.sqrt(d)  # [B, H, J]
        gates = 1.0 / (1.0 + np.exp(-logits))
        # p_ij = sum over the visible keys k >= j of g_ik: an upper-triangular sum.
        upper = np.triu(np.ones((seen, seen)))  # upper[j, k] = 1 for k >= j
        p = np.minimum(np.einsum("bhk,jk->bhj", gates, upper), max_pos - 1)
        lo, hi = np.floor(p).astype(int), np.ceil(p).astype(int)
        frac = (p - lo)[..., None]
        e_p = frac * table[hi] + (1.0 - frac) * table[lo]  # [B, H, J, d]
        scores = logits + np.einsum("bhd,bhjd->bhj", q[:, i], e_p)
        a = np.exp(scores - scores.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out.append(np.einsum("bhj,bjhd->bhd", a, v[:, :seen]))
    return np.stack(out, axis=1)


def _inputs(length, seed=0, scale=1.5, b=2):
    """``q, k, v`` (q and k scaled so the gates spread over (0, 1)) and positions."""
    rng = np.random.default_rng(seed)
    t, s = length, length + EXTRA_KEYS
    q, k = (scale * rng.standard_normal((b, n, H, DH)) for n in (t, s))
    v = rng.standard_normal((b, s, H, DH))
    k_pos = np.asarray(OFFSETS[:b])[:, None] + np.arange(s)
    arrays = [jnp.asarray(x, jnp.float32) for x in (q, k, v)]
    return (*arrays, jnp.asarray(k_pos[:, s - t :]), jnp.asarray(k_pos))


def _bound(max_pos):
    return encodings.get("cope", max_pos=max_pos).bind(DIMS)


def _table(max_pos, seed=1):
    return np.random.default_rng(seed).standard_normal((max_pos, DH)).astype(np.float32)


def _run(enc, table, impl, block, q, k, v, q_pos, k_pos, causal=True):
    out = _attend(
        q,
        k,
        v,
        encoding=enc,
        params={"embeddings": jnp.asarray(table)},
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        implementation=impl,
        block_size=block,
    )
    return np.asarray(out, np.float64)


# (path, block): `blocked` with tiles dividing neither window; `auto` with a block between the
# two lengths, so it picks `einsum` at 1x and `blocked` at 16x.
PATHS = [("einsum", 512), ("blocked", 5), ("auto", 64)]


@pytest.mark.parametrize("impl,block", PATHS)
@pytest.mark.parametrize("factor", [1, 16])
@pytest.mark.parametrize("max_pos", [4, 256])  # clipped at 3, or never clipped
def test_every_path_equals_the_papers_formula(impl, block, factor, max_pos):
    length = factor * TRAIN_LENGTH
    block = 7 * block + 4 if impl == "blocked" and factor > 1 else block  # dozens of tiles
    q, k, v, q_pos, k_pos = _inputs(length, seed=factor)
    table = _table(max_pos)
    got = _run(_bound(max_pos), table, impl, block, q, k, v, q_pos, k_pos)
    expected = _naive(q, k, v, table, max_pos)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


def test_bidirectional_counts_every_key_to_the_end():
    q, k, v, q_pos, k_pos = _inputs(TRAIN_LENGTH, seed=3)
    table = _table(8)
    expected = _naive(q, k, v, table, 8, causal=False)
    for impl, block in [("einsum", 512), ("blocked", 5)]:
        got = _run(_bound(8), table, impl, block, q, k, v, q_pos, k_pos, causal=False)
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


def test_contextual_positions_count_only_the_gated_keys():
    # Keys alternate between "counted" (q . k large, gate ~1) and "ignored" (gate ~0): the
    # contextual position of key j is the number of counted keys from j to i, not i - j + 1.
    enc = _bound(16)
    q = jnp.ones((1, 1, H, DH), jnp.float32)
    counted = np.arange(8) % 2 == 0
    k = np.where(counted[:, None, None], 40.0, -40.0) * np.ones((1, 8, H, DH))
    logits = jnp.asarray(np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(DH), jnp.float32)
    table = np.zeros((16, DH), np.float32)
    table[:, 0] = np.arange(16)  # q . e[p] = p: the term reads the position back
    terms, carry = enc.contextual_logits(
        {"embeddings": jnp.asarray(table)}, q, jnp.asarray(k), logits, jnp.zeros((1, H, 1))
    )
    expected = np.cumsum(counted[::-1])[::-1]  # counted keys at or after j: 4 4 3 3 2 2 1 1
    np.testing.assert_allclose(np.asarray(terms)[0, 0, 0], expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(carry), 4.0, atol=1e-5)


@pytest.mark.slow
def test_an_8192_token_window_on_the_blocked_path():
    # The long-evaluation case of the issue: one 8k window, tiles of 512, the running count
    # carried across 16 key tiles; checked against the formula on rows spread over the window.
    length = 8192
    q, k, v, q_pos, k_pos = _inputs(length - EXTRA_KEYS, seed=5, scale=0.5, b=1)
    q_pos, k_pos = q_pos - q_pos[:, :1], k_pos - k_pos[:, :1]
    table = _table(64)
    got = _run(_bound(64), table, "blocked", 512, q, k, v, q_pos, k_pos)
    assert np.isfinite(got).all()
    rows = [0, 511, 512, 4000, length - EXTRA_KEYS - 1]
    np.testing.assert_allclose(got[:, rows], _naive(q, k, v, table, 64, rows), atol=2e-4)


def test_fused_paths_are_refused_and_auto_avoids_them():
    enc = _bound(16)
    for impl in ("xla", "cudnn"):
        with pytest.raises(ValueError, match=rf"model.attention_impl='{impl}'.*'cope'.*'blocked'"):
            Transformer(ModelConfig(attention_impl=impl), encodings.get("cope"), rngs=nnx.Rngs(0))
    for platform in ("cpu", "gpu"):
        assert choose_implementation(enc, 64, jnp.bfloat16, 512, platform) == "einsum"
        assert choose_implementation(enc, 4096, jnp.bfloat16, 512, platform) == "blocked"


def test_declarations_and_parameters():
    enc = encodings.get("cope")
    assert enc.hooks == ("contextual_logits",) and enc.relative and enc.param_scope == "layer"
    assert enc.max_pos == 16 and enc.init_std == 0.0  # x-transformers' default; the paper's zeros
    params = enc.bind(DIMS).init(jax.random.key(0), DIMS)
    assert params["embeddings"].shape == (16, DH) and not np.asarray(params["embeddings"]).any()
    random = encodings.get("cope", init_std=0.5).bind(DIMS).init(jax.random.key(0), DIMS)
    assert 0.3 < float(np.std(np.asarray(random["embeddings"]))) < 0.7
    for bad in ({"max_pos": 0}, {"max_pos": 2.5}, {"init_std": -1.0}):
        with pytest.raises(ValueError, match="encoding."):
            encodings.get("cope", **bad)


def test_interpolation_gradient_equals_autodiff_of_the_gathers():
    """CoPE's hand-written gradient of the interpolation (hat functions instead of the gathers'
    scatter-adds) equals what autodiff gives for the paper's code: ``z[ceil] w + z[floor] (1 - w)``,
    at fractional positions, at integers and at the clip ``P - 1``."""
    from posenc.encodings.cope import _interpolate

    def by_autodiff(z, pos):
        floor = jnp.floor(pos)
        weight = pos - floor
        z_floor = jnp.take_along_axis(z, floor.astype(jnp.int32), axis=-1)
        z_ceil = jnp.take_along_axis(z, jnp.ceil(pos).astype(jnp.int32), axis=-1)
        return z_ceil * weight + z_floor * (1.0 - weight)

    rng = np.random.default_rng(0)
    p = 5
    z = jnp.asarray(rng.standard_normal((2, 3, 4, p)), jnp.float32)
    pos = rng.uniform(0, p - 1, (2, 3, 4, 6))
    pos[..., 0] = p - 1  # the clip
    pos[..., 1] = 2.0  # an integer
    pos = jnp.asarray(pos, jnp.float32)
    weights = jnp.asarray(rng.standard_normal(pos.shape), jnp.float32)
    for fn in (_interpolate, by_autodiff):
        np.testing.assert_allclose(fn(z, pos), by_autodiff(z, pos), rtol=1e-6, atol=1e-6)
    got = jax.grad(lambda z, pos: jnp.sum(weights * _interpolate(z, pos)), (0, 1))(z, pos)
    want = jax.grad(lambda z, pos: jnp.sum(weights * by_autodiff(z, pos)), (0, 1))(z, pos)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
