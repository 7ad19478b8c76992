"""posenc.attention.core.attend: the paths (einsum, blocked, xla) against naive numpy attention;
the contract's later hooks (a rotate that widens q and k, log_decay, contextual_logits) through
toy encoders with known answers; bias precision in bf16; path choice; clear errors.

Every path against the reference, causality and gradients for every registered encoder are the
contract battery's (posenc.testing, run by tests/test_testing.py). The cudnn path needs an NVIDIA
GPU and is not exercised on CPU. Shaw and Transformer-XL are checked against their explicit
L x L x D formulas in tests/encodings/."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings, testing
from posenc.attention.core import IMPLEMENTATIONS, attend, choose_implementation
from posenc.encodings import Dims, Encoding, alibi_slopes

H, DH = 4, 8
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=H * DH)
HPARAMS = {
    "t5": {"num_buckets": 8, "max_distance": 16},
    "shaw": {"max_distance": 3},
}
# Named variants: T5 with bidirectional buckets (what model.causal=False requires).
VARIANTS = {
    "t5-bidirectional": ("t5", {"num_buckets": 8, "max_distance": 16, "bidirectional": True})
}

# One compiled program per (encoder, path, shapes); compiling dominates at these sizes, and LLVM
# at -O0 compiles about twice as fast while computing the same program.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
_attend = _jit(attend, static_argnames=("encoding", "causal", "implementation", "block_size"))


@functools.cache
def _encoder(name):
    """The bound encoder and its parameters (numpy, so a cached value never holds a tracer)."""
    name, hparams = VARIANTS.get(name, (name, HPARAMS.get(name, {})))
    enc = encodings.get(name, **hparams).bind(DIMS)
    with jax.ensure_compile_time_eval():
        params = {n: np.asarray(x) for n, x in enc.init(jax.random.key(1), DIMS).items()}
    # Learned tables start near zero (std 0.02); scale them to O(1) so they matter here.
    std = getattr(enc, "init_std", None)
    params = {n: (x / std * 0.5 if std and n != "w_r" else x) for n, x in params.items()}
    return enc, params


def _qkv(seed, b, t, s, dtype=np.float32):
    r = np.random.default_rng(seed)
    q = r.standard_normal((b, t, H, DH))
    k = r.standard_normal((b, s, H, DH))
    v = r.standard_normal((b, s, H, DH))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def _positions(b, t, s, offsets):
    k_pos = np.stack([o + np.arange(s) for o in offsets[:b]])
    return jnp.asarray(k_pos[:, s - t :]), jnp.asarray(k_pos)


def _run(name, impl, q, k, v, q_pos, k_pos, block_size=512, causal=True):
    enc, params = _encoder(name)
    return _attend(
        q,
        k,
        v,
        encoding=enc,
        params=params,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        implementation=impl,
        block_size=block_size,
    )


# -- naive numpy attention ------------------------------------------------------------------


def _naive(q, k, v, q_pos, k_pos, causal=True, bias=None, rotate=False):
    """softmax(q.k / sqrt(d) + bias) v in float64, causal aligned so the last query sees all."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    if rotate:  # RoPE, "half" layout: pair (c, c + d/2) turns by pos * 10000^(-2c/d)
        q, k = _naive_rope(q, q_pos), _naive_rope(k, k_pos)
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(DH)
    if bias is not None:
        logits = logits + bias(q_pos, k_pos)
    t, s = q.shape[1], k.shape[1]
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def _naive_rope(x, pos):
    half = DH // 2
    out = x.copy()
    for c in range(half):
        angle = pos[:, :, None] * 10000.0 ** (-2.0 * c / DH)  # [B, T, 1]
        a, b = x[..., c], x[..., c + half]
        out[..., c] = np.cos(angle) * a - np.sin(angle) * b
        out[..., c + half] = np.sin(angle) * a + np.cos(angle) * b
    return out


def _alibi_bias(q_pos, k_pos):
    slopes = np.array([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])  # 4 heads: 2^(-8h/4)
    # -m (i - j) on the keys a causal query sees; -m |i - j| for keys after it (bidirectional).
    dist = np.abs(q_pos[:, :, None] - k_pos[:, None, :])  # |i - j|, [B, T, S]
    return -slopes[None, :, None, None] * dist[:, None]


# T5, causal, 8 buckets, max distance 16: the docstring's table (checked in test_t5.py).
_T5_BUCKET = [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7]


