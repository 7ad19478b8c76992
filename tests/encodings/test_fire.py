"""FIRE (Li et al. 2023) against the paper's formula written out in float64 numpy:
b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(|c x| + 1), L = |m * init_L|, f a
Linear(1, W) -> ReLU -> Linear(W, H) MLP; on every attention path, at the training length and at
16 times it, with the threshold inside the windows so that max(L, i) takes both branches."""

from __future__ import annotations

import math

import _bias_attention as ba
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims

DIMS = Dims(num_heads=ba.H, head_dim=ba.DH, model_dim=ba.H * ba.DH)
W = 32


def _bound(**hparams):
    return encodings.get("fire", **hparams).bind(DIMS)


def _identity_mlp(heads=ba.H, width=4):
    """``f(x) = relu(x)`` for every head: weights 1 in, 1/width out, no biases."""
    return {
        "mlp_in_w": jnp.ones(width),
        "mlp_in_b": jnp.zeros(width),
        "mlp_out_w": jnp.full((width, heads), 1.0 / width),
        "mlp_out_b": jnp.zeros(heads),
    }


def _paper_bias(params, init_L, eps=1e-6):
    """The paper's bias in float64: numpy ``[B, T]``, ``[B, S]`` positions -> ``[B, H, T, S]``."""
    p = {n: np.asarray(v, np.float64) for n, v in params.items()}
    c, threshold = float(p["c"]), abs(float(p["L_multiplier"]) * init_L)

    def psi(x):
        return np.log(np.abs(c * x) + 1.0)

    def bias(q_pos, k_pos):
        i = q_pos[:, :, None].astype(np.float64)  # [B, T, 1]
        j = k_pos[:, None, :].astype(np.float64)  # [B, 1, S]
        x = psi(i - j) / (psi(np.maximum(threshold, i)) + eps)  # [B, T, S]
        hidden = np.maximum(x[..., None] * p["mlp_in_w"] + p["mlp_in_b"], 0.0)  # [B, T, S, W]
        out = hidden @ p["mlp_out_w"] + p["mlp_out_b"]  # [B, T, S, H]
        return out.transpose(0, 3, 1, 2)

    return bias


def _bias(enc, params, q, ks):
    """Bias of query position ``q`` against key positions ``ks``: ``[H, len(ks)]``."""
    out = enc.bias(params, jnp.asarray([[q]]), jnp.asarray([ks]))
    return np.asarray(out)[0, :, 0]


def test_golden_values_worked_by_hand():
    # c = 1, L = 7, f = relu: the bias is log(1 + (i - j)) / log(1 + max(7, i)) (+ eps).
    enc = _bound(init_L=7.0)
    params = {"c": jnp.asarray(1.0), "L_multiplier": jnp.asarray(1.0), **_identity_mlp()}
    # Query 3 is below the threshold: normaliser log 8. Distances 3, 1, 0: log 4 / log 8 = 2/3,
    # log 2 / log 8 = 1/3, 0. (With min(L, i) it would be log 4 / log 4 = 1.)
    np.testing.assert_allclose(_bias(enc, params, 3, [0, 2, 3]), [[2 / 3, 1 / 3, 0]] * 3, rtol=1e-5)
    # Query 15 is past it: normaliser log 16. Distances 15, 3, 0: 1, log 4 / log 16 = 1/2, 0.
    np.testing.assert_allclose(_bias(enc, params, 15, [0, 12, 15]), [[1, 0.5, 0]] * 3, rtol=1e-5)
    # The threshold is |m * init_L|: m = -2 gives L = 14, so query 3 divides by log 15.
    params["L_multiplier"] = jnp.asarray(-2.0)
    got = _bias(enc, params, 3, [0])
    np.testing.assert_allclose(got[:, 0], math.log(4) / math.log(15), rtol=1e-5)
    # psi takes |c x|: c = -1 is c = 1.
    params["c"], params["L_multiplier"] = jnp.asarray(-1.0), jnp.asarray(1.0)
    np.testing.assert_allclose(_bias(enc, params, 3, [0])[:, 0], 2 / 3, rtol=1e-5)


