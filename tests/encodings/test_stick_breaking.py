"""Stick-breaking attention (Tan et al., ICLR 2025) against a float64 numpy transcription of the
paper's weights, written as a double loop with the product:

    beta_ij = sigmoid(q_i . k_j / sqrt(d)),  A_ij = beta_ij * prod_{j<k<i} (1 - beta_ik)  (j < i)
    out_i = sum_j A_ij v_j                   (no softmax, the leftover 1 - sum_j A_ij dropped)

and the official kernel's ``attend_current`` (``j <= i``, the product over ``j < k <= i``), on
the ``einsum`` and ``blocked`` paths and ``auto`` at the tile size and 16 times it (forward and
gradients, by central differences of the float64 formula), a cache's single query over
preallocated slots with NaN in the unfilled ones, ``posenc analyze``'s weights, and the
refusals (fused kernels, linear attention, sinks, bidirectional). Contract, carry, causality,
training and memory: the battery (tests/test_testing.py), tests/test_memory.py and
tests/test_generate.py, which run over the registry.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.analysis.stats import attention_sums
from posenc.attention.core import attend, check_implementation, choose_implementation
from posenc.attention.options import AttentionOptions
from posenc.encodings import Dims
from posenc.encodings.stick_breaking import StickBreaking
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer

H, DH = 2, 8
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=H * DH)
BLOCK = 8  # the blocked path's tile
EXTRA_KEYS = 3  # S = T + 3 keys; the queries are the last T

_O0 = {"xla_backend_optimization_level": 0}  # LLVM at -O0 compiles faster, the same program
_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options=_O0,
)


def _naive(q, k, v, attend_current=False, first=None):
    """The paper's weights and output in float64, query by query and key by key.

    ``q [B, T, H, d]``, ``k, v [B, S, H, d]``; query ``i`` sits at key index ``first + i``
    (default ``S - T``). Returns ``out [B, T, H, d]`` and ``A [B, H, T, S]``."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, d = q.shape
    s = k.shape[1]
    first = s - t if first is None else first
    z = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d)
    beta = 1.0 / (1.0 + np.exp(-z))
    weights = np.zeros_like(z)
    for i in range(t):
        a = first + i  # the query's own key index
        last = a if attend_current else a - 1  # the last key that gets a weight
        for j in range(last + 1):
            # prod over j < k < i (j < k <= i with the diagonal): keys j + 1 .. last
            weights[:, :, i, j] = beta[:, :, i, j] * np.prod(
                1.0 - beta[:, :, i, j + 1 : last + 1], -1
            )
    return np.einsum("bhts,bshd->bthd", weights, v), weights


def _inputs(length, seed=0, scale=1.5, b=2):
    rng = np.random.default_rng(seed)
    t, s = length, length + EXTRA_KEYS
    q, k = (scale * rng.standard_normal((b, n, H, DH)) for n in (t, s))
    v = rng.standard_normal((b, s, H, DH))
    k_pos = np.asarray([0, 29][:b])[:, None] + np.arange(s)
    arrays = [jnp.asarray(x, jnp.float32) for x in (q, k, v)]
    return (*arrays, jnp.asarray(k_pos[:, s - t :]), jnp.asarray(k_pos))


def _bound(attend_current=False):
    return encodings.get("stick_breaking", attend_current=attend_current).bind(DIMS)


def _run(enc, impl, block, q, k, v, q_pos, k_pos):
    out = _attend(
        q,
        k,
        v,
        encoding=enc,
        params={},
        q_pos=q_pos,
        k_pos=k_pos,
        implementation=impl,
        block_size=block,
    )
    return np.asarray(out, np.float64)


# (path, factor, attend_current): `blocked` with the tile, `auto` with it (so it picks `blocked`
# at 16x), the kernel's attend_current where the rows are long.
CASES = [
    ("einsum", 1, False),
    ("blocked", 1, False),
    ("einsum", 16, False),
    ("blocked", 16, False),
    ("auto", 16, False),
    ("einsum", 16, True),
    ("blocked", 16, True),
]


@pytest.mark.parametrize("impl,factor,attend_current", CASES)
def test_every_path_equals_the_papers_formula(impl, factor, attend_current):
    length = factor * BLOCK
    q, k, v, q_pos, k_pos = _inputs(length, seed=factor)
    got = _run(_bound(attend_current), impl, BLOCK, q, k, v, q_pos, k_pos)
    expected, _ = _naive(q, k, v, attend_current)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl,factor", [("einsum", 1), ("blocked", 1), ("blocked", 16)])
