"""KERPLE (Chi et al. 2022) against the paper's formulas, written out in float64 numpy:
logarithmic -r1 log(1 + r2 |i - j|), power -r1 |i - j|^r2, with r1, r2 clamped to [0.01, inf)
(r2 of the power variant to [0.01, 2]) as the authors' code does; on every attention path, at
the training length and at 16 times it."""

from __future__ import annotations

import math

import _bias_attention as ba
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims
from posenc.encodings.kerple import project

DIMS = Dims(num_heads=ba.H, head_dim=ba.DH, model_dim=ba.H * ba.DH)

# Raw parameters, some outside the allowed interval so that the clamp is exercised:
# log: r1[0] = 0.005 -> 0.01, r2[1] = 0.004 -> 0.01; power: r1[1] -> 0.01, r2[2] = 2.7 -> 2.
RAW = {
    "kerple_log": {"r1": [0.005, 0.8, 1.9], "r2": [0.5, 0.004, 1.0]},
    "kerple_power": {"r1": [0.3, 0.002, 0.05], "r2": [0.5, 1.2, 2.7]},
}


def _bound(name, **hparams):
    return encodings.get(name, **hparams).bind(DIMS)


def _params(name):
    return {n: jnp.asarray(v, jnp.float32) for n, v in RAW[name].items()}


def _paper_bias(name):
    """The paper's kernel in float64 with the authors' clamps: positions -> [B, H, T, S]."""
    r1 = np.maximum(np.asarray(RAW[name]["r1"], np.float64), 0.01)
    r2 = np.maximum(np.asarray(RAW[name]["r2"], np.float64), 0.01)
    if name == "kerple_power":
        r2 = np.minimum(r2, 2.0)

    def bias(q_pos, k_pos):
        d = np.abs(q_pos[:, None, :, None] - k_pos[:, None, None, :]).astype(np.float64)
        a, p = r1[None, :, None, None], r2[None, :, None, None]
        return -a * (np.log(1.0 + p * d) if name == "kerple_log" else d**p)

    return bias


def _bias_at(name, params, distances):
    """Head biases for a query at 0 and keys at -distances (a causal window), ``[H, len]``."""
    enc = _bound(name)
    q_pos = jnp.zeros((1, 1), jnp.int32)
    k_pos = -jnp.asarray(distances, jnp.int32)[None]
    return np.asarray(enc.bias(params, q_pos, k_pos))[0, :, 0]


def test_golden_values_worked_by_hand():
    ones = {"r1": jnp.ones(ba.H), "r2": jnp.ones(ba.H)}
    # log, r1 = r2 = 1: -log(1 + d): d = 0 -> 0, 1 -> -log 2, 3 -> -log 4, 7 -> -log 8.
    got = _bias_at("kerple_log", ones, [0, 1, 3, 7])
    np.testing.assert_allclose(got[0], [0.0, -math.log(2), -math.log(4), -3 * math.log(2)])
    # power, r1 = r2 = 1: -d (ALiBi with slope 1).
    np.testing.assert_allclose(_bias_at("kerple_power", ones, [0, 1, 3])[0], [0.0, -1.0, -3.0])
    # power per head: (r1, r2) = (1, 2): -d^2; (1, 0.5): -sqrt(d); (0.5, 0.5): -sqrt(d) / 2.
    params = {"r1": jnp.asarray([1.0, 1.0, 0.5]), "r2": jnp.asarray([2.0, 0.5, 0.5])}
    got = _bias_at("kerple_power", params, [0, 4, 9])
    np.testing.assert_allclose(got, [[0, -16, -81], [0, -2, -3], [0, -1, -1.5]], rtol=1e-6)
    # log per head: r1 = 2, r2 = 0.5 at d = 6: -2 log 4.
    params = {"r1": jnp.full(ba.H, 2.0), "r2": jnp.full(ba.H, 0.5)}
    np.testing.assert_allclose(_bias_at("kerple_log", params, [6])[:, 0], -2 * math.log(4))


def test_clamps_follow_the_authors_code():
    # r1, r2 >= eps = 0.01; the power variant's r2 <= 2 (a CPD kernel needs 0 < p <= 2).
    raw = {"r1": jnp.asarray([-3.0, 0.0, 5.0]), "r2": jnp.asarray([-1.0, 1.5, 7.0])}
    r1, r2 = _bound("kerple_log").coefficients(raw)
    np.testing.assert_allclose(r1, [0.01, 0.01, 5.0])
    np.testing.assert_allclose(r2, [0.01, 1.5, 7.0])
    r1, r2 = _bound("kerple_power").coefficients(raw)
    np.testing.assert_allclose(r1, [0.01, 0.01, 5.0])
    np.testing.assert_allclose(r2, [0.01, 1.5, 2.0])
    r1, _ = _bound("kerple_log", eps=0.1).coefficients(raw)
    np.testing.assert_allclose(r1, [0.1, 0.1, 5.0])


