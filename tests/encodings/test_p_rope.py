"""p-RoPE (Barbero et al. 2025, "Round and Round We Go!", Sec. 6) against a float64 transcription
of its definition (the fastest ``floor(p Dh / 2)`` pairs turn at ``base^(-2i/Dh)``, the others not
at all) on every attention path at 1x and 16x the tile size, causal and bidirectional, and in the
key/value cache's form; ``p = 1`` is RoPE and ``p = 0`` NoPE, bit for bit; it composes with
RoPE's scalings at evaluation; bad settings are one-line refusals."""

from __future__ import annotations

import math

import _rope_reference as ref
import _rotary_attention as rot
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims

DIMS = Dims(rot.H, rot.DH, rot.H * rot.DH)


def _theta(p: float, dh: int = rot.DH, base: float = 1e4) -> np.ndarray:
    """The paper's frequencies: ``g_i = base^(-2i/Dh)`` for the first ``floor(p Dh / 2)`` pairs
    of the whole head, 0 (no rotation) for the rest."""
    kept = math.floor(p * dh / 2)
    return np.array([base ** (-2.0 * i / dh) if i < kept else 0.0 for i in range(dh // 2)])


def _bound(name: str, **hparams):
    return encodings.get(name, **hparams).bind(DIMS)


# (length, causal): one tile and sixteen, causal; one tile bidirectional (the paper's encoders
# rotate the same way in both directions).
WINDOWS = [(rot.LENGTHS[0], True), (rot.LENGTHS[1], True), (rot.LENGTHS[0], False)]


# The interleaved layout (another pairing of the same formula) in the slow step.
CASES = [("half", 0.6, *w) for w in WINDOWS] + [
    pytest.param("interleaved", 0.25, *w, marks=pytest.mark.slow) for w in WINDOWS
]


@pytest.mark.parametrize("layout,p,length,causal", CASES)
def test_every_path_equals_the_papers_formula(layout, p, length, causal):
    enc = _bound("p_rope", p=p, layout=layout)
    q, k, v, q_pos, k_pos = rot.inputs(length)
    logits = rot.rotary_logits(q, k, rot.distances(q_pos, k_pos), _theta(p), layout)
    want = rot.naive(logits, v, causal)
    # The unrotated pairs matter: plain RoPE's frequencies give other outputs.
    plain = rot.naive(rot.rotary_logits(q, k, rot.distances(q_pos, k_pos), _theta(1.0)), v)
    assert np.abs(plain - rot.naive(logits, v)).max() > 1e-3
    for path, block in rot.PATHS:
        got = rot.run(enc, path, block, q, k, v, q_pos, k_pos, causal)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)


def test_the_cache_form_equals_the_papers_formula():
    """One query at its last filled slot of a preallocated cache, later slots invalid (NaN)."""
    enc = _bound("p_rope", p=0.5)
    filled, slots = 19, 24
    q, k, v, q_pos, k_pos, k_valid = rot.cache_inputs(filled, slots)
    logits = rot.rotary_logits(
        q, k[:, :filled], rot.distances(q_pos, k_pos[:, :filled]), _theta(0.5)
    )
    want = rot.naive(logits, v[:, :filled])
    for path in rot.CACHE_PATHS:
        got = rot.run_cache(enc, path, q, k, v, q_pos, k_pos, k_valid)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)


@pytest.mark.parametrize(
    "length", [rot.LENGTHS[1], pytest.param(rot.LENGTHS[0], marks=pytest.mark.slow)]
)
def test_p_one_is_rope_and_p_zero_is_nope_bit_for_bit(length):
    q, k, v, q_pos, k_pos = rot.inputs(length, seed=3)
    pairs = [(_bound("p_rope", p=1.0), _bound("rope")), (_bound("p_rope", p=0.0), _bound("nope"))]
    for variant, plain in pairs:
        for path, block in rot.PATHS:
            got = rot.run(variant, path, block, q, k, v, q_pos, k_pos)
            want = rot.run(plain, path, block, q, k, v, q_pos, k_pos)
            np.testing.assert_array_equal(got, want, err_msg=f"{variant.p} {path}")


def test_a_share_below_one_pair_is_nope_too():
    """p = 0.1 of 8 pairs keeps floor(0.8) = 0: nothing turns (RoPE's rotated_frequencies
    refuses that share; p_rope accepts it as NoPE)."""
    q, k, v, q_pos, k_pos = rot.inputs(rot.TILE)
    got = rot.run(_bound("p_rope", p=0.1), "einsum", 512, q, k, v, q_pos, k_pos)
    want = rot.run(_bound("nope"), "einsum", 512, q, k, v, q_pos, k_pos)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["linear", "yarn"])
def test_scaling_at_evaluation_composes(mode):
    """YaRN (or position interpolation) changes the frequencies of the rotating pairs; the
    unrotated stay unrotated; YaRN's temperature multiplies queries and keys."""
    p, s, train = 0.75, 4.0, 32
    enc = _bound("p_rope", p=p, scaling=mode, factor=s, original_max_len=train)
    q, k, v, q_pos, k_pos = rot.inputs(rot.LENGTHS[1])
    kept = math.floor(p * rot.DH / 2)
    if mode == "linear":
        theta = ref.thetas(rot.DH, 1e4) / s
    else:
        theta = ref.scaled_thetas(rot.DH, 1e4, "yarn", s, train)
    theta = np.where(np.arange(rot.DH // 2) < kept, theta, 0.0)
    scale = ref.yarn_sqrt_inv_t(s) ** 2 if mode == "yarn" else 1.0
    want = rot.naive(rot.rotary_logits(q, k, rot.distances(q_pos, k_pos), theta), v, scale=scale)
    for path, block in (("einsum", 512), ("blocked", rot.TILE)):
        got = rot.run(enc, path, block, q, k, v, q_pos, k_pos)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)


def test_declarations():
    enc = encodings.get("p_rope")
    assert enc.p == 0.75 and enc.relative and enc.hooks == ("rotate",)
    assert "p" not in enc.eval_safe_hparams  # the share is what was trained
    assert "scaling" in enc.eval_safe_hparams


@pytest.mark.parametrize(
    "hparams,message",
    [
        ({"p": 1.5}, r"encoding.hparams.p must be a number in \[0, 1\]"),
        ({"p": -0.1}, r"encoding.hparams.p must be a number in \[0, 1\]"),
        ({"p": "half"}, r"encoding.hparams.p must be a number in \[0, 1\]"),
        ({"rotated_frequencies": 0.5}, r"p_rope's share is encoding.hparams.p"),
        ({"fraction": 0.5}, r"encoding.hparams.fraction=0.5: p_rope takes"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(hparams, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get("p_rope", **hparams)
    assert "\n" not in str(error.value)