def test_gradients_equal_central_differences_of_the_formula(impl, factor):
    # d/d(eps) of sum(w * out(x + eps * dx)) at 0 for random directions dx of q, k and v: the
    # float64 formula by central differences against the path's float32 gradient.
    length = factor * BLOCK
    q, k, v, q_pos, k_pos = _inputs(length, seed=10 + factor, b=1)
    enc = _bound()
    rng = np.random.default_rng(3)
    cotangent = rng.standard_normal((1, length, H, DH))
    directions = [rng.standard_normal(x.shape) for x in (q, k, v)]

    def loss(q, k, v):
        out = attend(
            q,
            k,
            v,
            encoding=enc,
            params={},
            q_pos=q_pos,
            k_pos=k_pos,
            implementation=impl,
            block_size=BLOCK,
        )
        return jnp.sum(out * cotangent)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), compiler_options=_O0)(q, k, v)
    got = sum(
        float(np.sum(np.asarray(g, np.float64) * d)) for g, d in zip(grads, directions, strict=True)
    )
    eps = 1e-5
    x = [np.asarray(a, np.float64) for a in (q, k, v)]
    plus = _naive(*[a + eps * d for a, d in zip(x, directions, strict=True)])[0]
    minus = _naive(*[a - eps * d for a, d in zip(x, directions, strict=True)])[0]
    expected = float(np.sum((plus - minus) * cotangent)) / (2 * eps)
    np.testing.assert_allclose(got, expected, rtol=1e-4)


@dataclasses.dataclass(frozen=True)
class _WithoutLimit(StickBreaking):
    """Stick-breaking without its carry_limit: the blocked path reads every key tile in full."""

    @property
    def carry_limit(self):
        return None


@pytest.mark.parametrize("attend_current", [False, True])
def test_the_carry_limit_changes_no_bit(attend_current):
    # Logits of scale ~4 break over 104 of the stick within a few keys, so most key tiles of the
    # 128-token window lie past the limit for every query of their block: the blocked path adds
    # -1e30 terms there (NoPE's cost) instead of the weights, which float32 makes 0 anyway.
    q, k, v, q_pos, k_pos = _inputs(16 * BLOCK, seed=9, scale=2.5)
    limited = _run(_bound(attend_current), "blocked", BLOCK, q, k, v, q_pos, k_pos)
    full = _WithoutLimit(attend_current=attend_current).bind(DIMS)
    np.testing.assert_array_equal(limited, _run(full, "blocked", BLOCK, q, k, v, q_pos, k_pos))
    _, weights = _naive(q, k, v, attend_current)
    t, s = q.shape[1], k.shape[1]
    earlier = np.arange(s)[None, :] < np.arange(t)[:, None] + (s - t)  # [T, S], j < i
    # many earlier keys lie past the limit (about 46 %): their float32 weights are 0
    assert np.mean(weights.astype(np.float32)[..., earlier] == 0.0) > 0.3


def test_weights_break_one_stick_from_the_query_backwards():
    # One key after another near the query takes (almost) all that is left: the keys behind a
    # key with beta ~ 1 get ~0, and a row's weights sum to 1 - prod (1 - beta) <= 1.
    q, k, v, q_pos, k_pos = _inputs(12, seed=4, b=1)
    k = np.asarray(k).copy()
    k[0, 9] = 40.0 * np.asarray(q)[0, -1]  # key 9 takes the whole stick of the last query
    _, weights = _naive(q, k, v)
    assert weights[0, :, -1, :9].max() < 1e-6 and weights[0, :, -1, 9].min() > 0.0
    assert np.all(weights.sum(-1) <= 1.0 + 1e-12)
    got = _run(_bound(), "blocked", 5, q, jnp.asarray(k), v, q_pos, k_pos)
    np.testing.assert_allclose(got, _naive(q, k, v)[0], rtol=1e-4, atol=1e-5)


def test_the_first_token_attends_to_nothing_without_attend_current():
    # The paper's j < i: no earlier key, no weight (the leftover is dropped).
    q, k, v, q_pos, k_pos = _inputs(BLOCK, seed=5)
    q, k, v = q[:, :1], k[:, :1], v[:, :1]
    for impl in ("einsum", "blocked"):
        got = _run(_bound(), impl, BLOCK, q, k, v, q_pos[:, :1], k_pos[:, :1])
        assert np.all(got == 0.0)
    got = _run(_bound(True), "einsum", BLOCK, q, k, v, q_pos[:, :1], k_pos[:, :1])
    np.testing.assert_allclose(got, _naive(q, k, v, attend_current=True)[0], rtol=1e-5)


