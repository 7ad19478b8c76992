"""Llama 3.1's and LongRoPE's RoPE scalings (``scaling="llama3"``, ``"longrope"``) against
float64 transcriptions of their formulas and against the frequencies transformers computes
(stored with the golden checkpoints of tests/hf/make_golden.py)."""

from __future__ import annotations

import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, apply_rope
from posenc.encodings.rope import attention_scale, rope_frequencies

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hf", "golden")


def llama3_reference(d, base, factor, L, low, high):
    """Meta's ``apply_scaling`` (llama3 reference_impl), in float64."""
    out = []
    for i in range(d // 2):
        freq = base ** (-2 * i / d)
        wavelen = 2 * math.pi / freq
        if wavelen < L / high:
            out.append(freq)
        elif wavelen > L / low:
            out.append(freq / factor)
        else:
            smooth = (L / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return np.array(out)


@pytest.mark.parametrize("d,base,factor,L", [(16, 500.0, 8.0, 32), (64, 10000.0, 8.0, 512)])
def test_llama3_frequencies_follow_meta_formula(d, base, factor, L):
    got = rope_frequencies(d, base=base, scaling="llama3", factor=factor, original_max_len=L)
    want = llama3_reference(d, base, factor, L, 1.0, 4.0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-6)
    # All three bands occur (the test would not see a wrong blend otherwise).
    theta = base ** (-np.arange(0, d, 2) / d)
    ratio = want / theta
    assert (ratio == 1).any() and np.isclose(ratio, 1 / factor).any()
    assert ((ratio > 1 / factor + 1e-6) & (ratio < 1 - 1e-6)).any()


def test_llama3_and_longrope_match_transformers_frequencies():
    g = np.load(os.path.join(GOLDEN, "llama_llama3", "golden.npz"))
    got = rope_frequencies(16, base=500.0, scaling="llama3", factor=8.0, original_max_len=32)
    np.testing.assert_allclose(np.asarray(got), g["inv_freq"], rtol=1e-6)
    g = np.load(os.path.join(GOLDEN, "llama_longrope", "golden.npz"))
    short, long = (1.0, 1.1, 1.3, 1.7), (1.0, 1.5, 3.0, 6.0)
    kw = dict(scaling="longrope", original_max_len=32, short_factor=short, long_factor=long)
    got = rope_frequencies(8, seq_len=32, **kw)  # transformers' initial (short) frequencies
    np.testing.assert_allclose(np.asarray(got)[0, 0], g["inv_freq"], rtol=1e-6)
    scale = attention_scale("longrope", 2.0, None, 32)
    np.testing.assert_allclose(scale, g["attention_scaling"], rtol=1e-6)


def test_longrope_picks_factors_by_the_keys_span_and_scales_attention():
    short, long = (1.0, 2.0), (3.0, 5.0)
    kw = dict(scaling="longrope", original_max_len=8, factor=4.0, short_factor=short)
    theta = 10000.0 ** (-np.arange(0, 4, 2) / 4)
    lengths = jnp.array([8, 9])  # one row within the training length, one beyond
    got = np.asarray(rope_frequencies(4, seq_len=lengths, long_factor=long, **kw))
    np.testing.assert_allclose(got[0, 0], theta / np.array(short), rtol=1e-6)
    np.testing.assert_allclose(got[1, 0], theta / np.array(long), rtol=1e-6)
    # sqrt(1 + ln s / ln L) multiplies queries and keys: the rotation's norm grows by it.
    x = np.random.default_rng(0).standard_normal((1, 12, 1, 4)).astype(np.float32)
    y = apply_rope(jnp.asarray(x), jnp.arange(12), long_factor=long, **kw)
    factor = math.sqrt(1 + math.log(4.0) / math.log(8))
    np.testing.assert_allclose(
        np.linalg.norm(np.asarray(y), axis=-1), factor * np.linalg.norm(x, axis=-1), rtol=1e-5
    )


def test_llama3_is_cacheable_and_longrope_is_not():
    llama3 = encodings.get("rope", scaling="llama3", factor=8.0, original_max_len=16)
    llama3.check_cacheable()
    longrope = encodings.get(
        "rope", scaling="longrope", original_max_len=16, short_factor=(1.0,), long_factor=(2.0,)
    )
    with pytest.raises(ValueError, match="key/value cache"):
        longrope.check_cacheable()


@pytest.mark.parametrize(
    "hparams,match",
    [
        (dict(scaling="longrope", original_max_len=16), "short_factor"),
        (
            dict(scaling="longrope", original_max_len=16, short_factor=(1.0,), long_factor=(1, 2)),
            "equally long",
        ),
        (dict(scaling="llama3", factor=8.0), "original_max_len"),
        (dict(scaling="llama3", original_max_len=8, low_freq_factor=4.0), "high_freq_factor"),
        (dict(short_factor=(1.0,)), "no effect without encoding.(hparams.)?scaling"),
    ],
)
def test_bad_band_hyperparameters_are_refused_in_one_line(hparams, match):
    with pytest.raises(ValueError, match=match):
        encodings.get("rope", **hparams)


def test_longrope_needs_one_factor_per_rotated_pair():
    rope = encodings.get(
        "rope", scaling="longrope", original_max_len=16, short_factor=(1.0,), long_factor=(2.0,)
    )
    with pytest.raises(ValueError, match="one factor per rotated pair: 4"):
        rope.bind(Dims(num_heads=2, head_dim=8, model_dim=16))
