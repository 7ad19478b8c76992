"""STRING (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?"), RoPE's
option at evaluation: the paper's position matrix (distances ``d >= S`` become ``d - S + W``)
transcribed in float64 and compared on every attention path at 1x and 16x the tile size, in the
cache's form and through greedy decoding; with the threshold past every distance it is RoPE bit
for bit; it composes with RoPE's scalings, p-RoPE and Resonance; RoPE with STRING passes the
contract battery; refusals are one line. ``posenc eval`` on a trained run and on an imported
Llama: tests/test_string_eval.py."""

from __future__ import annotations

import math

import _rope_reference as ref
import _rotary_attention as rot
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings, testing
from posenc.decoding.lm import greedy_generate, greedy_generate_reference
from posenc.encodings import Dims
from posenc.report.runs import describe_changes
from posenc.testing import _harness

DIMS = Dims(rot.H, rot.DH, rot.H * rot.DH)


def string_positions(q_pos, k_pos, shift: int, window: int) -> np.ndarray:
    """The paper's position matrix, ``[B, T, S]``: ``P[i, j] = i - j`` for ``i - j < S`` and
    ``i - j - S + W`` for ``i - j >= S`` (the far distances moved onto well-trained ones)."""
    d = np.asarray(q_pos)[:, :, None] - np.asarray(k_pos)[:, None, :]
    return np.where(d >= shift, d - shift + window, d)


def _bound(name: str = "rope", **hparams):
    return encodings.get(name, **hparams).bind(DIMS)


def test_the_position_matrix_worked_by_hand():
    """S = 3, W = 1 over six tokens: distances 3, 4, 5 become 1, 2, 3."""
    got = string_positions(np.arange(6)[None], np.arange(6)[None], 3, 1)[0]
    want = np.array(
        [
            [0, -1, -2, -3, -4, -5],
            [1, 0, -1, -2, -3, -4],
            [2, 1, 0, -1, -2, -3],
            [1, 2, 1, 0, -1, -2],
            [2, 1, 2, 1, 0, -1],
            [3, 2, 1, 2, 1, 0],
        ]
    )
    np.testing.assert_array_equal(got, want)


# (length, S, W): one tile with the shift inside it, sixteen tiles with S about a third.
WINDOWS = [(rot.LENGTHS[0], 4, 1), (rot.LENGTHS[1], 40, 8)]


@pytest.mark.parametrize("length,shift,window", WINDOWS)
def test_every_path_equals_the_papers_attention(length, shift, window):
    enc = _bound(string_shift=shift, string_window=window)
    assert enc.hooks == ("rotate", "content_logits")
    q, k, v, q_pos, k_pos = rot.inputs(length)
    theta = ref.thetas(rot.DH, 1e4)
    want = rot.naive(
        rot.rotary_logits(q, k, string_positions(q_pos, k_pos, shift, window), theta), v
    )
    plain = rot.naive(rot.rotary_logits(q, k, rot.distances(q_pos, k_pos), theta), v)
    for path, block in rot.PATHS:
        got = rot.run(enc, path, block, q, k, v, q_pos, k_pos)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)
    # Queries nearer than S to every key (the first S - EXTRA_KEYS) are RoPE's; later ones not.
    near = shift - rot.EXTRA_KEYS
    np.testing.assert_allclose(want[:, :near], plain[:, :near], rtol=1e-12, atol=1e-12)
    assert np.abs(want[:, near + 1 :] - plain[:, near + 1 :]).max() > 1e-3


def test_the_cache_form_equals_the_papers_attention():
    enc = _bound(string_shift=9, string_window=2)
    filled, slots = 21, 24
    q, k, v, q_pos, k_pos, k_valid = rot.cache_inputs(filled, slots)
    positions = string_positions(q_pos, k_pos[:, :filled], 9, 2)
    logits = rot.rotary_logits(q, k[:, :filled], positions, ref.thetas(rot.DH, 1e4))
    want = rot.naive(logits, v[:, :filled])
    for path in rot.CACHE_PATHS:
        got = rot.run_cache(enc, path, q, k, v, q_pos, k_pos, k_valid)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)


def test_a_threshold_past_every_distance_is_rope_bit_for_bit():
    q, k, v, q_pos, k_pos = rot.inputs(rot.LENGTHS[1], seed=6)
    far, rope = _bound(string_shift=10**6, string_window=3), _bound()
    for path, block in rot.PATHS:
        got = rot.run(far, path, block, q, k, v, q_pos, k_pos)
        want = rot.run(rope, path, block, q, k, v, q_pos, k_pos)
        np.testing.assert_array_equal(got, want, err_msg=path)


def _scaled(mode, s, train):
    if mode == "linear":
        return ref.thetas(rot.DH, 1e4) / s
    return ref.scaled_thetas(rot.DH, 1e4, mode, s, train)


COMPOSED = [
    ("rope", dict(scaling="yarn", factor=4.0, original_max_len=32)),
    ("rope", dict(scaling="linear", factor=4.0)),
    ("p_rope", dict(p=0.5)),
    ("resonance", {}),
]


