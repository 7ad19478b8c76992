"""PoPE (Gopalakrishnan et al. 2025) against a float64 numpy transcription of the paper's score:

    a_ts = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_hc) / sqrt(d),
    theta_c = 10000^(-c/d) for c = 0 .. d-1, delta clamped to [-2 pi, 0]

(the real part of q~^H k~ with q~ = softplus(q) e^{i t theta}, k~ = softplus(k) e^{i (s theta +
delta)}), on every attention path (`einsum`, `blocked` with small tiles, `xla`, `auto`) at the
training length and 16 times it, with each batch row at its own offset. Contract and causality:
the battery (tests/test_testing.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import attend, choose_implementation
from posenc.encodings import Dims

H, DH = 2, 8
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=H * DH)
TRAIN_LENGTH = 12
EXTRA_KEYS = 3
OFFSETS = (0, 37)

_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0)


def _naive(q, k, v, q_pos, k_pos, delta, base=10000.0, causal=True):
    """PoPE attention in float64: ``[B, T, H, d]``."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    t, s, d = q.shape[1], k.shape[1], q.shape[-1]
    theta = base ** (-np.arange(d) / d)  # [d]: d frequencies
    delta = np.clip(np.asarray(delta, np.float64), -2 * math.pi, 0.0)  # [H, d]
    rel = np.asarray(k_pos)[:, None, :] - np.asarray(q_pos)[:, :, None]  # s - t, [B, T, S]
    phase = rel[:, None, :, :, None] * theta + delta[None, :, None, None, :]  # [B, H, T, S, d]
    mu_q, mu_k = _softplus(q), _softplus(k)  # [B, T, H, d], [B, S, H, d]
    scores = np.einsum("bthc,bshc,bhtsc->bhts", mu_q, mu_k, np.cos(phase)) / np.sqrt(d)
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        scores = np.where(visible, scores, -np.inf)
    a = np.exp(scores - scores.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", a, v)


def _inputs(length, seed=0):
    rng = np.random.default_rng(seed)
    t, s = length, length + EXTRA_KEYS
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, H, DH)), jnp.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)
    return q, k, v, jnp.asarray(k_pos[:, s - t :]), jnp.asarray(k_pos)


def _delta(seed=1):
    # Also outside [-2 pi, 0], so the clamp matters.
    return np.random.default_rng(seed).uniform(-8.0, 1.0, (H, DH)).astype(np.float32)


def _run(enc, params, impl, block, q, k, v, q_pos, k_pos, causal=True):
    out = _attend(
        q,
        k,
        v,
        encoding=enc,
        params=params,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        implementation=impl,
        block_size=block,
    )
    assert out.shape == v.shape[:1] + q.shape[1:3] + v.shape[3:]  # values keep their width
    return np.asarray(out, np.float64)


PATHS = [("einsum", 512), ("blocked", 5), ("xla", 512), ("auto", 64)]


@pytest.mark.parametrize("impl,block", PATHS)
@pytest.mark.parametrize("factor", [1, 16])
def test_every_path_equals_the_papers_score(impl, block, factor):
    length = factor * TRAIN_LENGTH
    block = 7 * block + 4 if impl == "blocked" and factor > 1 else block
    q, k, v, q_pos, k_pos = _inputs(length, seed=factor)
    delta = _delta()
    enc = encodings.get("pope").bind(DIMS)
    got = _run(enc, {"phase_bias": jnp.asarray(delta)}, impl, block, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, _naive(q, k, v, q_pos, k_pos, delta), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("impl,block", [("einsum", 512), ("blocked", 5), ("xla", 512)])
def test_without_the_phase_bias_and_bidirectional(impl, block):
    q, k, v, q_pos, k_pos = _inputs(TRAIN_LENGTH, seed=4)
    enc = encodings.get("pope", phase_bias=False, base=500.0).bind(DIMS)
    got = _run(enc, {}, impl, block, q, k, v, q_pos, k_pos, causal=False)
    zero = np.zeros((H, DH))
    expected = _naive(q, k, v, q_pos, k_pos, zero, base=500.0, causal=False)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


def test_rotate_doubles_the_width_magnitudes_from_content_phases_from_position():
    enc = encodings.get("pope").bind(DIMS)
    assert enc.qk_head_dim(DH) == 2 * DH
    q, k, _, q_pos, k_pos = _inputs(5)
    params = {"phase_bias": jnp.zeros((H, DH))}
    rq, rk = enc.rotate(params, q, k, q_pos, k_pos)
    assert rq.shape == (2, 5, H, 2 * DH) and rk.shape == (2, 5 + EXTRA_KEYS, H, 2 * DH)
    # |(mu cos, mu sin)| per channel is softplus(q): the magnitude carries the content alone.
    pairs = np.asarray(rq).reshape(2, 5, H, 2, DH)
    np.testing.assert_allclose(np.hypot(pairs[:, :, :, 0], pairs[:, :, :, 1]), _softplus(q), 1e-5)
    # At position 0 with no bias the phase is 0: all content in the cosine half.
    rq0, _ = enc.rotate(params, q, k, jnp.zeros_like(q_pos), k_pos)
    np.testing.assert_allclose(np.asarray(rq0)[..., :DH], _softplus(q), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(rq0)[..., DH:], 0.0, atol=1e-6)


def test_bf16_rotate_keeps_the_dtype_and_paths_stay_close():
    q, k, v, q_pos, k_pos = _inputs(TRAIN_LENGTH, seed=6)
    enc = encodings.get("pope").bind(DIMS)
    params = {"phase_bias": jnp.asarray(_delta())}
    low = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    rq, rk = enc.rotate(params, low[0], low[1], q_pos, k_pos)
    assert rq.dtype == rk.dtype == jnp.bfloat16
    ref = _run(enc, params, "einsum", 512, q, k, v, q_pos, k_pos)
    for impl, block in [("blocked", 5), ("xla", 512)]:
        got = _run(enc, params, impl, block, *low, q_pos, k_pos)
        np.testing.assert_allclose(got, ref, atol=6e-2)


def test_declarations_parameters_and_path_choice():
    enc = encodings.get("pope")
    assert enc.hooks == ("rotate",) and enc.relative and enc.param_scope == "layer"
    bound = enc.bind(DIMS)
    assert not np.asarray(bound.init(jax.random.key(0), DIMS)["phase_bias"]).any()
    uniform = encodings.get("pope", bias_init="uniform").bind(DIMS)
    delta = np.asarray(uniform.init(jax.random.key(0), DIMS)["phase_bias"])
    assert delta.shape == (H, DH) and (delta >= -2 * math.pi).all() and (delta <= 0).all()
    assert encodings.get("pope", phase_bias=False).param_shapes(DIMS) == {}
    for bad in ({"base": 0.0}, {"bias_init": "normal"}, {"phase_bias": 1}):
        with pytest.raises(ValueError, match="encoding."):
            encodings.get("pope", **bad)
    # The fused kernel sees the doubled width: 64 -> 128 fits cuDNN, 128 -> 256 does not.
    wide = enc.bind(Dims(num_heads=2, head_dim=128, model_dim=256))
    assert choose_implementation(enc.bind(Dims(2, 64, 128)), 64, jnp.bfloat16, 512, "gpu") == (
        "cudnn"
    )
    assert choose_implementation(wide, 64, jnp.bfloat16, 512, "gpu") == "xla"
