"""Sinusoidal table against Vaswani et al. (2017), Sec. 3.5, computed in float64 numpy:
PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims, sinusoidal_table

_table = jax.jit(sinusoidal_table, static_argnames=("dim", "base"))


def _paper(positions: np.ndarray, dim: int, base: float) -> np.ndarray:
    out = np.zeros((*positions.shape, dim), np.float64)
    for i in range(dim // 2):
        angle = positions.astype(np.float64) / base ** (2.0 * i / dim)
        out[..., 2 * i] = np.sin(angle)
        out[..., 2 * i + 1] = np.cos(angle)
    return out


@pytest.mark.parametrize("dim,base", [(32, 1e4), (16, 1e4), (32, 500.0), (2, 1e4)])
def test_table_matches_paper(dim, base):
    positions = np.arange(64)
    got = np.asarray(_table(jnp.asarray(positions), dim=dim, base=base))
    assert got.dtype == np.float32 and got.shape == (64, dim)
    np.testing.assert_allclose(got, _paper(positions, dim, base), rtol=0, atol=2e-5)


def test_large_positions_accurate_to_float32_precision():
    # Angles come from float32 integer positions; the only error left is float32 rounding of the
    # angle pos * theta_i, at most a few ulp(pos) = pos * 2^-23. (A bf16 position would already
    # be 64 positions off at 30000.)
    positions = np.array([0, 1, 4095, 4097, 16385, 30000, 30001, 32767])
    got = np.asarray(_table(jnp.asarray(positions), dim=64, base=1e4))
    err = np.abs(got - _paper(positions, 64, 1e4)).max(axis=-1)
    bound = 2 * np.finfo(np.float32).eps * np.maximum(positions, 1)
    assert (err <= bound).all(), (err, bound)
    # Neighbouring large positions remain distinguishable in the fastest channel.
    assert np.abs(got[5] - got[6]).max() > 0.5


def test_batched_positions_keep_their_shape():
    positions = np.array([[0, 1, 2], [100, 101, 102]])
    got = np.asarray(_table(jnp.asarray(positions), dim=8, base=1e4))
    assert got.shape == (2, 3, 8)
    np.testing.assert_allclose(got, _paper(positions, 8, 1e4), atol=2e-5)


def test_encoder_embed_hook_is_the_table_at_model_dim():
    enc = encodings.get("sinusoidal", base=1e4).bind(Dims(num_heads=2, head_dim=8, model_dim=16))
    assert enc.hooks == ("embed",) and enc.param_scope == "shared"
    assert enc.init(jax.random.key(0), enc.bound_dims) == {}
    positions = np.array([[5, 6, 7, 8]])
    got = np.asarray(enc.embed({}, jnp.asarray(positions)))
    np.testing.assert_allclose(got, _paper(positions, 16, 1e4), atol=2e-5)


def test_odd_dims_are_rejected():
    with pytest.raises(ValueError, match="even dim"):
        sinusoidal_table(jnp.arange(3), 7)
    with pytest.raises(ValueError, match="model_dim"):
        encodings.get("sinusoidal").bind(Dims(num_heads=1, head_dim=15, model_dim=15))
    with pytest.raises(ValueError, match="encoding.(hparams.)?base"):
        encodings.get("sinusoidal", base=0.0)
