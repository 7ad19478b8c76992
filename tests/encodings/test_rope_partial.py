"""Partial rotation in its two conventions: p-RoPE's ``rotated_frequencies`` (Barbero et al. 2025,
"Round and Round We Go!", Sec. 6: the frequencies of the whole head, the lowest left unrotated)
against a float64 transcription of the paper's formula, and apart from GPT-NeoX's ``fraction``
(frequencies recomputed over the rotated channels); setting both is refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, apply_rope

_rope = jax.jit(apply_rope, static_argnames=("base", "layout", "fraction", "rotated_frequencies"))


def _p_rope(x: np.ndarray, positions: np.ndarray, base: float, layout: str, p: float):
    """p-RoPE in float64, as the paper writes it: pair ``i`` of the ``Dh/2`` pairs of a head
    turns by ``m * g_i`` with ``g_i = base^(-2i/Dh)`` for ``i < floor(p * Dh / 2)`` and
    ``g_i = 0`` (no rotation) for the others. ``x: [B, T, H, Dh]``, ``positions: [B, T]``."""
    x = np.asarray(x, np.float64)
    dh = x.shape[-1]
    kept = int(np.floor(p * dh / 2))
    out = x.copy()
    for bb in range(x.shape[0]):
        for tt in range(x.shape[1]):
            m = float(positions[bb, tt])
            for i in range(dh // 2):
                g = base ** (-2.0 * i / dh) if i < kept else 0.0
                c, s = np.cos(m * g), np.sin(m * g)
                a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + dh // 2)
                xa, xb = x[bb, tt, :, a], x[bb, tt, :, b]
                out[bb, tt, :, a] = c * xa - s * xb
                out[bb, tt, :, b] = s * xa + c * xb
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("p,kept", [(0.25, 2), (0.5, 4), (0.6, 4), (0.75, 6)])
def test_p_rope_equals_the_papers_formula(layout, p, kept):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 16)).astype(np.float32)
    positions = np.stack([np.arange(5), np.arange(5) * 7 + 40])  # [2, 5], up to 68
    got = _rope(jnp.asarray(x), jnp.asarray(positions), layout=layout, rotated_frequencies=p)
    want = _p_rope(x, positions, 1e4, layout, p)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=2e-5)
    # The unrotated pairs are the input's channels exactly, whatever the position.
    pairs = np.arange(kept, 8)
    channels = (
        np.concatenate([pairs, pairs + 8])
        if layout == "half"
        else np.stack([2 * pairs, 2 * pairs + 1]).ravel()
    )
    np.testing.assert_array_equal(np.asarray(got)[..., channels], x[..., channels])


def test_p_equal_to_one_is_plain_rope_bit_for_bit():
    x = jax.random.normal(jax.random.key(1), (1, 6, 2, 16))
    positions = jnp.arange(6)[None]
    plain = _rope(x, positions)
    np.testing.assert_array_equal(_rope(x, positions, rotated_frequencies=1.0), plain)


def test_the_two_conventions_rotate_different_frequencies():
    """The same share of channels rotates in both, at different speeds: ``fraction=0.5`` rotates
    channels 0..7 of 16 at base^(-2i/8); ``rotated_frequencies=0.5`` rotates pairs 0..3 of the
    "half" layout (channels 0..3 and 8..11) at base^(-2i/16)."""
    x = np.zeros((1, 2, 1, 16), np.float32)
    x[..., 3] = 1.0  # pair 3: (3, 7) under fraction=0.5 (d = 8), (3, 11) under p-RoPE
    positions = np.array([[0, 1]])
    neox = np.asarray(_rope(jnp.asarray(x), jnp.asarray(positions), fraction=0.5))
    p_rope = np.asarray(_rope(jnp.asarray(x), jnp.asarray(positions), rotated_frequencies=0.5))
    np.testing.assert_allclose(neox[0, 1, 0, 7], np.sin(1e4 ** (-6 / 8)), rtol=1e-5)
    np.testing.assert_allclose(p_rope[0, 1, 0, 11], np.sin(1e4 ** (-6 / 16)), rtol=1e-5)
    assert neox[0, 1, 0, 11] == 0.0 and p_rope[0, 1, 0, 7] == 0.0


def test_the_encoder_passes_it_and_logits_stay_relative():
    enc = encodings.get("rope", rotated_frequencies=0.5).bind(Dims(2, 16, 32))
    q = jax.random.normal(jax.random.key(2), (1, 1, 2, 16))
    k = jax.random.normal(jax.random.key(3), (1, 1, 2, 16))

    def logit(m: int, n: int) -> np.ndarray:
        qr, kr = enc.rotate({}, q, k, jnp.array([[m]]), jnp.array([[n]]))
        return np.asarray(jnp.einsum("bthd,bshd->bh", qr, kr))

    np.testing.assert_allclose(logit(3, 10), logit(50, 57), rtol=1e-4, atol=1e-5)
    assert not np.allclose(logit(3, 10), logit(3, 11))
    # Unset, the call is the one RoPE always made (no new keyword).
    assert "rotated_frequencies" not in encodings.get("rope").rope_kwargs(jnp.arange(4)[None])


def test_xpos_takes_it_too():
    enc = encodings.get("xpos", rotated_frequencies=0.5).bind(Dims(2, 16, 32))
    q = jnp.ones((1, 4, 2, 16))
    qr, kr = enc.rotate({}, q, q, jnp.arange(4)[None], jnp.arange(4)[None])
    assert qr.shape == kr.shape == q.shape and bool(jnp.isfinite(qr).all())


@pytest.mark.parametrize(
    "hparams,message",
    [
        ({"fraction": 0.5, "rotated_frequencies": 0.5}, "two conventions of partial rotation"),
        ({"rotated_frequencies": 0.0}, r"rotated_frequencies must be a number in \(0, 1\]"),
        ({"rotated_frequencies": 1.5}, r"rotated_frequencies must be a number in \(0, 1\]"),
        ({"rotated_frequencies": True}, r"rotated_frequencies must be a number in \(0, 1\]"),
    ],
)
def test_bad_settings_are_refused_in_one_line(hparams, message):
    with pytest.raises(ValueError, match=message) as error:
        encodings.get("rope", **hparams)
    assert "\n" not in str(error.value)


def test_a_share_that_rotates_no_pair_is_refused():
    with pytest.raises(ValueError, match="rotates no pair of a head of 8 channels"):
        encodings.get("rope", rotated_frequencies=0.2).bind(Dims(1, 8, 8))
    with pytest.raises(ValueError, match="two conventions"):
        apply_rope(jnp.zeros((1, 2, 1, 8)), jnp.arange(2), fraction=0.5, rotated_frequencies=0.5)
