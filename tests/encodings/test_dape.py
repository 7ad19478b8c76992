"""DAPE (Zheng et al. 2024) against a float64 numpy transcription of its formula,

    logit_h(i, j) = A_h + B_h + f([A_1..A_H, B_1..B_H])_h,   A = q . k / sqrt(d),
    f(x) = W_2 LeakyReLU_0.01(W_1 x + b_1) + b_2,

with each base's bias ``B`` written out here from its paper (ALiBi's slopes, KERPLE's log and
power kernels with the authors' clamps, FIRE's interpolated MLP), on every attention path at the
training length and 16 times it (128 times in the slow step), causal and bidirectional; with
``f = 0`` (a zero output layer) DAPE is its base encoder bit for bit on every path."""

from __future__ import annotations

import _term_attention as ta
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import check_implementation
from posenc.encodings import Dims

DIMS = Dims(num_heads=ta.H, head_dim=ta.DH, model_dim=ta.H * ta.DH)
W = 8  # MLP width: small, so the transcription's [B, T, S, W] stays small at 16x
EPS = 1e-2  # KERPLE's clamp
FIRE_L = 20.0  # FIRE's threshold inside the windows: max(L, i) takes both branches


def _bound(base, **hparams):
    extra = {"base_hparams": {"init_L": FIRE_L}} if base == "fire" else {}
    return encodings.get("dape", base=base, mlp_width=W, **extra, **hparams).bind(DIMS)


def _params(base, seed=0):
    """Random base parameters (KERPLE's below the clamp on one head) and MLP weights large
    enough that ``f`` moves the logits by order one."""
    rng = np.random.default_rng(seed)
    enc = _bound(base)
    params = dict(enc.init(jax.random.key(seed), DIMS))
    if base.startswith("kerple"):
        params["base_r1"] = jnp.asarray([0.005, 0.7, 1.6], jnp.float32)
        params["base_r2"] = jnp.asarray([0.4, 0.001, 1.3], jnp.float32)
    for name, shape in (("mlp_in_w", (2 * ta.H, W)), ("mlp_in_b", (W,))):
        params[name] = jnp.asarray(0.5 * rng.standard_normal(shape), jnp.float32)
    for name, shape in (("mlp_out_w", (W, ta.H)), ("mlp_out_b", (ta.H,))):
        params[name] = jnp.asarray(0.5 * rng.standard_normal(shape), jnp.float32)
    return params


def _alibi_slopes(n):
    def geometric(m):
        return [2.0 ** (-8.0 * h / m) for h in range(1, m + 1)]

    low = 2 ** int(np.floor(np.log2(n)))
    return np.asarray(geometric(low) + geometric(2 * low)[0::2][: n - low])


def _base_bias(base, params, q_pos, k_pos) -> np.ndarray:
    """The base's bias ``B`` ``[B, H, T, S]`` in float64, from its paper."""
    p = {k[5:]: np.asarray(v, np.float64) for k, v in params.items() if k.startswith("base_")}
    dist = ta.distance(q_pos, k_pos)  # |j - i|, [B, 1, T, S]
    if base == "alibi":
        return -_alibi_slopes(ta.H)[None, :, None, None] * dist
    if base == "kerple_log":
        r1, r2 = np.maximum(p["r1"], EPS), np.maximum(p["r2"], EPS)
        return -r1[None, :, None, None] * np.log(1 + r2[None, :, None, None] * dist)
    if base == "kerple_power":
        r1, r2 = np.maximum(p["r1"], EPS), np.clip(p["r2"], EPS, 2.0)
        return -r1[None, :, None, None] * dist ** r2[None, :, None, None]
    # FIRE: f(psi(i - j) / psi(max(L, i))), psi(x) = log(|c x| + 1), eps 1e-6 on the normaliser.
    c, threshold = p["c"], abs(p["L_multiplier"] * FIRE_L)
    i = np.asarray(q_pos, np.float64)[:, None, :, None]  # [B, 1, T, 1]
    x = np.log(np.abs(c * dist) + 1) / (np.log(np.abs(c * np.maximum(i, threshold)) + 1) + 1e-6)
    hidden = np.maximum(0.0, x[..., None] * p["mlp_in_w"] + p["mlp_in_b"])  # [B, 1, T, S, W']
    out = hidden[:, 0] @ p["mlp_out_w"] + p["mlp_out_b"]  # [B, T, S, H]
    return out.transpose(0, 3, 1, 2)


def _dape_term(base, params, q, k, q_pos, k_pos) -> np.ndarray:
    """``B + f([A; B])`` in float64 ``[B, H, T, S]`` (``A`` joins in ``naive``)."""
    a = np.einsum("bthd,bshd->bhts", np.asarray(q, np.float64), np.asarray(k, np.float64))
    a = a / np.sqrt(ta.DH)
    b = np.broadcast_to(_base_bias(base, params, q_pos, k_pos), a.shape)
    x = np.concatenate([a, b], axis=1).transpose(0, 2, 3, 1)  # [B, T, S, 2H]
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    z = x @ p["mlp_in_w"] + p["mlp_in_b"]
    f = np.where(z > 0, z, 0.01 * z) @ p["mlp_out_w"] + p["mlp_out_b"]  # [B, T, S, H]
    return b + f.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("length,causal,path,block", ta.CASES)
def test_dape_kerple_matches_the_transcription_on_every_path(length, causal, path, block):
    enc, params = _bound("kerple_log"), _params("kerple_log")
    q, k, v, q_pos, k_pos = ta.inputs(length)
    want = ta.naive(q, k, v, _dape_term("kerple_log", params, q, k, q_pos, k_pos), causal)
    block = ta.block_for(path, block, length)
    got = ta.run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)