def test_interpolated_distance_stays_in_the_unit_interval_at_any_length():
    enc = _bound()
    params = enc.init(jax.random.key(0), DIMS)
    for length in (16, 4096, 32768):
        q_pos = jnp.asarray([[length - 1, length // 2, 0]])
        k_pos = jnp.arange(0, length, max(1, length // 64))[None]
        x = np.asarray(enc.interpolated_distance(params, q_pos, k_pos))
        visible = np.asarray(k_pos)[:, None, :] <= np.asarray(q_pos)[:, :, None]
        assert (x[visible] >= 0).all() and (x[visible] <= 1).all()
    # The last query against the first key: exactly psi(i) / psi(i) = 1 (up to eps) past L.
    q = jnp.asarray([[32767]])
    np.testing.assert_allclose(enc.interpolated_distance(params, q, jnp.zeros((1, 1))), 1, 1e-5)


def test_below_the_threshold_the_bias_depends_on_the_distance_only():
    enc = _bound(init_L=64.0)
    params = enc.init(jax.random.key(1), DIMS)
    pos = jnp.arange(20)[None]
    at0, at30 = enc.bias(params, pos, pos), enc.bias(params, pos + 30, pos + 30)  # all < 64
    np.testing.assert_allclose(at30, at0, rtol=1e-6, atol=1e-6)
    at100 = enc.bias(params, pos + 100, pos + 100)  # past L: the normaliser grows with i
    assert np.abs(np.asarray(at100) - np.asarray(at0)).max() > 1e-2


def test_initialisation_as_the_paper_implementation():
    dims = Dims(num_heads=8, head_dim=4, model_dim=32)
    enc = encodings.get("fire").bind(dims)
    params = enc.init(jax.random.key(2), dims)
    assert {n: p.shape for n, p in params.items()} == {
        "c": (),
        "L_multiplier": (),
        "mlp_in_w": (W,),
        "mlp_in_b": (W,),
        "mlp_out_w": (W, 8),
        "mlp_out_b": (8,),
    }
    assert all(p.dtype == jnp.float32 for p in params.values())
    assert float(params["c"]) == pytest.approx(0.1) and float(params["L_multiplier"]) == 1.0
    # PyTorch's nn.Linear default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in 1 then 32.
    for name, bound in [("mlp_in_w", 1.0), ("mlp_in_b", 1.0), ("mlp_out_w", W**-0.5)]:
        x = np.asarray(params[name])
        assert np.abs(x).max() <= bound and np.abs(x).max() > 0.7 * bound, name
        assert x.min() < 0 < x.max()


def test_declarations():
    enc = _bound()
    assert enc.hooks == ("bias",)
    assert not enc.relative and enc.param_scope == "layer"
    assert enc.hparams() == {"mlp_width": 32, "init_c": 0.1, "init_L": 512.0, "eps": 1e-6}


@pytest.mark.parametrize(
    "hparams,field",
    [
        ({"mlp_width": 0}, "mlp_width"),
        ({"init_c": 0.0}, "init_c"),
        ({"init_L": -1.0}, "init_L"),
        ({"eps": 0.0}, "eps"),
    ],
)
def test_bad_hyperparameters_are_rejected(hparams, field):
    with pytest.raises(ValueError, match=field):
        encodings.get("fire", **hparams)


def test_bias_bakes_no_length_sized_constant():
    enc = _bound()
    params = enc.init(jax.random.key(0), DIMS)
    pos = jnp.arange(256)[None]
    assert ba.largest_constant(enc.bias, params, pos, pos) < 256


def _trained_like():
    """Parameters away from their initial values, with L = 0.75 * 32 = 24: inside the windows,
    so queries fall on both sides of the threshold."""
    enc = _bound(init_L=32.0)
    params = enc.init(jax.random.key(7), DIMS)
    params = {**params, "c": jnp.asarray(0.3), "L_multiplier": jnp.asarray(0.75)}
    return enc, params


@pytest.mark.parametrize("length,causal,path,block", ba.CASES)
def test_every_path_equals_naive_attention_with_the_paper_bias(length, causal, path, block):
    enc, params = _trained_like()
    q, k, v, q_pos, k_pos = ba.inputs(length, seed=length + 1)
    block = ba.block_for(path, block, length)
    got = ba.run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    expected = ba.naive(q, k, v, q_pos, k_pos, _paper_bias(params, 32.0), causal)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_bias_above_the_whole_hidden_layer_size_equals_the_paper():
    """Past ``_HIDDEN_AT_ONCE`` entries the MLP runs one hidden unit at a time (a blocked
    tile); below it as one hidden layer: both equal the paper's bias in float64."""
    from posenc.encodings import fire

    enc, params = _trained_like()
    for n in (24, 208):  # 24 x 24 x 32 entries below the size, 208 x 208 x 32 above it
        assert (n * n * 32 > fire._HIDDEN_AT_ONCE) == (n == 208)
        q_pos = jnp.arange(n)[None] + 300
        k_pos = jnp.arange(n)[None] + 200
        got = np.asarray(enc.bias(params, q_pos, k_pos))
        expected = _paper_bias(params, 32.0)(np.asarray(q_pos), np.asarray(k_pos))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
