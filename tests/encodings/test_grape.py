"""GRAPE (Zhang et al. 2026) against float64 numpy transcriptions of the paper's formulas, on every
attention path at the training length and 16 times it (128 times in the slow step), causal and
bidirectional where the form allows:

- GRAPE-M: ``G_h(n) = prod_i exp(n theta_{h,i} L_i)``, each factor by the Rodrigues form
  ``I + sin(t s)/s L + (1 - cos(t s))/s^2 L^2`` of ``L_i = b a^T - a b^T`` with ``a, b`` the
  plane's columns of ``E = expm(S - S^T)``, applied to ``q`` and ``k`` by position; with the
  coordinate planes and RoPE's fixed spectrum it equals posenc's RoPE bit for bit;
- GRAPE-A: ``-|j - i| omega_h (softplus(v^_h . q_i / sqrt d) + softplus(u^_h . k_j / sqrt d))``
  added to the scaled logits (eq. 4.6); with the gate sum 1 it equals posenc's ALiBi bit for bit;
- phase-modulated GRAPE-A: ``-theta_h sum_{l=j+1..i} softplus(w . x_l + b)`` as a loop over
  ``l``; with ``theta = 1`` and ``(w, b)`` negated it equals posenc's FoX bit for bit.
"""

from __future__ import annotations

import _term_attention as ta
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from posenc import encodings
from posenc.encodings import Dims

DIMS = Dims(num_heads=ta.H, head_dim=ta.DH, model_dim=24)  # model width differs from H * DH
HALF = ta.DH // 2


def _bound(name, **hparams):
    return encodings.get(name, **hparams).bind(DIMS)


def _jit(fn):
    return jax.jit(fn, compiler_options={"xla_backend_optimization_level": 0})


def _softplus(x):
    return np.logaddexp(0.0, x)


# -- GRAPE-M -------------------------------------------------------------------------------------


def _grape_m_params(seed=0):
    """Per-head frequencies away from RoPE's and a basis away from the coordinate planes."""
    rng = np.random.default_rng(seed)
    theta = 10000.0 ** (-np.arange(0, ta.DH, 2) / ta.DH)  # [DH/2]
    theta = theta[None] * np.exp(0.3 * rng.standard_normal((ta.H, HALF)))  # [H, DH/2]
    return {
        "log_freq": jnp.asarray(np.log(theta) * 16.0, jnp.float32),
        "basis": jnp.asarray(0.4 * rng.standard_normal((ta.DH, ta.DH)), jnp.float32),
    }


def _planes(layout):
    """The channel pairs ``(first, second)`` of each plane."""
    if layout == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(HALF)]
    return [(i, i + HALF) for i in range(HALF)]


def _grape_m_matrices(params, positions, layout, scale=16.0):
    """``G_h(n)`` ``[N, H, DH, DH]`` float64 for the positions ``[N]``, by the Rodrigues form."""
    theta = np.exp(np.asarray(params["log_freq"], np.float64) / scale)
    theta = np.broadcast_to(np.atleast_2d(theta), (ta.H, HALF))
    if "basis" in params:
        s = np.asarray(params["basis"], np.float64)
        basis = scipy.linalg.expm(s - s.T)
    else:
        basis = np.eye(ta.DH)
    n = np.asarray(positions, np.float64)[:, None, None, None]  # [N, 1, 1, 1]
    g = np.broadcast_to(np.eye(ta.DH), (len(positions), ta.H, ta.DH, ta.DH)).copy()
    for i, (first, second) in enumerate(_planes(layout)):
        a, b = basis[:, second], basis[:, first]  # L(a, b) = a b^T - b a^T (module docstring)
        gen = np.outer(a, b) - np.outer(b, a)
        s = np.sqrt((a @ a) * (b @ b) - (a @ b) ** 2)
        t = n * theta[None, :, i, None, None]  # [N, H, 1, 1]
        factor = np.eye(ta.DH) + np.sin(t * s) / s * gen + (1 - np.cos(t * s)) / s**2 * (gen @ gen)
        g = g @ factor  # commuting planes: the order does not matter
    return g


def _grape_m_apply(x, pos, params, layout):
    """``G_h(pos) x``: ``x [B, N, H, DH]``, ``pos [B, N]`` -> float64."""
    flat = np.asarray(pos).reshape(-1)
    g = _grape_m_matrices(params, flat, layout).reshape(*np.shape(pos), ta.H, ta.DH, ta.DH)
    return np.einsum("bnhde,bnhe->bnhd", g, np.asarray(x, np.float64))


