"""Resonance RoPE (Wang et al. 2024; official code sheryc/resonance_rope) against a float64
transcription of its rounding (``theta_i -> 2 pi / round(2 pi / theta_i)``, every wavelength as
the code does, or those shorter than a training length) on every attention path at 1x and 16x
the tile size, causal and bidirectional, and in the cache's form; equal to RoPE bit for bit where
it rounds nothing; Resonance-YaRN (and the other scalings) as the code composes them, scale then
round; the features of a rounded pair repeat with its integer wavelength."""

from __future__ import annotations

import math
from pathlib import Path

import _rope_reference as ref
import _rotary_attention as rot
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, apply_rope
from posenc.encodings.rope import rotation_setup
from posenc.runs.config import apply_overrides, evaluation_changes, load_config

DIMS = Dims(rot.H, rot.DH, rot.H * rot.DH)


def _round(theta, train_len=None) -> np.ndarray:
    """The paper's Algorithm: lambda_i = 2 pi / theta_i, theta~_i = 2 pi / round(lambda_i);
    with a training length L only for lambda_i < L (the others kept)."""
    out = []
    for th in np.asarray(theta, np.float64):
        wavelength = 2 * math.pi / th
        rounded = train_len is None or wavelength < train_len
        out.append(2 * math.pi / np.round(wavelength) if rounded else th)
    return np.array(out)


def _bound(name: str, **hparams):
    return encodings.get(name, **hparams).bind(DIMS)


def _theta_of(enc, dh: int = rot.DH) -> np.ndarray:
    """The frequencies the encoder rotates with (float32 -> float64)."""
    x = jnp.zeros((1, 1, 1, dh))
    _, theta, _ = rotation_setup(x, jnp.zeros((1, 1), jnp.int32), **enc.rope_kwargs(None))
    return np.asarray(theta, np.float64).reshape(-1)


@pytest.mark.parametrize("base", [1e4, 500.0])
@pytest.mark.parametrize("train_len", [None, 64, 1000])
def test_the_frequencies_are_the_papers_rounding(base, train_len):
    dh = 64
    enc = encodings.get("resonance", base=base, train_len=train_len)
    got = _theta_of(enc, dh)
    want = _round(ref.thetas(dh, base), train_len)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    wavelengths = 2 * math.pi / got
    rounded = wavelengths < (train_len or np.inf)
    assert rounded.sum() >= 3  # the test rounds something
    np.testing.assert_allclose(wavelengths[rounded], np.round(wavelengths[rounded]), atol=2e-3)
    if train_len is not None:  # the longer wavelengths are RoPE's
        np.testing.assert_allclose(got[~rounded], ref.thetas(dh, base)[~rounded], rtol=1e-6)
        assert (~rounded).any()


WINDOWS = [(rot.LENGTHS[0], True), (rot.LENGTHS[1], True), (rot.LENGTHS[0], False)]
CASES = [(None, *w) for w in WINDOWS] + [
    pytest.param(24, *w, marks=pytest.mark.slow) for w in WINDOWS
]


@pytest.mark.parametrize("train_len,length,causal", CASES)
def test_every_path_equals_the_papers_formula(train_len, length, causal):
    enc = _bound("resonance", train_len=train_len)
    q, k, v, q_pos, k_pos = rot.inputs(length)
    theta = _round(ref.thetas(rot.DH, 1e4), train_len)
    logits = rot.rotary_logits(q, k, rot.distances(q_pos, k_pos), theta)
    want = rot.naive(logits, v, causal)
    for path, block in rot.PATHS:
        got = rot.run(enc, path, block, q, k, v, q_pos, k_pos, causal)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)
    if length == rot.LENGTHS[1]:  # the rounding shows at 16x: RoPE's frequencies differ
        plain = rot.naive(
            rot.rotary_logits(q, k, rot.distances(q_pos, k_pos), ref.thetas(16, 1e4)), v
        )
        assert np.abs(plain - want).max() > 1e-3


def test_the_cache_form_equals_the_papers_formula():
    enc = _bound("resonance")
    filled, slots = 21, 24
    q, k, v, q_pos, k_pos, k_valid = rot.cache_inputs(filled, slots)
    theta = _round(ref.thetas(rot.DH, 1e4))
    logits = rot.rotary_logits(q, k[:, :filled], rot.distances(q_pos, k_pos[:, :filled]), theta)
    want = rot.naive(logits, v[:, :filled])
    for path in rot.CACHE_PATHS:
        got = rot.run_cache(enc, path, q, k, v, q_pos, k_pos, k_valid)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)


