"""RoPE scaling at evaluation (position interpolation, NTK, dynamic NTK, YaRN) against float64
transcriptions of the papers' formulas (``_rope_reference.py``), on every attention path at 1x
and 16x the training length (plain RoPE too); ``scaling=None`` and every mode at ``s = 1`` are
plain RoPE bit for bit, which is the paper's rotation within float32's analytic bound.
``posenc eval`` with the scaling hyperparameters: tests/test_rope_scaling_eval.py."""

from __future__ import annotations

import math

import _rope_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, apply_rope
from posenc.encodings.rope import rope_frequencies

MODES = ["linear", "ntk", "dynamic", "yarn"]
LAYOUTS = ["half", "interleaved"]


def _x(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- scaling=None is plain RoPE ----------------------------------------------------------------


# Every mode reduces to plain RoPE at s = 1 (dynamic: at any length up to original_max_len).
IDENTITIES = [
    {},
    {"scaling": None, "factor": 1.0, "beta_fast": 32},  # the defaults, written out
    {"scaling": "linear", "factor": 1},
    {"scaling": "ntk", "factor": 1.0},
    {"scaling": "yarn", "factor": 1, "original_max_len": 64},
    {"scaling": "dynamic", "factor": 4, "original_max_len": 64},  # 64 positions, no scaling
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("layout,fraction", [("half", 1.0), ("interleaved", 1.0), ("half", 0.5)])
@pytest.mark.parametrize("hparams", IDENTITIES, ids=lambda h: h.get("scaling", "default") or "None")
def test_unscaled_is_the_papers_rotation_and_plain_rope_bit_for_bit(
    hparams, layout, fraction, dtype
):
    x = jnp.asarray(_x(0, (2, 64, 3, 16)), dtype)
    pos = np.random.default_rng(1).integers(0, 70000, (2, 64))
    if hparams.get("scaling") == "dynamic":
        pos = np.stack([np.arange(64)] * 2)  # a window no longer than original_max_len
    kw = dict(layout=layout, fraction=fraction)
    d = 2 * int(fraction * 16 // 2)  # rotated channels
    x64 = np.asarray(x, np.float64)  # bfloat16 inputs are exact in float64
    want = x64.copy()
    want[..., :d] = ref.rotate(x64[..., :d], pos, ref.thetas(d, 1e4), layout)
    bound = np.zeros_like(x64)
    bound[..., :d] = ref.float32_bound(x64[..., :d], pos, ref.thetas(d, 1e4), layout)
    if dtype == jnp.bfloat16:  # the output is rounded to bfloat16 once more
        bound[..., :d] += ref.BF16_EPS * np.abs(want[..., :d])
    for wrap in (lambda f: f, jax.jit):
        plain = wrap(lambda x, p: apply_rope(x, p, **kw))(x, jnp.asarray(pos))
        got = wrap(lambda x, p: apply_rope(x, p, **kw, **hparams))(x, jnp.asarray(pos))
        assert got.dtype == plain.dtype == dtype
        ref.assert_within(got, want, bound, f"{hparams} against the paper's rotation")
        # A scaling mode that does not scale changes nothing, to the bit.
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(plain, np.float32))


def test_the_encoder_default_is_unscaled():
    rope = encodings.get("rope")
    assert rope.scaling is None and rope == encodings.get("rope", scaling=None)
    assert encodings.get_class("rope").eval_safe_hparams == (
        "scaling",
        "factor",
        "original_max_len",
        "beta_fast",
        "beta_slow",
        "attention_factor",
        "low_freq_factor",
        "high_freq_factor",
        "short_factor",
        "long_factor",
        "string_shift",  # STRING (tests/encodings/test_string.py)
        "string_window",
    )


# -- each mode against its paper's formula ----------------------------------------------------

# LLaMA's shape of the problem: L = 4096, 64 rotated channels, base 10000. YaRN's ramp then has
# extrapolated pairs (i <= 10), a ramp (11..22) and interpolated pairs (i >= 23).
L, D = 4096, 64


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_rotation_matches_the_papers_formula_up_to_16x(mode, layout):
    s = 16
    rng = np.random.default_rng(2)
    # Row 0: 40 positions inside the training window; row 1: a window 16 L long (64k positions).
    positions = np.stack(
        [np.sort(rng.choice(L, 40, replace=False)), np.sort(rng.choice(16 * L, 40, replace=False))]
    )
    positions[1, [0, -1]] = 0, 16 * L - 1  # so row 1 spans exactly 16 L (dynamic's length)
    x = _x(3, (2, 40, 2, D))
    got = apply_rope(
        jnp.asarray(x),
        jnp.asarray(positions),
        layout=layout,
        scaling=mode,
        factor=s,
        original_max_len=L,
    )
    spans = positions.max(1) - positions.min(1) + 1
    rows = [ref.scaled_thetas(D, 1e4, mode, s, L, length=int(n)) for n in spans]
    stretch = s if mode == "linear" else 1
    temperature = ref.yarn_sqrt_inv_t(s) if mode == "yarn" else 1.0
    want = ref.rotate(x, positions / stretch, rows, layout, scale=temperature)
    # float32 is only so accurate at angles of up to 16 L radians: the analytic bound per pair.
    bound = ref.float32_bound(x, positions / stretch, rows, layout, scale=temperature)
    ref.assert_within(got, want, bound, f"{mode} up to 16 L")
    # ...and the mode really changed the rotation at 16 L (unscaled RoPE is far from it).
    plain = ref.rotate(x, positions, [ref.thetas(D, 1e4)] * 2, layout)
    assert np.abs(want[1] - plain[1]).max() > 0.5


def test_yarn_extrapolates_fast_pairs_and_interpolates_slow_ones():
    """The paper's boundaries (Sec. 3.2): pairs turning more than beta_fast = 32 times over L
    keep theta_i, those turning fewer than beta_slow = 1 times get theta_i / s, the rest lie
    in between and go monotonically from one to the other."""
    s = 8
    theta = ref.thetas(D, 1e4)
    got = np.asarray(rope_frequencies(D, scaling="yarn", factor=s, original_max_len=L), np.float64)
    rotations = L * theta / (2 * math.pi)  # r(d) = L / lambda_d
    fast, slow = rotations > 32, rotations < 1
    assert fast.sum() >= 5 and slow.sum() >= 5 and (~fast & ~slow).sum() >= 5
    np.testing.assert_allclose(got[fast], theta[fast], rtol=1e-6)
    np.testing.assert_allclose(got[slow], theta[slow] / s, rtol=1e-6)
    weight = (got / theta - 1 / s) / (1 - 1 / s)  # 1: extrapolation, 0: interpolation
    assert np.all(np.diff(weight) <= 1e-6) and weight[0] == pytest.approx(1)
    assert weight[-1] == pytest.approx(0, abs=1e-6)


def test_yarn_temperature_multiplies_queries_and_keys():
    # At position 0 nothing turns, so each vector is only multiplied by sqrt(1/t).
    x = _x(4, (1, 3, 2, 16))
    for s in (2, 4, 16, 64):
        got = apply_rope(
            jnp.asarray(x), jnp.zeros(3, jnp.int32), scaling="yarn", factor=s, original_max_len=8
        )
        np.testing.assert_allclose(np.asarray(got), x * (0.1 * math.log(s) + 1), rtol=1e-6)
    got = apply_rope(
        jnp.asarray(x),
        jnp.zeros(3, jnp.int32),
        fraction=0.5,
        scaling="yarn",
        factor=4,
        original_max_len=8,
        attention_factor=1.5,
    )
    np.testing.assert_allclose(np.asarray(got), x * 1.5, rtol=1e-6)  # the whole head


def test_dynamic_scales_by_the_window_the_keys_span():
    """No scaling up to original_max_len; beyond it the base for l = span(keys); a shifted
    window (same span) is scaled alike."""
    s, l0 = 4, 64
    for length in (32, 64, 65, 200, 1024):
        got = np.asarray(
            rope_frequencies(16, scaling="dynamic", factor=s, original_max_len=l0, seq_len=length)
        ).reshape(-1)
        want = ref.scaled_thetas(16, 1e4, "dynamic", s, l0, length=length)
        np.testing.assert_allclose(got, want, rtol=2e-6)
    enc = encodings.get("rope", scaling="dynamic", factor=s, original_max_len=l0)
    enc = enc.bind(Dims(1, 16, 16))
    q, k = jnp.asarray(_x(5, (2, 8, 1, 16))), jnp.asarray(_x(6, (2, 200, 1, 16)))
    k_pos = jnp.stack([jnp.arange(200), jnp.arange(200) + 5000])
    rq, rk = enc.rotate({}, q, k, k_pos[:, -8:], k_pos)
    logits = np.einsum("bthd,bshd->bhts", np.asarray(rq), np.asarray(rk))
    rows = [ref.scaled_thetas(16, 1e4, "dynamic", s, l0, length=200)] * 2
    want = np.einsum(
        "bthd,bshd->bhts",
        ref.rotate(np.asarray(q), np.asarray(k_pos[:, -8:]), rows),
        ref.rotate(np.asarray(k), np.asarray(k_pos), rows),
    )
    np.testing.assert_allclose(logits, want, atol=2e-3)


# -- every attention path at 1x and 16x the training length ------------------------------------

TRAIN_LEN = 256  # with 16 channels and base 1e4 YaRN ramps over pairs 0..4


@pytest.mark.parametrize("times", [1, 16])
@pytest.mark.parametrize("mode", [None, *MODES])
def test_attention_paths_match_the_naive_formula(mode, times):
    """einsum, blocked (tiles of 32), xla and auto against float64 attention with the
    transcribed rotation: at 1x all queries of the training window, at 16x the last 64 queries
    of a 4096-token window; unscaled RoPE (``None``) as well."""
    hparams = dict(scaling=mode, factor=8, original_max_len=TRAIN_LEN) if mode else {}
    num_keys = times * TRAIN_LEN
    q, k, v, q_pos, k_pos = ref.inputs(num_keys, min(num_keys, 64 if times > 1 else num_keys))
    want = ref.expected_attention("rope", hparams, q, k, v, q_pos, k_pos)
    for impl, got in ref.path_outputs("rope", hparams, q, k, v, q_pos, k_pos, 32).items():
        np.testing.assert_allclose(got, want, atol=2e-4, err_msg=f"{mode} on {impl!r}")
    if mode is None:
        return  # plain RoPE: `want` is the unscaled reference itself
    plain = ref.expected_attention("rope", {}, q, k, v, q_pos, k_pos)
    if mode == "dynamic" and times == 1:
        np.testing.assert_allclose(want, plain, atol=1e-12)  # nothing to extend
    else:
        assert np.abs(want - plain).max() > 1e-2, "the scaling changes the attention"


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hparams,match",
    [
        ({"scaling": "pi"}, r"encoding.(hparams.)?scaling must be one of \[None, 'linear', 'ntk'"),
        ({"scaling": "linear", "factor": 0.5}, "encoding.(hparams.)?factor must be a number >= 1"),
        ({"scaling": "linear", "factor": "4"}, "encoding.(hparams.)?factor"),
        (
            {"scaling": "yarn", "factor": 4},
            "encoding.(hparams.)?scaling='yarn' needs encoding.(hparams.)?original_max",
        ),
        ({"scaling": "dynamic", "factor": 4}, "needs encoding.(hparams.)?original_max_len"),
        (
            {"original_max_len": 0},
            "encoding.(hparams.)?original_max_len must be a positive integer",
        ),
        ({"original_max_len": 64.5}, "encoding.(hparams.)?original_max_len"),
        ({"beta_fast": 1, "beta_slow": 32}, "encoding.(hparams.)?beta_fast must be greater than"),
        ({"beta_slow": 0}, "encoding.(hparams.)?beta_slow must be a number > 0"),
        ({"attention_factor": -1.0}, "encoding.(hparams.)?attention_factor"),
        # A scaling parameter without a scaling method would be ignored, yet recorded.
        (
            {"factor": 4},
            r"encoding.(hparams.)?factor=4 has no effect without encoding.(hparams.)?scaling",
        ),
        (
            {"scaling": None, "original_max_len": 64},
            "encoding.(hparams.)?original_max_len=64 has no",
        ),
        ({"beta_fast": 16}, "encoding.(hparams.)?beta_fast=16 has no effect"),
        ({"attention_factor": 1.2}, "encoding.(hparams.)?attention_factor=1.2 has no effect"),
    ],
)
def test_bad_scaling_is_one_line_naming_the_field(hparams, match):
    for make in (
        lambda: encodings.get("rope", **hparams),
        lambda: apply_rope(jnp.zeros((1, 2, 1, 8)), jnp.arange(2), **hparams),
    ):
        with pytest.raises(ValueError, match=match) as err:
            make()
        assert "\n" not in str(err.value)


def test_ntk_needs_four_rotated_channels():
    dims = Dims(num_heads=1, head_dim=8, model_dim=8)
    encodings.get("rope", fraction=0.25).bind(dims)  # plain RoPE on one pair is fine
    for mode in ("ntk", "dynamic"):
        enc = encodings.get("rope", fraction=0.25, scaling=mode, factor=2, original_max_len=4)
        with pytest.raises(ValueError, match=f"encoding.(hparams.)?scaling='{mode}'.*at least 4"):
            enc.bind(dims)