def _grape_m_naive(q, k, v, q_pos, k_pos, params, layout, causal):
    qr = _grape_m_apply(q, q_pos, params, layout)
    kr = _grape_m_apply(k, k_pos, params, layout)
    return ta.naive(qr, kr, v, 0.0, causal)


@pytest.mark.parametrize("length,causal,path,block", ta.CASES)
def test_grape_m_matches_the_rodrigues_transcription_on_every_path(length, causal, path, block):
    enc = _bound("grape", basis="learned", share_across_heads=False)
    params = _grape_m_params()
    q, k, v, q_pos, k_pos = ta.inputs(length)
    want = _grape_m_naive(q, k, v, q_pos, k_pos, params, "half", causal)
    block = ta.block_for(path, block, length)
    got = ta.run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("layout,share", [("interleaved", True), ("interleaved", False)])
def test_grape_m_layouts_and_shared_spectrum(layout, share):
    enc = _bound("grape", layout=layout, share_across_heads=share, basis="learned")
    params = _grape_m_params(seed=1)
    if share:
        params["log_freq"] = params["log_freq"][0]
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=2)
    want = _grape_m_naive(q, k, v, q_pos, k_pos, params, layout, True)
    got = ta.run(enc, params, "einsum", 512, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_grape_m_is_orthogonal_and_relative():
    """``G(n)`` preserves norms and ``G(i)^T G(j) = G(j - i)`` through the learned basis."""
    enc = _bound("grape", basis="learned", share_across_heads=False)
    params = _grape_m_params()
    apply = _jit(enc.apply)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((1, 3, ta.H, ta.DH)), jnp.float32)
    pos = jnp.asarray([[5, 17, 40]])
    y = np.asarray(apply(params, x, pos), np.float64)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    q, k = x[:, :1], x[:, 1:2]
    far = np.einsum(
        "bthd,bthd->bh",
        apply(params, q, pos[:, :1] + 100),
        apply(params, k, pos[:, 1:2] + 100),
    )
    near = np.einsum("bthd,bthd->bh", apply(params, q, pos[:, :1]), apply(params, k, pos[:, 1:2]))
    np.testing.assert_allclose(far, near, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length,causal,path,block", ta.EQUALITY_CASES)
def test_grape_m_with_coordinate_planes_and_ropes_spectrum_is_rope(length, causal, path, block):
    """RoPE is GRAPE-M on the coordinate planes with the log-uniform spectrum (Prop. 3.1)."""
    rope = _bound("rope")
    grape = _bound("grape", learn_frequencies=False)
    assert grape.init(jax.random.key(0), DIMS) == {}
    q, k, v, q_pos, k_pos = ta.inputs(length, seed=4)
    block = ta.block_for(path, block, length)
    want = ta.run(rope, {}, path, block, q, k, v, q_pos, k_pos, causal)
    got = ta.run(grape, {}, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_grape_m_rotation_is_ropes_bit_for_bit(layout):
    rope, grape = (
        _bound("rope", layout=layout),
        _bound("grape", layout=layout, learn_frequencies=False),
    )
    q, k, _, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=5)
    want = _jit(rope.rotate)({}, q, k, q_pos, k_pos)
    for got, expected in zip(_jit(grape.rotate)({}, q, k, q_pos, k_pos), want, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
    # Learned frequencies start at RoPE's, and the learned basis at the coordinate planes.
    learned = _bound("grape", layout=layout, basis="learned")
    params = learned.init(jax.random.key(0), DIMS)
    got = _jit(learned.rotate)(params, q, k, q_pos, k_pos)[1]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want[1]), atol=2e-5)


# -- GRAPE-A -------------------------------------------------------------------------------------


def _grape_a_params(gate, seed=0):
    rng = np.random.default_rng(seed)
    params = {"omega": jnp.asarray(rng.uniform(-1.0, 1.5, ta.H), jnp.float32)}
    if gate in ("query", "query_key"):
        params["v"] = jnp.asarray(rng.standard_normal((ta.H, ta.DH)), jnp.float32)
    if gate in ("key", "query_key"):
        params["u"] = jnp.asarray(rng.standard_normal((ta.H, ta.DH)), jnp.float32)
    return params


def _alibi_slopes(n):
    """ALiBi's slopes (Press et al.; 3 heads: the 2 of a power of two, then every other of 4)."""

    def geometric(m):
        return [2.0 ** (-8.0 * h / m) for h in range(1, m + 1)]

    low = 2 ** int(np.floor(np.log2(n)))
    return np.asarray(geometric(low) + geometric(2 * low)[0::2][: n - low])