@pytest.mark.parametrize("name,hparams", COMPOSED, ids=["yarn", "linear", "p_rope", "resonance"])
def test_it_composes_with_the_other_rope_options(name, hparams):
    """The shifted distance turns with the frequencies RoPE turned with (scaled, p-RoPE's with
    the slow pairs at 0, Resonance's rounded); YaRN's temperature stays on both."""
    shift, window = 40, 8
    enc = _bound(name, string_shift=shift, string_window=window, **hparams)
    q, k, v, q_pos, k_pos = rot.inputs(rot.LENGTHS[1], seed=7)
    theta, scale = ref.thetas(rot.DH, 1e4), 1.0
    if "scaling" in hparams:
        theta = _scaled(hparams["scaling"], 4.0, 32)
        scale = ref.yarn_sqrt_inv_t(4.0) ** 2 if hparams["scaling"] == "yarn" else 1.0
    if name == "p_rope":
        theta = np.where(np.arange(rot.DH // 2) < 4, theta, 0.0)
    if name == "resonance":
        theta = 2 * math.pi / np.round(2 * math.pi / theta)
    positions = string_positions(q_pos, k_pos, shift, window)
    want = rot.naive(rot.rotary_logits(q, k, positions, theta), v, scale=scale)
    for path, block in (("einsum", 512), ("blocked", rot.TILE)):
        got = rot.run(enc, path, block, q, k, v, q_pos, k_pos)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4, err_msg=path)


@pytest.mark.slow  # about 10 s of CPU: two models' generation and the full recomputation
def test_greedy_decoding_with_the_cache_equals_full_recomputation():
    """A prompt longer than S: the cached steps see shifted distances as a full pass does."""
    settings = testing.Settings()
    enc = encodings.get("rope", string_shift=4, string_window=1)
    model = _harness.build(enc, settings)
    prompts = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 7)), jnp.int32)
    tokens, logits = greedy_generate(model, prompts, 5, return_logits=True)
    want_tokens, want = greedy_generate_reference(model, prompts, 5, return_logits=True)
    np.testing.assert_array_equal(tokens, want_tokens)
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    # STRING is at work: plain RoPE with the same parameters gives other logits.
    plain = _harness.build(encodings.get("rope"), settings)
    _, rope_logits = greedy_generate(plain, prompts, 5, return_logits=True)
    assert np.abs(np.asarray(rope_logits) - np.asarray(logits)).max() > 1e-4


# The contract battery on RoPE with STRING on (a shift inside its 12-token windows): the paths
# agree (offsets, randomized positions, tiles), it is relative, it refuses bidirectional
# attention in one line; the rest in the slow step.
SLOW_CHECKS = ("causal", "bf16", "trains", "extrapolates", "patterns")
BATTERY = ["paths_agree", "shift", "bidirectional"] + [
    pytest.param(c, marks=pytest.mark.slow) for c in SLOW_CHECKS
]


@pytest.mark.parametrize("check", BATTERY)
def test_rope_with_string_keeps_the_contract(check):
    testing.CHECKS[check](encodings.get("rope", string_shift=5, string_window=2))


def test_the_evaluation_column_names_the_change():
    rope = encodings.get_class("rope")
    assert rope.describe_eval({"string_shift": 40, "string_window": 8}, 128) == "string S=40 W=8"
    assert rope.describe_eval({"string_shift": 40}, 128) == "string S=40 W=128"
    changes = {
        "encoding.hparams.scaling": "yarn",
        "encoding.hparams.factor": 2.0,
        "encoding.hparams.original_max_len": 128,
        "encoding.hparams.string_shift": 40,
        "encoding.hparams.string_window": 8,
    }
    assert describe_changes("rope", changes, 128) == "yarn x2, string S=40 W=8"
    assert set(rope.eval_safe_hparams) >= {"string_shift", "string_window"}
    assert encodings.get("rope").hooks == ("rotate",)  # off by default: plain RoPE's paths


@pytest.mark.parametrize(
    "name,hparams,message",
    [
        ("rope", {"string_window": 8}, "string_window=8 has no effect without"),
        ("rope", {"string_shift": 0}, "string_shift must be a positive integer"),
        ("rope", {"string_shift": 2.5}, "string_shift must be a positive integer"),
        ("rope", {"string_shift": 8, "string_window": 8}, r"string_window must be an integer in"),
        ("rope", {"string_shift": 8, "string_window": -1}, r"string_window must be an integer in"),
        (
            "rope",
            {"string_shift": 200, "scaling": "dynamic", "factor": 2.0, "original_max_len": 16},
            "depend on the whole window",
        ),
        ("xpos", {"string_shift": 8, "string_window": 2}, "replaces with its own"),
    ],
)
def test_bad_settings_are_one_line_naming_the_field(name, hparams, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get(name, **hparams)
    assert "\n" not in str(error.value) and "encoding.hparams." in str(error.value)