@pytest.mark.parametrize("base", ["alibi", "kerple_power", "fire"])
@pytest.mark.parametrize("causal,path,block", [(True, "blocked", 5), (False, "einsum", 512)])
def test_dape_other_bases(base, causal, path, block):
    enc, params = _bound(base), _params(base, seed=1)
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=2)
    want = ta.naive(q, k, v, _dape_term(base, params, q, k, q_pos, k_pos), causal)
    got = ta.run(enc, params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)


def test_dape_through_a_key_value_cache():
    """Decoding's call: one query at its slot of a preallocated cache, garbage slots invalid."""
    enc, params = _bound("kerple_log"), _params("kerple_log", seed=6)
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=6)
    want = ta.naive(q, k, v, _dape_term("kerple_log", params, q, k, q_pos, k_pos))[:, -1:]
    got = ta.cached_query(enc, params, q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(got, want, atol=3e-5, rtol=3e-5)


def _without_f(params):
    """A zero output layer: ``f = 0``."""
    return {
        **params,
        "mlp_out_w": jnp.zeros_like(params["mlp_out_w"]),
        "mlp_out_b": 0 * params["mlp_out_b"],
    }


def _base_alone(base):
    extra = {"init_L": FIRE_L} if base == "fire" else {}
    return encodings.get(base, **extra).bind(DIMS)


def _base_params(params):
    return {k[5:]: v for k, v in params.items() if k.startswith("base_")}


@pytest.mark.parametrize("length,causal,path,block", ta.EQUALITY_CASES)
def test_dape_with_f_zero_is_kerple(length, causal, path, block):
    params = _without_f(_params("kerple_log", seed=3))
    q, k, v, q_pos, k_pos = ta.inputs(length, seed=3)
    block = ta.block_for(path, block, length)
    base = _base_alone("kerple_log")
    want = ta.run(base, _base_params(params), path, block, q, k, v, q_pos, k_pos, causal)
    got = ta.run(_bound("kerple_log"), params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("base", ["alibi", "kerple_power", "fire"])
@pytest.mark.parametrize("causal,path,block", [(True, "blocked", 5), (False, "xla", 512)])
def test_dape_with_f_zero_is_its_base(base, causal, path, block):
    params = _without_f(_params(base, seed=4))
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=4)
    want = ta.run(
        _base_alone(base), _base_params(params), path, block, q, k, v, q_pos, k_pos, causal
    )
    got = ta.run(_bound(base), params, path, block, q, k, v, q_pos, k_pos, causal)
    np.testing.assert_array_equal(got, want)


def test_a_masked_key_changes_no_query_that_cannot_see_it():
    """``f`` acts on each pair alone and attention masks its output: a huge logit at a masked
    pair (the last key, seen by the last query only) changes no other query's output."""
    enc, params = _bound("alibi"), _params("alibi", seed=5)
    q, k, v, q_pos, k_pos = ta.inputs(ta.TRAIN_LENGTH, seed=5)
    loud = np.array(k)
    loud[:, -1] *= 1e4  # the last key: only the last query sees it
    plain = ta.run(enc, params, "einsum", 512, q, k, v, q_pos, k_pos)
    moved = ta.run(enc, params, "einsum", 512, q, loud, v, q_pos, k_pos)
    assert np.isfinite(moved).all()
    np.testing.assert_array_equal(moved[:, :-1], plain[:, :-1])


def test_paths():
    """DAPE's MLP is a content-logits term: the fused ``xla`` path takes it (tested above);
    the linear paths refuse it in one line."""
    enc = _bound("alibi")
    check_implementation(enc, "xla")
    with pytest.raises(
        ValueError, match=r"model.attention_impl='linear' cannot run encoding 'dape'"
    ):
        check_implementation(enc, "linear")


@pytest.mark.parametrize(
    "hparams,match",
    [
        (
            {"base": "t5"},
            r"encoding.hparams.base must be one of \['alibi', 'kerple_log', 'kerple_power', "
            r"'fire'\]",
        ),
        (
            {"base": "fire", "base_hparams": {"width": 3}},
            r"encoding.hparams.base_hparams has \['width'\], which",
        ),
        (
            {"base": "fire", "base_hparams": {"init_L": -1.0}},
            r"for base 'fire': encoding.init_L must be",
        ),
        ({"base_hparams": 3}, r"encoding.hparams.base_hparams must be a mapping"),
        ({"mlp_width": 0}, r"encoding.hparams.mlp_width must be a positive integer"),
    ],
)
def test_bad_hyperparameters_are_refused_in_one_line(hparams, match):
    with pytest.raises(ValueError, match=match) as err:
        encodings.get("dape", **hparams)
    assert "\n" not in str(err.value)


def test_parameters():
    """The base's parameters beside the MLP's, PyTorch's Linear initialisation."""
    enc = encodings.get("dape", base="fire").bind(DIMS)
    params = enc.init(jax.random.key(0), DIMS)
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    assert shapes == enc.param_shapes(DIMS)
    assert shapes["mlp_in_w"] == (2 * ta.H, 32) and shapes["mlp_out_w"] == (32, ta.H)
    assert {"base_c", "base_L_multiplier", "base_mlp_in_w"} <= set(shapes)
    assert float(jnp.abs(params["mlp_in_w"]).max()) <= 1 / np.sqrt(2 * ta.H)
    assert float(jnp.abs(params["mlp_out_w"]).max()) <= 1 / np.sqrt(32)