def _grape_a_term(q, k, q_pos, k_pos, params, gate):
    """Eq. 4.6 (causal; ``-|j - i|`` after the query), float64 ``[B, H, T, S]``."""
    omega = _softplus(np.asarray(params["omega"], np.float64)) * _alibi_slopes(ta.H)
    gates = 1.0
    if gate != "none":
        gates = 0.0
        for name, x, axis in (("v", q, -1), ("u", k, -2)):
            if name in params:
                w = np.asarray(params[name], np.float64)
                w = w / np.linalg.norm(w, axis=-1, keepdims=True)
                lam = _softplus(
                    np.einsum("bnhd,hd->bhn", np.asarray(x, np.float64), w) / np.sqrt(ta.DH)
                )
                gates = gates + np.expand_dims(lam, axis)
    return -ta.distance(q_pos, k_pos) * omega[None, :, None, None] * gates


@pytest.mark.parametrize("length,causal,path,block", ta.CASES)
def test_grape_a_matches_eq_4_6_on_every_path(length, causal, path, block):
    enc = _bound("grape_a")
    params = _grape_a_params("query_key")
    q, k, v, q_pos, k_pos = ta.inputs(length)
    want = ta.naive(q, k, v, _grape_a_term(q, k, q_pos, k_pos, params, "query_key"), causal)
    block = ta.block_for(path, block, length)
    got = ta.run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


def test_grape_a_through_a_key_value_cache():
    """Decoding's call: one query at its slot of a preallocated cache, garbage slots invalid."""
    enc, params = _bound("grape_a"), _grape_a_params("query_key", seed=8)
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=8)
    term = _grape_a_term(q, k, q_pos, k_pos, params, "query_key")
    want = ta.naive(q, k, v, term)[:, -1:]
    got = ta.cached_query(enc, params, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("gate", ["query", "key", "none"])
def test_grape_a_gates(gate):
    enc = _bound("grape_a", gate=gate)
    params = _grape_a_params(gate, seed=1)
    assert set(params) == set(enc.param_shapes(DIMS))
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=2)
    want = ta.naive(q, k, v, _grape_a_term(q, k, q_pos, k_pos, params, gate), True)
    got = ta.run(enc, params, "blocked", 5, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("length,causal,path,block", ta.EQUALITY_CASES)
def test_grape_a_with_the_gate_sum_one_is_alibi(length, causal, path, block):
    """ALiBi is GRAPE-A with the gates replaced by 1 and omega_h ALiBi's slopes (Sec. 4.2)."""
    grape = _bound("grape_a", gate="none")
    params = grape.init(jax.random.key(0), DIMS)  # softplus(w) = omega_init = 1 exactly
    np.testing.assert_array_equal(np.asarray(jax.nn.softplus(params["omega"])), 1.0)
    q, k, v, q_pos, k_pos = ta.inputs(length, seed=6)
    block = ta.block_for(path, block, length)
    want = ta.run(_bound("alibi"), {}, path, block, q, k, v, q_pos, k_pos, causal)
    got = ta.run(grape, params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_array_equal(got, want)


# -- phase-modulated GRAPE-A -----------------------------------------------------------------------


def _phase_inputs(length, seed=0, heads=ta.H):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, length + 3, DIMS.model_dim)).astype(np.float32)
    w = (0.5 * rng.standard_normal((DIMS.model_dim, heads))).astype(np.float32)
    b = rng.uniform(-1.0, 2.0, heads).astype(np.float32)
    return jnp.asarray(x), {"w": jnp.asarray(w), "b": jnp.asarray(b)}


def _phase_term(x, params, theta, t):
    """``-theta_h sum_{l=j+1..i} softplus(w . x_l + b)``, float64 ``[B, H, T, S]``: for each
    query the sums over ``l`` of every key ``j`` at once, accumulated from the query back."""
    x, w, b = (np.asarray(a, np.float64) for a in (x, params["w"], params["b"]))
    omega = np.broadcast_to(_softplus(x @ w + b), (*x.shape[:2], ta.H))  # [B, S, H]
    s = x.shape[1]
    term = np.zeros((x.shape[0], ta.H, t, s))
    for i in range(t):
        key_i = i + s - t
        # sum_{l=j+1..key_i} for j = key_i - 1 .. 0: omega at key_i, key_i - 1, ..., 1 summed.
        back = np.cumsum(omega[:, key_i:0:-1], axis=1)[:, ::-1]  # [B, key_i, H], j = 0..key_i-1
        term[:, :, i, :key_i] = -np.reshape(theta, (1, -1, 1)) * back.transpose(0, 2, 1)
    return term