def test_rounding_nothing_is_rope_bit_for_bit():
    """Every wavelength of base 10000 is at least 2 pi > 6 tokens: a training length of 6 rounds
    none, and Resonance is RoPE on every path."""
    assert (2 * math.pi / ref.thetas(rot.DH, 1e4) > 6).all()
    q, k, v, q_pos, k_pos = rot.inputs(rot.LENGTHS[1], seed=4)
    resonance, rope = _bound("resonance", train_len=6), _bound("rope")
    for path, block in rot.PATHS:
        got = rot.run(resonance, path, block, q, k, v, q_pos, k_pos)
        want = rot.run(rope, path, block, q, k, v, q_pos, k_pos)
        np.testing.assert_array_equal(got, want, err_msg=path)


# Resonance with each scaling: the official code rounds the scaled frequencies (YaRN's, NTK's,
# dynamic NTK's at the current length); posenc does so for every scaling.
SCALED = [
    ("yarn", lambda s, L, n: ref.scaled_thetas(rot.DH, 1e4, "yarn", s, L)),
    ("ntk", lambda s, L, n: ref.scaled_thetas(rot.DH, 1e4, "ntk", s)),
    ("linear", lambda s, L, n: ref.thetas(rot.DH, 1e4) / s),
    ("dynamic", lambda s, L, n: ref.scaled_thetas(rot.DH, 1e4, "dynamic", s, L, length=n)),
]


@pytest.mark.parametrize("mode,scaled", SCALED, ids=[m for m, _ in SCALED])
def test_resonance_with_a_scaling_scales_then_rounds(mode, scaled):
    s, train = 4.0, 32
    enc = _bound("resonance", scaling=mode, factor=s, original_max_len=train)
    q, k, v, q_pos, k_pos = rot.inputs(rot.LENGTHS[1], seed=5)
    span = rot.LENGTHS[1] + rot.EXTRA_KEYS  # both rows' keys span as many positions
    theta = _round(scaled(s, train, span))
    temperature = ref.yarn_sqrt_inv_t(s) ** 2 if mode == "yarn" else 1.0
    dist = rot.distances(q_pos, k_pos)
    want = rot.naive(rot.rotary_logits(q, k, dist, theta), v, scale=temperature)
    for path, block in (("einsum", 512), ("blocked", rot.TILE)):
        got = rot.run(enc, path, block, q, k, v, q_pos, k_pos)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)
    # The order is the code's: rounding RoPE's frequencies and then scaling differs.
    if mode in ("yarn", "ntk"):
        other = _round(ref.thetas(rot.DH, 1e4)) * scaled(s, train, span) / ref.thetas(rot.DH, 1e4)
        wrong = rot.naive(rot.rotary_logits(q, k, dist, other), v, scale=temperature)
        assert np.abs(wrong - want).max() > 1e-4


def test_a_rounded_pair_repeats_its_features_with_its_wavelength():
    """The point of the rounding: the features of a pair with wavelength lambda~ <= L at
    position m + lambda~ are those at m (within float32), where RoPE's drift."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 1, 1, 16)), jnp.float32)
    theta = _round(ref.thetas(16, 1e4))
    wavelength = int(round(2 * math.pi / theta[2]))  # pair 2: theta = 1e4^(-1/4) = 0.1, 63 tokens
    positions = jnp.asarray([[5, 5 + wavelength, 5 + 7 * wavelength]])
    xs = jnp.broadcast_to(x, (1, 3, 1, 16))
    pair = [2, 10]  # "half" layout: channels 2 and 2 + 8
    rounded = np.asarray(apply_rope(xs, positions, resonance_below=math.inf))[0, :, 0][:, pair]
    plain = np.asarray(apply_rope(xs, positions))[0, :, 0][:, pair]  # [3, 2]
    np.testing.assert_allclose(rounded[1:], np.repeat(rounded[:1], 2, axis=0), atol=2e-5)
    assert np.abs(plain[1:] - plain[:1]).max() > 1e-3


def test_evaluation_may_scale_a_resonance_run_and_fills_the_training_length():
    tiny = load_config(f"{Path(__file__).resolve().parents[2] / 'configs' / 'base.py'}:tiny")
    trained = apply_overrides(tiny, ["encoding.name=resonance"])
    requested = apply_overrides(
        trained, ["encoding.hparams.scaling=yarn", "encoding.hparams.factor=4"]
    )
    assert evaluation_changes(trained, requested) == {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 4,
        "encoding.hparams.original_max_len": trained.train.seq_len,
    }
    changed = apply_overrides(trained, ["encoding.hparams.train_len=8"])
    with pytest.raises(ValueError, match="encoding.hparams.train_len"):
        evaluation_changes(trained, changed)  # the rounding is what was trained


def test_declarations():
    enc = encodings.get("resonance")
    assert enc.train_len is None and enc.relative and enc.hooks == ("rotate",)
    assert "train_len" not in enc.eval_safe_hparams and "scaling" in enc.eval_safe_hparams


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "64"])
def test_a_bad_training_length_is_one_line_naming_the_field(value):
    with pytest.raises(ValueError, match="encoding.hparams.train_len must be a positive") as e:
        encodings.get("resonance", train_len=value)
    assert "\n" not in str(e.value)
