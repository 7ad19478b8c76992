"""Learned absolute positions: a table lookup that refuses to read past its last row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.encodings import Dims

DIMS = Dims(num_heads=2, head_dim=8, model_dim=16)


def test_embed_is_a_row_lookup_and_nan_beyond_the_table():
    enc = encodings.get("learned", max_len=10).bind(DIMS)
    assert enc.hooks == ("embed",) and enc.param_scope == "shared"
    params = enc.init(jax.random.key(0), DIMS)
    table = np.asarray(params["table"])
    assert table.shape == (10, 16) and table.dtype == np.float32
    positions = np.array([[0, 3, 9], [2, 2, 5]])
    got = np.asarray(enc.embed(params, jnp.asarray(positions)))
    np.testing.assert_array_equal(got, table[positions])
    beyond = np.asarray(enc.embed(params, jnp.asarray([[8, 9, 10]])))
    assert np.isfinite(beyond[0, :2]).all() and np.isnan(beyond[0, 2]).all()


def test_check_length_refuses_lengths_past_max_len():
    enc = encodings.get("learned", max_len=16)
    enc.check_length(16)
    with pytest.raises(ValueError, match="max_len=16"):
        enc.check_length(17)


@pytest.mark.parametrize("bad", [0, -3, 2.0])
def test_bad_max_len_is_rejected(bad):
    with pytest.raises(ValueError, match="encoding.hparams.max_len"):
        encodings.get("learned", max_len=bad)


def test_negative_positions_are_outside_the_table_too():
    # jnp.take wraps negative indices NumPy-style before mode="fill" applies, so position -1
    # would silently read the last row; it must embed as NaN like any position off the table.
    enc = encodings.get("learned", max_len=4).bind(DIMS)
    params = enc.init(jax.random.key(1), DIMS)
    got = np.asarray(enc.embed(params, jnp.asarray([[-4, -1, 0, 3]])))
    assert np.isnan(got[0, :2]).all()
    np.testing.assert_array_equal(got[0, 2:], np.asarray(params["table"])[[0, 3]])
