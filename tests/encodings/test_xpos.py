"""xPos (Sun et al. 2022) against a float64 transcription of the paper's formula with absolute
positions (``_rope_reference.py``): on every attention path at 1x and 16x the training length,
with each RoPE scaling, and at positions near 65536 in float32; it is exactly relative."""

from __future__ import annotations

import math
from pathlib import Path

import _rope_reference as ref
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims
from posenc.encodings.xpos import apply_xpos, center
from posenc.runs.config import apply_overrides, evaluation_changes, load_config

MODES = [None, "linear", "ntk", "dynamic", "yarn"]
TRAIN_LEN = 256


def _x(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _logits(q, k):
    return np.einsum("bthd,bshd->bhts", np.asarray(q, np.float64), np.asarray(k, np.float64))


@pytest.mark.parametrize("layout,fraction", [("half", 1.0), ("interleaved", 1.0), ("half", 0.5)])
def test_logits_match_the_papers_formula(layout, fraction):
    """q_n . k_m with q_n turned by n theta_i and scaled by zeta_i^(n / B), k_m turned by
    m theta_i and scaled by zeta_i^(-m / B), from absolute positions in float64; the code
    counts positions from a reference and must give the same logits for any reference."""
    d = 2 * int(fraction * 16 // 2)
    scale_base = 64.0
    q, k = _x(0, (2, 20, 2, 16)), _x(1, (2, 30, 2, 16))
    k_pos = np.stack([np.arange(30), np.arange(30) * 7 + 900])
    q_pos = k_pos[:, -20:]
    theta = ref.thetas(d, 1e4)
    want = _logits(
        ref.rotate(q, q_pos, theta, layout, d, ref.xpos_magnitude(q_pos, d, scale_base)),
        ref.rotate(k, k_pos, theta, layout, d, ref.xpos_magnitude(k_pos, d, scale_base, keys=True)),
    )
    kw = dict(scale_base=scale_base, layout=layout, fraction=fraction)
    for reference in (center(jnp.asarray(k_pos)), 0, np.array([5, 1000])):
        rq = apply_xpos(jnp.asarray(q), jnp.asarray(q_pos), reference=reference, **kw)
        rk = apply_xpos(jnp.asarray(k), jnp.asarray(k_pos), reference=reference, keys=True, **kw)
        # float32 angles up to ~1100 rad (reference 0) carry ~1e-4 rad of rounding.
        np.testing.assert_allclose(_logits(rq, rk), want, rtol=5e-4, atol=5e-4)
    # The decay is real: far from plain RoPE's logits at distances of a few hundred.
    plain = _logits(ref.rotate(q, q_pos, theta, layout, d), ref.rotate(k, k_pos, theta, layout, d))
    assert np.abs(plain - want).max() > 1.0


def test_zeta_is_the_papers():
    got = np.asarray(
        apply_xpos(jnp.ones((1, 1, 1, 8)), jnp.array([64]), reference=0, scale_base=64)
    )
    # Position 64 = scale_base, angle 64 theta_i: pair i is (cos, sin) of it times zeta_i, with
    # zeta_i = (2i/8 + 0.4) / 1.4 = 0.2857, 0.4643, 0.6429, 0.8214 ("half": channels i, i + 4).
    zeta = np.array([0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4])
    angle = 64 * 1e4 ** (-np.arange(0, 8, 2) / 8)
    a = zeta * (np.cos(angle) - np.sin(angle))
    b = zeta * (np.sin(angle) + np.cos(angle))
    np.testing.assert_allclose(got.reshape(-1), np.concatenate([a, b]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("times", [1, 16])
@pytest.mark.parametrize("mode", MODES, ids=str)
def test_attention_paths_match_the_naive_formula(mode, times):
    """einsum, blocked (tiles of 32), xla and auto against float64 attention with the
    transcribed rotation and decay, plain and under each RoPE scaling."""
    hparams = {} if mode is None else dict(scaling=mode, factor=8, original_max_len=TRAIN_LEN)
    num_keys = times * TRAIN_LEN
    q, k, v, q_pos, k_pos = ref.inputs(num_keys, 64 if times > 1 else num_keys)
    want = ref.expected_attention("xpos", hparams, q, k, v, q_pos, k_pos)
    for impl, got in ref.path_outputs("xpos", hparams, q, k, v, q_pos, k_pos, 32).items():
        np.testing.assert_allclose(got, want, atol=2e-4, err_msg=f"{mode} on {impl!r}")
    rope = ref.expected_attention("rope", hparams, q, k, v, q_pos, k_pos)
    assert np.abs(want - rope).max() > 1e-3, "the decay changes the attention"


def test_finite_and_exact_at_positions_near_65536():
    """A 65536-token window in float32: counted from position 0 the keys' scale
    zeta_0^(-65535/512) = e^160 overflows float32 (max ~e^88.7); from the centre of the keys
    every exponent stays within +-80. All paths stay finite and agree with the float64 formula
    (absolute positions), for the last 64 queries, and for a short window ending at 65535."""
    zeta0 = np.float32(0.4 / 1.4)
    with np.errstate(over="ignore"):
        assert np.isinf(zeta0 ** np.float32(-65535 / 512))
    for num_keys, offset in ((65536, 0), (128, 65536 - 128)):
        q, k, v, q_pos, k_pos = ref.inputs(num_keys, 64, seed=3)
        q_pos, k_pos = q_pos[:1] - ref.OFFSETS[0] + offset, k_pos[:1] - ref.OFFSETS[0] + offset
        q, k, v = q[:1], k[:1], v[:1]
        want = ref.expected_attention("xpos", {}, q, k, v, q_pos, k_pos)
        for impl, got in ref.path_outputs("xpos", {}, q, k, v, q_pos, k_pos, 32).items():
            assert np.isfinite(got).all(), impl
            # float32 angles at positions ~65536 carry ~65536 * 2^-24 rad of rounding.
            np.testing.assert_allclose(got, want, atol=2e-2, err_msg=f"{num_keys} keys, {impl}")
    enc = encodings.get("xpos").bind(Dims(1, 16, 16))
    k = jnp.asarray(_x(4, (1, 65536, 1, 16)))
    rq, rk = enc.rotate({}, k, k, jnp.arange(65536)[None], jnp.arange(65536)[None])
    assert np.isfinite(np.asarray(rq)).all() and np.isfinite(np.asarray(rk)).all()
    pairs = [(65535, 65535), (65535, 65000), (40000, 30000), (100, 0), (65535, 0)]
    n, m = np.array(pairs).T
    got = np.einsum("phd,phd->p", np.asarray(rq[0, n], np.float64), np.asarray(rk[0, m]))
    theta = ref.thetas(16, 1e4)
    kn, km = np.asarray(k)[:, n], np.asarray(k)[:, m]
    want = np.einsum(
        "bphd,bphd->p",
        ref.rotate(kn, n[None], theta, magnitude=ref.xpos_magnitude(n[None], 16)),
        ref.rotate(km, m[None], theta, magnitude=ref.xpos_magnitude(m[None], 16, keys=True)),
    )
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-6)


def test_exactly_relative():
    """Shifting every position moves the reference with them: the rotated queries and keys are
    bit for bit the same."""
    enc = encodings.get("xpos", scale_base=32.0).bind(Dims(2, 16, 32))
    q, k = jnp.asarray(_x(5, (2, 6, 2, 16))), jnp.asarray(_x(6, (2, 9, 2, 16)))
    k_pos = jnp.stack([jnp.arange(9), jnp.arange(9) * 3])
    base = enc.rotate({}, q, k, k_pos[:, -6:], k_pos)
    for shift in (1, 1000, 60000):
        moved = enc.rotate({}, q, k, k_pos[:, -6:] + shift, k_pos + shift)
        for a, b in zip(base, moved, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_without_decay_it_is_rope():
    """scale_base = inf: zeta^0 = 1, so xPos is RoPE (the same attention, any scaling)."""
    hparams = dict(scaling="yarn", factor=4, original_max_len=64)
    q, k, v, q_pos, k_pos = ref.inputs(128, 32, seed=7)
    xpos = ref.path_outputs("xpos", {**hparams, "scale_base": math.inf}, q, k, v, q_pos, k_pos, 32)
    rope = ref.path_outputs("rope", hparams, q, k, v, q_pos, k_pos, 32)
    for impl in ref.IMPLEMENTATIONS:
        np.testing.assert_allclose(xpos[impl], rope[impl], atol=1e-5, err_msg=impl)


def test_declarations_and_hyperparameters():
    cls = encodings.get_class("xpos")
    assert cls.relative and cls.paper.startswith("Sun et al. 2022")
    rope = encodings.get_class("rope").eval_safe_hparams
    # RoPE's scalings; not its STRING, which turns queries back by RoPE's rotation, not xPos's.
    assert cls.eval_safe_hparams == tuple(h for h in rope if not h.startswith("string_"))
    assert {"base", "layout", "fraction", "scaling", "factor", "scale_base", "gamma"} <= set(
        encodings.hparam_names("xpos")
    )
    enc = encodings.get("xpos")
    assert (enc.scale_base, enc.gamma, enc.scaling) == (512.0, 0.4, None)


def test_evaluation_may_change_the_scaling_not_the_decay():
    tiny = load_config(f"{Path(__file__).resolve().parents[2] / 'configs' / 'base.py'}:tiny")
    trained = apply_overrides(tiny, ["encoding.name=xpos"])
    scaled = apply_overrides(
        trained, ["encoding.hparams.scaling=dynamic", "encoding.hparams.original_max_len=64"]
    )
    assert evaluation_changes(trained, scaled) == {
        "encoding.hparams.scaling": "dynamic",
        "encoding.hparams.original_max_len": 64,
    }
    for field in ("scale_base", "gamma"):
        with pytest.raises(ValueError, match=f"encoding.hparams.{field}"):
            evaluation_changes(trained, apply_overrides(trained, [f"encoding.hparams.{field}=2"]))


@pytest.mark.parametrize(
    "hparams,match",
    [
        ({"scale_base": 0}, "encoding.(hparams.)?scale_base must be a number > 0"),
        ({"gamma": -0.4}, "encoding.(hparams.)?gamma must be a number > 0"),
        ({"scaling": "pi"}, "encoding.(hparams.)?scaling must be one of"),
        ({"scaling": "yarn", "factor": 2}, "needs encoding.(hparams.)?original_max_len"),
        ({"layout": "neox"}, "encoding.(hparams.)?layout"),
    ],
)
def test_bad_hyperparameters_are_one_line(hparams, match):
    with pytest.raises(ValueError, match=match) as err:
        encodings.get("xpos", **hparams)
    assert "\n" not in str(err.value)