def test_projection_gradient_never_pushes_a_parameter_further_out():
    x = jnp.asarray([-1.0, 0.5, 3.0, -1.0, 3.0])
    value = project(x, 0.0, 2.0)
    np.testing.assert_array_equal(value, [0.0, 0.5, 2.0, 0.0, 2.0])
    # Incoming gradients g: a descent step moves x by -g.
    g = jnp.asarray([1.0, 1.0, -1.0, -1.0, 1.0])
    (grad,) = jax.vjp(lambda x: project(x, 0.0, 2.0), x)[1](g)
    # below and pushed down: 0; inside: g; above and pushed up: 0; below, pushed up: g;
    # above, pushed down: g.
    np.testing.assert_array_equal(grad, [0.0, 1.0, 0.0, -1.0, 1.0])


@pytest.mark.parametrize(
    "name,r1_high,r2_high", [("kerple_log", 2.0, 1.0), ("kerple_power", 1.0, 2.0)]
)
def test_initialisation_is_the_authors_uniform(name, r1_high, r2_high):
    # ParallelKerpleLog: r1 (bias_p) = 2 * rand, r2 (bias_a) = rand; ParallelKerplePower
    # ("ap"): r1 (bias_a) = rand, r2 (bias_p) = 2 * rand.
    dims = Dims(num_heads=256, head_dim=4, model_dim=1024)
    enc = encodings.get(name).bind(dims)
    params = enc.init(jax.random.key(3), dims)
    assert set(params) == {"r1", "r2"}
    for key, high in (("r1", r1_high), ("r2", r2_high)):
        x = np.asarray(params[key])
        assert x.dtype == np.float32 and x.shape == (256,)
        assert 0.0 <= x.min() and x.max() < high
        assert x.min() < 0.1 * high and x.max() > 0.9 * high  # spread over the interval
        assert abs(x.mean() - high / 2) < 0.1 * high


def test_declarations():
    for name in ("kerple_log", "kerple_power"):
        enc = _bound(name)
        assert enc.hooks == ("bias",)
        assert enc.relative and enc.param_scope == "layer"  # per head and layer
        assert enc.param_shapes(DIMS) == {"r1": (ba.H,), "r2": (ba.H,)}


@pytest.mark.parametrize("name,hparams", [("kerple_log", {"eps": 0}), ("kerple_power", {"eps": 2})])
def test_bad_eps_is_rejected(name, hparams):
    with pytest.raises(ValueError, match="eps"):
        encodings.get(name, **hparams)


def test_power_gradient_is_finite_at_distance_zero():
    enc = _bound("kerple_power")
    pos = jnp.arange(4)[None]
    grads = jax.grad(lambda p: enc.bias(p, pos, pos).sum())(_params("kerple_power"))
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.values())


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power"])
def test_bias_bakes_no_length_sized_constant(name):
    pos = jnp.arange(256)[None]
    assert ba.largest_constant(_bound(name).bias, _params(name), pos, pos) < 256


@pytest.mark.parametrize("name", ["kerple_log", "kerple_power"])
@pytest.mark.parametrize("length,causal,path,block", ba.CASES)
def test_every_path_equals_naive_attention_with_the_paper_bias(name, length, causal, path, block):
    q, k, v, q_pos, k_pos = ba.inputs(length, seed=length)
    block = ba.block_for(path, block, length)
    got = ba.run(_bound(name), _params(name), path, block, q, k, v, q_pos, k_pos, causal)
    expected = ba.naive(q, k, v, q_pos, k_pos, _paper_bias(name), causal)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_blocked_parameter_gradient_equals_einsum_with_a_coefficient_below_eps():
    """The projection's sign rule sees the window's whole gradient on a path that calls the
    bias per tile (blocked at non-contiguous positions; pallas's backward recomputes there):
    ``window_params`` projects once per attention call. Before it, each tile's share was
    projected and r2's gradient was about 8 % off."""
    enc = encodings.get("kerple_log").bind(Dims(2, 8, 16))
    params = {"r1": jnp.asarray([1.0, 0.5]), "r2": jnp.asarray([0.001, 0.5])}  # r2[0] < eps
    rng = np.random.default_rng(0)
    q, k, v, w = (jnp.asarray(rng.standard_normal((2, 16, 2, 8)), jnp.float32) for _ in range(4))
    positions = np.stack([np.sort(rng.choice(64, 16, replace=False)) for _ in range(2)])
    positions = jnp.asarray(positions, jnp.int32)  # randomized: bias called per tile

    def grad(path):
        def loss(params):
            out = ba.attend(
                q,
                k,
                v,
                encoding=enc,
                params=params,
                q_pos=positions,
                k_pos=positions,
                implementation=path,
                block_size=5,
            )
            return jnp.sum(out * w)

        return np.asarray(jax.grad(loss)(params)["r2"])

    np.testing.assert_allclose(grad("blocked"), grad("einsum"), rtol=1e-4, atol=1e-4)