def _t5_bias(table):
    def bias(q_pos, k_pos):
        back = q_pos[:, :, None] - k_pos[:, None, :]  # n = i - j
        bucket = np.vectorize(lambda n: 0 if n < 0 else _T5_BUCKET[n] if n < 16 else 7)(back)
        return np.moveaxis(np.asarray(table)[bucket], -1, 1)  # [B, H, T, S]

    return bias


# T5, bidirectional, 8 buckets (4 per side, 2 exact), max distance 16, by |i - j| = 0, 1, ...:
# exact below 2, then 2 + floor(log(n / 2) / log(16 / 2) * 2): n = 2..5 -> 2, n >= 6 -> 3. Keys
# after the query (j > i) take the second half, 4 + that (T5's `ret += (n < 0) * num_buckets`).
_T5_BI_BUCKET = [0, 1, 2, 2, 2, 2, 3]


def _t5_bidirectional_bias(table):
    def bias(q_pos, k_pos):
        back = q_pos[:, :, None] - k_pos[:, None, :]  # n = i - j
        side = np.where(back < 0, 4, 0)
        bucket = side + np.vectorize(lambda n: _T5_BI_BUCKET[min(abs(n), 6)])(back)
        return np.moveaxis(np.asarray(table)[bucket], -1, 1)  # [B, H, T, S]

    return bias


@pytest.mark.parametrize(
    "name,causal",
    [
        ("nope", True),
        ("rope", True),
        ("alibi", True),
        ("t5", True),
        ("nope", False),
        ("rope", False),
        ("alibi", False),
        ("t5-bidirectional", False),
    ],
)
@pytest.mark.parametrize("impl,block", [("einsum", 512), ("blocked", 3), ("xla", 512)])
def test_paths_equal_naive_attention(name, impl, block, causal):
    # B = 2 rows with their own offsets, and T < S (the queries are the last T of S keys).
    # Bidirectional: the queries are the middle 6 of the 10 keys, so keys lie on both sides.
    q, k, v = _qkv(0, 2, 6, 10)
    q_pos, k_pos = _positions(2, 6, 10, [0, 37])
    if not causal:
        q_pos = k_pos[:, 2:8]
    got = _run(name, impl, q, k, v, q_pos, k_pos, block_size=block, causal=causal)
    bias = {
        "alibi": _alibi_bias,
        "t5": _t5_bias(_encoder("t5")[1].get("table")),
        "t5-bidirectional": _t5_bidirectional_bias(_encoder("t5-bidirectional")[1].get("table")),
    }.get(name)
    expected = _naive(q, k, v, q_pos, k_pos, causal=causal, bias=bias, rotate=name == "rope")
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


# -- paths against each other (the contract battery, posenc.testing, compares every path with
# the reference for every registered encoder; these are the cases it does not cover) ----------


@pytest.mark.parametrize("name", ["shaw", "xl", "t5"])
def test_blocked_with_positions_shared_by_the_batch(name):
    # [T] positions (normalised to [1, T]) with B = 2: the blocks must broadcast them.
    q, k, v = _qkv(3, 2, 8, 8)
    pos = jnp.arange(8) + 21
    ref = _run(name, "einsum", q, k, v, pos, pos)
    got = _run(name, "blocked", q, k, v, pos, pos, block_size=3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_embed_only_encoders_leave_attention_alone():
    q, k, v = _qkv(4, 1, 5, 5)
    pos = jnp.arange(5)[None]
    ref = np.asarray(_run("nope", "einsum", q, k, v, pos, pos))
    for name in ("sinusoidal", "learned"):
        np.testing.assert_array_equal(np.asarray(_run(name, "einsum", q, k, v, pos, pos)), ref)


def test_bf16_inputs_give_bf16_outputs_close_to_float32():
    q, k, v = _qkv(1, 2, 8, 8)
    q_pos, k_pos = _positions(2, 8, 8, [5, 100])
    for name, impl in [("shaw", "blocked"), ("rope", "xla")]:
        ref = _run(name, impl, q, k, v, q_pos, k_pos, block_size=3)
        low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
        got = _run(name, impl, *low, q_pos, k_pos, block_size=3)
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref), atol=6e-2)