@pytest.mark.parametrize("length,causal,path,block", ta.CAUSAL_CASES)
def test_grape_a_phase_matches_the_path_sum_on_every_path(length, causal, path, block):
    enc = _bound("grape_a_phase", rates="alibi", per_head=False)
    x, params = _phase_inputs(length, heads=1)
    q, k, v, q_pos, k_pos = ta.inputs(length)
    want = ta.naive(q, k, v, _phase_term(x, params, _alibi_slopes(ta.H)[None, :], length))
    block = ta.block_for(path, block, length)
    got = ta.run(enc, params, path, block, q, k, v, q_pos, k_pos, layer_input=x)
    # Attention forms the decay as a difference of float32 cumulative sums (as FoX's kernel):
    # at 2048 tokens they reach ~1e3, whose float32 spacing (~1e-4) is the logits' error.
    tolerance = 2e-5 if length <= 256 else 3e-4
    np.testing.assert_allclose(got, want, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("length,causal,path,block", [c for c in ta.EQUALITY_CASES if c[1]])
def test_grape_a_phase_with_unit_rates_is_fox(length, causal, path, block):
    """FoX is phase-modulated GRAPE-A with ``theta_h = 1`` and ``omega = -log f`` (App. C)."""
    x, params = _phase_inputs(length, seed=7)
    fox = {"w": -params["w"], "b": -params["b"]}  # log sigmoid(z) = -softplus(-z)
    q, k, v, q_pos, k_pos = ta.inputs(length, seed=7)
    block = ta.block_for(path, block, length)
    want = ta.run(_bound("forgetting"), fox, path, block, q, k, v, q_pos, k_pos, layer_input=x)
    got = ta.run(_bound("grape_a_phase"), params, path, block, q, k, v, q_pos, k_pos, layer_input=x)
    np.testing.assert_array_equal(got, want)


# -- refusals and checks -------------------------------------------------------------------------


def test_phase_form_is_causal_only():
    with pytest.raises(
        ValueError, match=r"model.causal=False: encoding 'grape_a_phase' is causal only"
    ):
        encodings.get("grape_a_phase").check_causal(False)
    encodings.get("grape_a").check_causal(False)  # the gated slopes take both directions


@pytest.mark.parametrize(
    "name,hparams,match",
    [
        (
            "grape",
            {"basis": "rotated"},
            r"encoding.hparams.basis must be one of \['coordinate', 'learned'\]",
        ),
        ("grape", {"layout": "pairs"}, r"encoding.hparams.layout must be one of"),
        (
            "grape",
            {"learn_frequencies": 1},
            r"encoding.hparams.learn_frequencies must be True or False",
        ),
        ("grape", {"log_freq_scale": 0}, r"encoding.hparams.log_freq_scale must be a number > 0"),
        (
            "grape_a",
            {"gate": "both"},
            r"encoding.hparams.gate must be one of \['query_key', 'query', 'key', 'none'\]",
        ),
        ("grape_a", {"omega_init": 0.0}, r"encoding.hparams.omega_init must be a number > 0"),
        (
            "grape_a_phase",
            {"rates": "learned"},
            r"encoding.hparams.rates must be one of \['one', 'alibi'\]",
        ),
        ("grape_a_phase", {"per_head": "yes"}, r"encoding.hparams.per_head must be True or False"),
    ],
)
def test_bad_hyperparameters_are_refused_in_one_line(name, hparams, match):
    with pytest.raises(ValueError, match=match) as err:
        encodings.get(name, **hparams)
    assert "\n" not in str(err.value)


def test_odd_head_width_is_refused():
    with pytest.raises(ValueError, match=r"GRAPE-M rotates planes of two channels.*7 \(odd\)"):
        encodings.get("grape").bind(Dims(num_heads=2, head_dim=7, model_dim=14))


def test_learned_basis_and_frequencies_get_gradients():
    """The learned planes and spectrum move: a gradient reaches ``S`` and ``log_freq``."""
    enc = _bound("grape", basis="learned", share_across_heads=False)
    params = enc.init(jax.random.key(0), DIMS)
    q, k, _, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH)

    def loss(p):
        qr, kr = enc.rotate(p, q, k, q_pos, k_pos)
        return jnp.sum(jnp.einsum("bthd,bshd->bhts", qr, kr) ** 2)

    grads = _jit(jax.grad(loss))(params)
    assert all(float(jnp.abs(g).max()) > 0 for g in grads.values())
