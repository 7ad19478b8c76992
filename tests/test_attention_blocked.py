"""The blocked path's cheaper tiles (posenc.attention.blocked) against the einsum reference,
forward and gradients: per-distance tables (``bias_by_distance``), probed tiles past the
``reach``, contextual tiles past the ``carry_limit``, causal and bidirectional, at offsets, with
invalid keys, with randomized positions; and the per-distance table laid out per tile against
the encoder's bias of every pair."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc import encodings
from posenc.attention.core import attend
from posenc.attention.terms import bias_from_table, distance_table
from posenc.encodings import Dims

DIMS = Dims(num_heads=2, head_dim=8, model_dim=16)
# Small enough hyperparameters that a window of 26 keys has tiles past the reach, and CoPE's
# counts reach their clip (max_pos - 1 = 1) after a few keys.
HPARAMS = {
    "t5": {"num_buckets": 8, "max_distance": 6},
    "shaw": {"max_distance": 3},
    "cope": {"max_pos": 2, "init_std": 0.5},
}
T, S, BLOCK = 21, 26, 4

# The default optimisation level: at LLVM -O0, XLA:CPU returns NaN gradients through the blocked
# path's lax.cond for some encoders (T5 here, on main too; posenc.testing._harness's
# finite_or_recompiled says more).
_jit = jax.jit


def _declaring():
    for name in encodings.names():
        enc = encodings.get(name, **HPARAMS.get(name, {}))
        if enc.bias_by_distance or enc.reach is not None or enc.carry_limit is not None:
            yield name


def test_the_declaring_encoders_are_the_founding_distance_ones():
    names = set(_declaring())
    assert {"alibi", "t5", "kerple_log", "kerple_power", "dynamic_bias", "shaw", "cope"} <= names


def _loss(impl, causal, enc):
    """A random linear functional of ``attend``'s output, differentiable in everything."""
    weight = jnp.asarray(np.random.default_rng(1).standard_normal((2, T, 2, 8)), jnp.float32)

    def loss(q, k, v, params, q_pos, k_pos, k_valid):
        out = attend(
            q,
            k,
            v,
            encoding=enc,
            params=params,
            q_pos=q_pos,
            k_pos=k_pos,
            causal=causal,
            implementation=impl,
            block_size=BLOCK,
            k_valid=k_valid,
        )
        return jnp.sum(out * weight)

    return _jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


# Compiling the gradients of both paths, both ways, with and without padding: about 20 s per
# encoder on two cores, so the slow step; the default suite compares the forward paths in the
# battery (paths_agree, bidirectional) and the tables below.
@pytest.mark.slow
@pytest.mark.parametrize("name", list(_declaring()))
def test_blocked_equals_einsum_forward_and_gradients(name):
    enc = encodings.get(name, **HPARAMS.get(name, {})).bind(DIMS)
    # Seed 1: KERPLE's r1 and r2 inside [eps, ...). Below eps its projected gradient (a custom
    # VJP passing only inward gradients) depends on how the bias is tiled, since the sign test
    # sees each tile's gradient rather than their sum: blocked and einsum then differ (on main
    # too; with contiguous positions the per-distance table calls the bias once and agrees).
    params = enc.init(jax.random.key(1), DIMS)
    # Larger than at initialisation, so that the position terms matter next to q . k.
    params = jax.tree.map(lambda x: 5 * x if x.ndim >= 2 else x, params)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, 2, 8)), jnp.float32) for n in (T, S, S))
    offsets = np.array([[3], [40]])
    contiguous = offsets + np.arange(S)[None, :]
    randomized = np.sort(rng.choice(200, (2, S), replace=False), axis=1) + offsets
    valid = np.ones((2, S), bool)
    valid[1, :3] = False  # the second row's first keys are padding
    both_ways = [True] if enc.causal_only else [True, False]
    for causal in both_ways:
        fast, reference = _loss("blocked", causal, enc), _loss("einsum", causal, enc)
        for positions, k_pos in (("contiguous", contiguous), ("randomized", randomized)):
            for k_valid in (None, valid):
                args = (q, k, v, params, k_pos[:, S - T :], k_pos, k_valid)
                got, expected = fast(*args), reference(*args)
                where = f"{name}, causal={causal}, {positions}, padded={k_valid is not None}"
                for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
                    # Parameter gradients sum over every pair in another order: relative to
                    # the largest entry.
                    atol = 2e-5 * max(1.0, float(np.abs(e).max()))
                    np.testing.assert_allclose(a, e, rtol=1e-4, atol=atol, err_msg=where)


def test_distance_table_laid_out_per_tile_equals_the_bias_of_every_pair():
    """Every tile of a window (queries the last T of S keys, at an offset) read from one
    per-distance table equals T5's bias of those pairs."""
    enc = encodings.get("t5", **HPARAMS["t5"]).bind(DIMS)
    params = enc.init(jax.random.key(2), DIMS)
    params = jax.tree.map(lambda x: x + jnp.arange(x.size).reshape(x.shape), params)
    k_pos = jnp.asarray(7 + np.arange(S))[None, :]
    q_pos = k_pos[:, S - T :]
    table = distance_table(enc, params, q_pos, k_pos)  # [1, H, T + S]
    expected = np.asarray(enc.bias(params, q_pos, k_pos))  # [1, H, T, S]
    tile = jax.jit(lambda q_start, k_start: bias_from_table(table, T, q_start, k_start, 3, 5))
    for q_start in range(0, T - 3, 3):
        for k_start in range(0, S - 5, 5):
            got = tile(q_start, k_start)
            want = expected[:, :, q_start : q_start + 3, k_start : k_start + 5]
            np.testing.assert_array_equal(np.asarray(got), want)


class _CopeClippedEarlier(encodings.get_class("cope")):
    """Claims its counts stop mattering half a key before they do."""

    @property
    def carry_limit(self):
        return self.max_pos - 1.5


def test_saturated_cope_tiles_equal_the_einsum_path_and_are_taken():
    """Past the carry limit CoPE's tiles take a probe key's terms: the blocked output equals the
    einsum one; an encoder declaring a limit half a key too low differs at the same shapes, so
    those tiles are really taken (not skipped as never saturated)."""
    rng = np.random.default_rng(3)
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, 2, 8)), jnp.float32) for n in (T, S, S))
    k_pos = jnp.asarray(np.arange(S))[None, :]

    def out(enc, impl):
        params = enc.init(jax.random.key(0), DIMS)
        run = _jit(
            lambda q, k, v: attend(
                q,
                k,
                v,
                encoding=enc,
                params=params,
                q_pos=k_pos[:, S - T :],
                k_pos=k_pos,
                causal=True,
                implementation=impl,
                block_size=BLOCK,
            )
        )
        return np.asarray(run(q, k, v))

    enc = encodings.get("cope", **HPARAMS["cope"]).bind(DIMS)
    np.testing.assert_allclose(out(enc, "blocked"), out(enc, "einsum"), rtol=1e-5, atol=1e-5)
    liar = _CopeClippedEarlier(**HPARAMS["cope"]).bind(DIMS)
    assert np.abs(out(liar, "blocked") - out(liar, "einsum")).max() > 1e-3