def test_xla_path_keeps_a_large_bias_in_float32_with_bf16_inputs():
    # ALiBi between queries at 0..3 and keys at 1000..1015 (bidirectional, so every key is
    # far): head 1 adds -(1000..1015)/4, where bf16 is spaced by 1 (by 2 above 256), so a bias
    # rounded to bf16 would merge keys whose logits differ by 0.25. XLA adds the float32 bias to
    # float32 logits; only the output is rounded to bf16.
    q, k, v = _qkv(10, 1, 4, 16, dtype=jnp.bfloat16)
    q_pos, k_pos = jnp.arange(4)[None], 1000 + jnp.arange(16)[None]
    got = _run("alibi", "xla", q, k, v, q_pos, k_pos, causal=False)
    assert got.dtype == jnp.bfloat16

    def rounded_bias(q_pos, k_pos):
        return np.asarray(jnp.asarray(_alibi_bias(q_pos, k_pos), jnp.bfloat16), np.float64)

    exact = _naive(q, k, v, q_pos, k_pos, causal=False, bias=_alibi_bias)
    with_rounded_bias = _naive(q, k, v, q_pos, k_pos, causal=False, bias=rounded_bias)
    error = np.abs(np.asarray(got, np.float64) - exact).max()
    rounding_error = np.abs(with_rounded_bias - exact).max()
    assert rounding_error > 0.1, rounding_error  # the test can tell the two apart
    assert error < 0.02 < rounding_error / 5, (error, rounding_error)  # bf16 output rounding only


# -- path choice and errors -----------------------------------------------------------------


def test_choose_implementation():
    def choose(name, t, dtype, platform):
        enc = encodings.get(name, **HPARAMS.get(name, {}))
        return choose_implementation(enc, t, dtype, block_size=64, platform=platform)

    bf16, f32 = jnp.bfloat16, jnp.float32
    for name in ("nope", "rope", "sinusoidal", "learned"):
        assert choose(name, 32, bf16, "gpu") == "cudnn"
        assert choose(name, 1024, bf16, "gpu") == "cudnn"
        assert choose(name, 32, f32, "gpu") == "xla"
        assert choose(name, 32, bf16, "cpu") == "xla"
        assert choose(name, 1024, bf16, "cpu") == "blocked"
    for name in ("alibi", "t5"):
        assert choose(name, 32, bf16, "gpu") == "cudnn"
        assert choose(name, 1024, bf16, "gpu") == "blocked"  # no dense [H, T, S] bias when long
        assert choose(name, 32, f32, "cpu") == "xla"
    assert choose("xl", 32, bf16, "gpu") == "xla"
    assert choose("xl", 1024, bf16, "gpu") == "blocked"
    assert choose("shaw", 32, bf16, "gpu") == "einsum"
    assert choose("shaw", 1024, bf16, "cpu") == "blocked"
    keys_only = encodings.get("shaw", values=False)
    assert choose_implementation(keys_only, 32, bf16, 64, platform="cpu") == "xla"


def test_unknown_implementation_is_rejected():
    q, k, v = _qkv(8, 1, 4, 4)
    enc, params = _encoder("rope")
    with pytest.raises(ValueError, match="attention_impl") as info:
        attend(
            q,
            k,
            v,
            encoding=enc,
            params=params,
            q_pos=jnp.arange(4),
            k_pos=jnp.arange(4),
            implementation="flash",
        )
    for impl in IMPLEMENTATIONS:
        assert impl in str(info.value)
    with pytest.raises(ValueError, match="attention_block_size"):
        attend(
            q,
            k,
            v,
            encoding=enc,
            params=params,
            q_pos=jnp.arange(4),
            k_pos=jnp.arange(4),
            implementation="blocked",
            block_size=0,
        )


@pytest.mark.parametrize("impl", ["xla", "cudnn"])
def test_value_term_encoder_on_the_fused_path_is_rejected(impl):
    q, k, v = _qkv(9, 1, 4, 4)
    enc, params = _encoder("shaw")
    with pytest.raises(ValueError, match=f"attention_impl='{impl}'.*'shaw'.*value term"):
        attend(
            q,
            k,
            v,
            encoding=enc,
            params=params,
            q_pos=jnp.arange(4),
            k_pos=jnp.arange(4),
            implementation=impl,
        )


# -- the contract's later hooks, through toy encoders whose answer is known ------------------


@dataclasses.dataclass(frozen=True)
class Doubled(Encoding):
    """``rotate`` returns ``[q, q]`` and ``[k, k]``: twice as wide, so the logits are ``2 q . k``
    over the ``1/sqrt(Dh)`` of the projected width."""

    name = "test-doubled"
    paper = "a test"
    relative = True

    def qk_head_dim(self, head_dim):
        return 2 * head_dim

    def rotate(self, params, q, k, q_pos, k_pos):
        return jnp.concatenate([q, q], axis=-1), jnp.concatenate([k, k], axis=-1)


