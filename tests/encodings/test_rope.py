"""RoPE (Su et al. 2021, Sec. 3.4) against the written-out 2x2 rotation of channel pairs, and its
defining property: rotated logits q_m . k_n depend on positions only through n - m."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, apply_rope

BASES = [1e4, 5e5, 1e6]
LAYOUTS = ["interleaved", "half"]

_rope = jax.jit(apply_rope, static_argnames=("base", "layout", "fraction"))


def _naive_rope(x: np.ndarray, positions: np.ndarray, base: float, layout: str, d: int):
    """Rotates pair i of the first d channels by m * theta_i, theta_i = base^(-2i/d), float64.

    Pairs are (2i, 2i+1) for "interleaved" (the paper) and (i, i + d/2) for "half" (NeoX).
    x: [B, T, H, Dh], positions: [B, T].
    """
    x = np.asarray(x, np.float64)
    out = x.copy()
    b, t = x.shape[:2]
    for bb in range(b):
        for tt in range(t):
            m = float(positions[bb, tt])
            for i in range(d // 2):
                angle = m * base ** (-2.0 * i / d)
                c, s = np.cos(angle), np.sin(angle)
                a_idx, b_idx = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)
                xa, xb = x[bb, tt, :, a_idx], x[bb, tt, :, b_idx]
                out[bb, tt, :, a_idx] = c * xa - s * xb
                out[bb, tt, :, b_idx] = s * xa + c * xb
    return out


def _x(seed, shape=(2, 5, 3, 16)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("base", BASES)
def test_matches_written_out_rotation(layout, base):
    x = _x(0)
    positions = np.array([[0, 1, 2, 3, 4], [7, 100, 999, 3, 12]])  # [B, T], per-row
    got = _rope(jnp.asarray(x), jnp.asarray(positions), base=base, layout=layout)
    expected = _naive_rope(x, positions, base, layout, d=16)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


def test_layouts_differ():
    # The two layouts pair different channels, so (for the same x) they must give different
    # results; guards against one layout silently aliasing the other.
    x, pos = jnp.asarray(_x(1)), jnp.arange(5)
    a = np.asarray(_rope(x, pos, base=1e4, layout="interleaved"))
    b = np.asarray(_rope(x, pos, base=1e4, layout="half"))
    assert np.abs(a - b).max() > 0.1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fraction,rotated", [(0.5, 8), (0.3, 4), (0.25, 4)])
def test_partial_rotation_leaves_the_tail_untouched(layout, fraction, rotated):
    # 2 * floor(fraction * 16 / 2) channels rotate, with theta_i = base^(-2i/rotated).
    x = _x(2)
    positions = np.array([[3, 4, 5, 6, 7], [50, 51, 52, 53, 54]])
    got = np.asarray(
        _rope(jnp.asarray(x), jnp.asarray(positions), base=1e4, layout=layout, fraction=fraction)
    )
    np.testing.assert_array_equal(got[..., rotated:], x[..., rotated:])
    expected = _naive_rope(x[..., :rotated], positions, 1e4, layout, d=rotated)
    np.testing.assert_allclose(got[..., :rotated], expected, rtol=1e-4, atol=1e-4)
    assert np.abs(got[..., :rotated] - x[..., :rotated]).max() > 0.1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("base", BASES)
def test_logits_depend_only_on_relative_position(layout, base):
    r = np.random.default_rng(3)
    q = r.standard_normal((1, 1, 2, 16)).astype(np.float32)
    k = r.standard_normal((1, 1, 2, 16)).astype(np.float32)
    m = np.arange(12)

    def logits(q_positions, k_positions):
        # Every query m and key n share the same content vector; only positions differ.
        rq = _rope(
            jnp.asarray(np.repeat(q, 12, 1)), jnp.asarray(q_positions), base=base, layout=layout
        )
        rk = _rope(
            jnp.asarray(np.repeat(k, 12, 1)), jnp.asarray(k_positions), base=base, layout=layout
        )
        return np.einsum("bthd,bshd->bhts", np.asarray(rq, np.float64), np.asarray(rk))

    ref = logits(m, m)  # [1, H, 12, 12], entry (m, n)
    for offset in r.integers(1, 2000, size=3):
        np.testing.assert_allclose(logits(m + offset, m + offset), ref, rtol=2e-3, atol=2e-3)
    # Along every diagonal n - m = const the logit is the same...
    for delta in range(-11, 12):
        diag = np.stack([np.diagonal(ref[0, h], offset=delta) for h in range(2)])
        np.testing.assert_allclose(diag, diag[:, :1].repeat(diag.shape[1], 1), atol=1e-4)
    # ...and it does change with n - m (otherwise the test above proves nothing).
    assert np.ptp(np.stack([ref[0, :, 0, n] for n in range(12)])) > 1e-2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_preserves_norms(layout):
    x = _x(4)
    positions = np.array([[0, 1, 2, 3, 4], [10, 1000, 20000, 5, 6]])
    got = np.asarray(_rope(jnp.asarray(x), jnp.asarray(positions), base=5e5, layout=layout))
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_position_zero_is_identity_and_positions_may_be_1d_or_2d():
    x = _x(5)
    np.testing.assert_allclose(
        np.asarray(_rope(jnp.asarray(x), jnp.zeros(5, jnp.int32))), x, rtol=0, atol=1e-7
    )
    pos = np.arange(5) + 9
    a = np.asarray(_rope(jnp.asarray(x), jnp.asarray(pos)))
    b = np.asarray(_rope(jnp.asarray(x), jnp.asarray(np.stack([pos, pos]))))
    np.testing.assert_array_equal(a, b)


def test_bf16_input_keeps_dtype_and_is_close():
    x = _x(6)
    pos = jnp.arange(5) + 3000
    out = _rope(jnp.asarray(x, jnp.bfloat16), pos, base=1e4, layout="half")
    assert out.dtype == jnp.bfloat16
    expected = _naive_rope(
        np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32),
        np.stack([np.asarray(pos)] * 2),
        1e4,
        "half",
        d=16,
    )
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=2e-2, atol=2e-2)


def test_encoder_rotate_hook_uses_its_hyperparameters():
    enc = encodings.get("rope", base=5e5, layout="interleaved", fraction=0.5)
    enc = enc.bind(Dims(num_heads=3, head_dim=16, model_dim=48))
    assert enc.hooks == ("rotate",)
    q, k = _x(7), _x(8, (2, 6, 3, 16))
    q_pos, k_pos = np.array([[1, 2, 3, 4, 5]]), np.array([[0, 1, 2, 3, 4, 5]])
    rq, rk = enc.rotate({}, jnp.asarray(q), jnp.asarray(k), jnp.asarray(q_pos), jnp.asarray(k_pos))
    q_pos2, k_pos2 = np.repeat(q_pos, 2, 0), np.repeat(k_pos, 2, 0)
    np.testing.assert_allclose(
        np.asarray(rq[..., :8]), _naive_rope(q[..., :8], q_pos2, 5e5, "interleaved", 8), atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(rk[..., :8]), _naive_rope(k[..., :8], k_pos2, 5e5, "interleaved", 8), atol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(rq[..., 8:]), q[..., 8:])


def test_odd_head_dimension_is_rejected():
    with pytest.raises(ValueError, match="head dimension of 9"):
        encodings.get("rope").bind(Dims(num_heads=2, head_dim=9, model_dim=18))
    # fraction < 1 rotates 2 * floor(0.5 * 9 / 2) = 4 of the 9 channels, which is allowed.
    encodings.get("rope", fraction=0.5).bind(Dims(num_heads=2, head_dim=9, model_dim=18))


@pytest.mark.parametrize(
    "hparams,field",
    [
        ({"layout": "rotate_half"}, "encoding.(hparams.)?layout"),
        ({"fraction": 0.0}, "encoding.(hparams.)?fraction"),
        ({"fraction": 1.5}, "encoding.(hparams.)?fraction"),
        ({"base": -1.0}, "encoding.(hparams.)?base"),
        ({"base": 0}, "encoding.(hparams.)?base"),
    ],
)
def test_bad_hyperparameters_are_rejected(hparams, field):
    with pytest.raises(ValueError, match=field):
        encodings.get("rope", **hparams)


def test_bad_layout_in_apply_rope_and_too_few_rotated_channels():
    with pytest.raises(ValueError, match="encoding.(hparams.)?layout"):
        apply_rope(jnp.zeros((1, 2, 1, 8)), jnp.arange(2), layout="neox")
    with pytest.raises(ValueError, match="fraction"):
        apply_rope(jnp.zeros((1, 2, 1, 8)), jnp.arange(2), fraction=0.2)  # rotates 0 channels
    with pytest.raises(ValueError, match="fraction"):
        encodings.get("rope", fraction=0.1).bind(Dims(num_heads=1, head_dim=8, model_dim=8))
