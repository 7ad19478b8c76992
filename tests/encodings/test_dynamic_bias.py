"""Dynamic position bias (x-transformers' DynamicPositionBias) against its definition written out
in float64 numpy: an MLP Linear(1, dim) -> [LayerNorm] -> SiLU -> (depth - 1) x (Linear ->
[LayerNorm] -> SiLU) -> Linear(dim, H) of d = i - j (or sign(d) log(|d| + 1)); on every attention
path, at the training length and at 16 times it, and on non-contiguous positions."""

from __future__ import annotations

import math

import _bias_attention as ba
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims

DIMS = Dims(num_heads=ba.H, head_dim=ba.DH, model_dim=ba.H * ba.DH)  # width 24 // 4 = 6
CONFIGS = [{}, {"depth": 3, "log_distance": True, "norm": True}]


def _bound(**hparams):
    return encodings.get("dynamic_bias", **hparams).bind(DIMS)


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))  # 1 / (1 + e^-x) without overflowing at x << 0


def _paper_mlp(params, depth=2, log_distance=False, norm=False):
    """x-transformers' MLP in float64: signed distances ``[...]`` -> ``[..., H]``."""
    p = {n: np.asarray(v, np.float64) for n, v in params.items()}

    def layer_norm(x):  # torch.nn.LayerNorm without affine terms, eps 1e-5
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)

    def silu(x):
        return x * _sigmoid(x)

    def f(d):
        d = np.asarray(d, np.float64)
        if log_distance:
            d = np.sign(d) * np.log(np.abs(d) + 1.0)
        x = d[..., None] * p["in_w"] + p["in_b"]
        if norm:
            x = layer_norm(x) * p["in_norm_scale"]  # x-transformers' LayerNorm: no shift
        x = silu(x)
        for layer in range(1, depth):
            x = x @ p[f"hidden{layer}_w"] + p[f"hidden{layer}_b"]
            if norm:
                x = layer_norm(x) * p[f"hidden{layer}_norm_scale"] + p[f"hidden{layer}_norm_bias"]
            x = silu(x)
        return x @ p["out_w"] + p["out_b"]

    return f


def _paper_bias(params, **hparams):
    f = _paper_mlp(params, **hparams)

    def bias(q_pos, k_pos):  # the MLP of i - j for every pair, [B, H, T, S]
        return np.moveaxis(f(q_pos[:, :, None] - k_pos[:, None, :]), -1, 1)

    return bias


def _params(hparams, seed=0):
    """Initial parameters, with the norms' scales and shifts moved away from 1 and 0."""
    enc = _bound(**hparams)
    params = enc.init(jax.random.key(seed), DIMS)
    rng = np.random.default_rng(seed)
    for name in params:
        if "norm" in name:
            params[name] = params[name] + jnp.asarray(rng.uniform(-0.5, 0.5, params[name].shape))
    return enc, {n: jnp.asarray(x, jnp.float32) for n, x in params.items()}


def _bias(enc, params, q, ks):
    return np.asarray(enc.bias(params, jnp.asarray([[q]]), jnp.asarray([ks])))[0, :, 0]


def test_golden_values_worked_by_hand():
    # depth 1, width 2: f(d) = silu(d) on every head (in weights 1, out weights 1/2).
    two = {"in_w": jnp.ones(2), "in_b": jnp.zeros(2), "out_w": jnp.full((2, ba.H), 0.5)}
    two["out_b"] = jnp.zeros(ba.H)
    enc = _bound(depth=1, dim=2)
    # Query 5 against keys 5, 3, 7: d = 0, 2, -2: silu(0) = 0, 2 sigmoid(2), -2 sigmoid(-2).
    got = _bias(enc, two, 5, [5, 3, 7])
    np.testing.assert_allclose(got[0], [0.0, 2 * _sigmoid(2.0), -2 * _sigmoid(-2.0)], rtol=1e-6)
    # log distance: d = 3 -> log 4, silu(log 4) = log 4 * 4/5; d = -3 -> -log 4 * 1/5.
    enc = _bound(depth=1, dim=2, log_distance=True)
    got = _bias(enc, two, 3, [0, 6])
    np.testing.assert_allclose(got[0], [0.8 * math.log(4), -0.2 * math.log(4)], rtol=1e-6)
    # norm: in weights (1, -1) make (d, -d), normalised to (1, -1) for d > 0; heads read
    # silu(1) = sigmoid(1), silu(-1) = -sigmoid(-1), and their sum.
    params = {
        "in_w": jnp.asarray([1.0, -1.0]),
        "in_b": jnp.zeros(2),
        "in_norm_scale": jnp.ones(2),
        "out_w": jnp.asarray([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]]),
        "out_b": jnp.zeros(3),
    }
    got = _bias(_bound(depth=1, dim=2, norm=True), params, 3, [0])[:, 0]
    s1, sm1 = _sigmoid(1.0), -_sigmoid(-1.0)
    np.testing.assert_allclose(got, [s1, sm1, s1 + sm1], rtol=1e-5)