@functools.partial(jax.jit, static_argnames="enc", compiler_options=_O0)
def _cached_step(q, k, v, enc, q_pos, k_pos, valid, slot):
    # the slot is traced: one compile for every slot, as the cache's loop has it
    return attend(
        q, k, v, encoding=enc, params={}, q_pos=q_pos, k_pos=k_pos, k_valid=valid, q_index=slot
    )


@pytest.mark.parametrize("attend_current", [False, True])
def test_a_caches_single_query_over_unfilled_nan_slots(attend_current):
    # What posenc.decoding runs per step: one query at its slot, the later slots unfilled (NaN)
    # and masked by k_valid, on the path `auto` takes for it.
    q, k, v, q_pos, k_pos = _inputs(16 * BLOCK - EXTRA_KEYS, seed=6)
    s = k.shape[1]
    enc = _bound(attend_current)
    for slot in (0, 1, 37, s - 1):
        valid = jnp.arange(s)[None, :] <= slot
        garbage_k = jnp.where(valid[..., None, None], k, jnp.nan)
        garbage_v = jnp.where(valid[..., None, None], v, jnp.nan)
        got = _cached_step(
            q[:, :1], garbage_k, garbage_v, enc, k_pos[:, slot : slot + 1], k_pos, valid, slot
        )
        expected = _naive(q[:, :1], k[:, : slot + 1], v[:, : slot + 1], attend_current, slot)[0]
        np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=1e-4, atol=1e-5)


def test_analyze_reads_the_unnormalised_weights():
    # posenc analyze's per-distance weight sums are the paper's A_ij, not a softmax of them.
    q, k, v, q_pos, k_pos = _inputs(12, seed=7, b=1)
    sums = attention_sums(
        q, k, encoding=_bound(), params={}, q_pos=q_pos, k_pos=k_pos, causal=True, block_size=5
    )
    _, weights = _naive(q, k, v)  # [1, H, T, S]
    t, s = q.shape[1], k.shape[1]
    expected = np.zeros((H, s))
    for i in range(t):
        for j in range(i + s - t + 1):
            expected[:, i + s - t - j] += weights[0, :, i, j]
    np.testing.assert_allclose(np.asarray(sums.weight), expected, rtol=1e-4, atol=1e-6)


def test_refusals_and_the_path_auto_takes():
    enc = _bound()
    for impl in ("xla", "cudnn", "linear", "linear_performer"):
        with pytest.raises(ValueError, match=rf"attention_impl='{impl}'.*normalized = False"):
            check_implementation(enc, impl)
    with pytest.raises(ValueError, match=r"model.attention_impl='xla'.*'stick_breaking'"):
        Transformer(
            ModelConfig(attention_impl="xla"), encodings.get("stick_breaking"), rngs=nnx.Rngs(0)
        )
    with pytest.raises(ValueError, match=r"model.sinks=True.*'stick_breaking'.*normalized = False"):
        check_implementation(enc, "blocked", AttentionOptions(sinks=True))
    with pytest.raises(ValueError, match=r"model.sinks=True.*normalized = False"):
        Transformer(ModelConfig(sinks=True), encodings.get("stick_breaking"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"model.causal=False.*'stick_breaking'.*causal only"):
        Transformer(ModelConfig(causal=False), encodings.get("stick_breaking"), rngs=nnx.Rngs(0))
    for platform in ("cpu", "gpu"):
        assert choose_implementation(enc, 64, jnp.bfloat16, 512, platform) == "einsum"
        assert choose_implementation(enc, 4096, jnp.bfloat16, 512, platform) == "blocked"
    with pytest.raises(
        ValueError, match=r"encoding\..*attend_current must be one of \[True, False\]"
    ):
        encodings.get("stick_breaking", attend_current=1)


def test_declarations():
    enc = encodings.get("stick_breaking")
    assert enc.hooks == ("contextual_logits",) and enc.relative and enc.causal_only
    assert not enc.normalized and enc.cacheable and enc.attend_current is False
    assert encodings.get("nope").normalized  # the default: a softmax


@pytest.mark.slow
def test_an_8192_token_window_on_the_blocked_path():
    # The long-evaluation case: one 8k window, tiles of 512, the sum carried across 16 key tiles;
    # checked against the formula on rows spread over the window.
    length = 8192 - EXTRA_KEYS
    q, k, v, q_pos, k_pos = _inputs(length, seed=8, scale=0.7, b=1)
    got = _run(_bound(), "blocked", 512, q, k, v, q_pos, k_pos)
    assert np.isfinite(got).all()
    for row in (0, 511, 512, 4000, length - 1):
        s = row + EXTRA_KEYS + 1
        expected, _ = _naive(q[:, row : row + 1], k[:, :s], v[:, :s])
        np.testing.assert_allclose(got[:, row : row + 1], expected, rtol=1e-3, atol=1e-5)