@dataclasses.dataclass(frozen=True)
class ConstantDecay(Encoding):
    """``log_decay = -m_h`` at every token, so ``c_i - c_j = -m_h (i - j)``: ALiBi's bias."""

    name = "test-constant-decay"
    paper = "a test"
    relative = True

    def log_decay(self, params, inputs):
        slopes = jnp.asarray(alibi_slopes(self.bound_dims.num_heads), jnp.float32)
        return jnp.broadcast_to(-slopes, (*inputs.shape[:2], slopes.shape[0]))  # [B, S, H]


@dataclasses.dataclass(frozen=True)
class CountedDistance(Encoding):
    """Contextual logits that count every visible key from ``j`` to ``i`` (a gate of 1 each) and
    add ``-m_h (count - 1) = -m_h (i - j)``: ALiBi's bias again, if the count crosses tiles."""

    name = "test-counted-distance"
    paper = "a test"
    relative = True

    def contextual_logits(self, params, q, k, logits, carry):
        seen = (logits > -1e29).astype(jnp.float32)  # masked pairs are -1e30
        counted = carry[..., None] + jax.lax.cumsum(seen, axis=3, reverse=True)
        slopes = jnp.asarray(alibi_slopes(logits.shape[1]), jnp.float32)[None, :, None, None]
        return -slopes * (counted - 1.0), counted[..., 0]


@dataclasses.dataclass(frozen=True)
class ForgetsTheCarry(CountedDistance):
    """Counts only inside the keys it is given: right on whole rows, wrong on tiles."""

    name = "test-forgets-the-carry"

    def contextual_logits(self, params, q, k, logits, carry):
        return super().contextual_logits(params, q, k, logits, jnp.zeros_like(carry))


@dataclasses.dataclass(frozen=True)
class UndeclaredWidth(Doubled):
    """Widens ``q`` and ``k`` without declaring it in ``qk_head_dim``."""

    name = "test-undeclared-width"

    def qk_head_dim(self, head_dim):
        return head_dim


_TOYS = {"doubled": Doubled, "decay": ConstantDecay, "counted": CountedDistance}


_TOY_PATHS = [("einsum", 512), ("blocked", 3), ("xla", 512), ("auto", 4), ("auto", 512)]


@pytest.mark.parametrize(
    "toy,impl,block",
    # Contextual logits refuse the fused paths (tested below).
    [(toy, *p) for toy in sorted(_TOYS) for p in _TOY_PATHS if (toy, p[0]) != ("counted", "xla")],
)
def test_later_hooks_on_every_path_equal_naive_attention(toy, impl, block):
    enc = _TOYS[toy]().bind(DIMS)
    q, k, v = _qkv(11, 2, 6, 10)
    q_pos, k_pos = _positions(2, 6, 10, [0, 37])
    inputs = jnp.zeros((2, 10, H * DH), jnp.float32)  # read only by log_decay, which ignores it
    got = _attend(
        q,
        k,
        v,
        encoding=enc,
        params={},
        q_pos=q_pos,
        k_pos=k_pos,
        causal=True,
        implementation=impl,
        block_size=block,
        inputs=inputs,
    )
    if toy == "doubled":
        expected = _naive(2 * np.asarray(q), k, v, q_pos, k_pos)
    else:
        expected = _naive(q, k, v, q_pos, k_pos, bias=_alibi_bias)
    assert got.shape == q.shape
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["xla", "cudnn"])
def test_contextual_logits_on_the_fused_path_are_rejected(impl):
    q, k, v = _qkv(9, 1, 4, 4)
    enc = CountedDistance().bind(DIMS)
    with pytest.raises(ValueError, match=rf"attention_impl='{impl}'.*contextual logits.*'blocked'"):
        attend(
            q,
            k,
            v,
            encoding=enc,
            params={},
            q_pos=jnp.arange(4),
            k_pos=jnp.arange(4),
            implementation=impl,
        )
    assert choose_implementation(enc, 32, jnp.bfloat16, 64, platform="gpu") == "einsum"
    assert choose_implementation(enc, 1024, jnp.bfloat16, 64, platform="gpu") == "blocked"


def test_the_battery_catches_a_lost_carry_and_an_undeclared_width():
    with pytest.raises(AssertionError, match=r"'test-forgets-the-carry'.*carry.*differ"):
        testing.check_carry(ForgetsTheCarry())
    with pytest.raises(AssertionError, match=r"'test-forgets-the-carry'.*path 'blocked' differs"):
        testing.check_paths_agree(ForgetsTheCarry())
    testing.check_carry(CountedDistance())  # the right one passes both
    testing.check_paths_agree(CountedDistance())
    with pytest.raises(AssertionError, match=r"'test-undeclared-width'.*qk_head_dim\(16\) = 16"):
        testing.check_paths_agree(UndeclaredWidth())