def test_parameters_and_initialisation_as_x_transformers():
    dims = Dims(num_heads=4, head_dim=16, model_dim=64)  # width 64 // 4 = 16
    enc = encodings.get("dynamic_bias", norm=True).bind(dims)
    params = enc.init(jax.random.key(0), dims)
    assert {n: p.shape for n, p in params.items()} == {
        "in_w": (16,),
        "in_b": (16,),
        "in_norm_scale": (16,),  # x-transformers' LayerNorm: a scale, no shift
        "hidden1_w": (16, 16),
        "hidden1_b": (16,),
        "hidden1_norm_scale": (16,),
        "hidden1_norm_bias": (16,),
        "out_w": (16, 4),
        "out_b": (4,),
    }
    assert all(p.dtype == jnp.float32 for p in params.values())
    for name in ("in_norm_scale", "hidden1_norm_scale"):
        np.testing.assert_array_equal(params[name], 1.0)
    np.testing.assert_array_equal(params["hidden1_norm_bias"], 0.0)
    # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in 1, then 16.
    for name, bound in [("in_w", 1.0), ("hidden1_w", 0.25), ("out_w", 0.25), ("out_b", 0.25)]:
        x = np.asarray(params[name])
        assert np.abs(x).max() <= bound and np.abs(x).max() > 0.6 * bound, name
    assert set(_bound(dim=5).param_shapes(DIMS)) == {
        "in_w",
        "in_b",
        "hidden1_w",
        "hidden1_b",
        "out_w",
        "out_b",
    }
    assert _bound(dim=5).param_shapes(DIMS)["hidden1_w"] == (5, 5)


def test_declarations():
    enc = _bound()
    assert enc.hooks == ("bias",)
    assert enc.relative and enc.param_scope == "shared"
    assert enc.hparams() == {"depth": 2, "dim": None, "log_distance": False, "norm": False}


@pytest.mark.parametrize(
    "hparams,field",
    [({"depth": 0}, "depth"), ({"dim": 0}, "dim"), ({"norm": "yes"}, "norm")],
)
def test_bad_hyperparameters_are_rejected(hparams, field):
    with pytest.raises(ValueError, match=field):
        encodings.get("dynamic_bias", **hparams)


def test_a_model_too_narrow_for_the_default_width_is_told_to_set_dim():
    with pytest.raises(ValueError, match="encoding.hparams.dim"):
        encodings.get("dynamic_bias").bind(Dims(num_heads=1, head_dim=3, model_dim=3))


@pytest.mark.parametrize("hparams", CONFIGS)
def test_bias_bakes_no_length_sized_constant(hparams):
    enc, params = _params(hparams)
    pos = jnp.arange(256)[None]
    assert ba.largest_constant(enc.bias, params, pos, pos) < 256


@pytest.mark.parametrize("hparams", CONFIGS)
@pytest.mark.parametrize("length,causal,path,block", ba.CASES)
def test_every_path_equals_naive_attention_with_the_mlp_bias(hparams, length, causal, path, block):
    enc, params = _params(hparams)
    q, k, v, q_pos, k_pos = ba.inputs(length, seed=length + 2)
    block = ba.block_for(path, block, length)
    got = ba.run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    expected = ba.naive(q, k, v, q_pos, k_pos, _paper_bias(params, **hparams), causal)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path,block", ba.PATHS[:2])
def test_non_contiguous_positions_take_the_pairwise_path(path, block):
    # Randomized positions (sorted random subsets of a longer range, Ruoss et al. 2023): the
    # per-offset table does not apply; the bias must still be f(i - j) for every pair.
    hparams = CONFIGS[1]
    enc, params = _params(hparams, seed=3)
    q, k, v, _, _ = ba.inputs(ba.TRAIN_LENGTH, seed=5)
    s = k.shape[1]
    rng = np.random.default_rng(0)
    k_pos = np.stack([np.sort(rng.choice(200, s, replace=False)) for _ in ba.OFFSETS])
    q_pos, k_pos = jnp.asarray(k_pos[:, s - ba.TRAIN_LENGTH :]), jnp.asarray(k_pos)
    got = ba.run(enc, params, path, block, q, k, v, q_pos, k_pos)
    expected = ba.naive(q, k, v, q_pos, k_pos, _paper_bias(params, **hparams))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
