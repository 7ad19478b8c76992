"""Index tricks shared by the relative encoders: the rel-shift (skew) and its transpose.

Relative encoders (Shaw, Transformer-XL) score every query against a short *relative table*
of ``R = T + S`` key-minus-query offsets instead of against an ``L x L x D`` tensor. That needs
contiguous positions; for any others (randomized positions, Ruoss et al. 2023) they take a
general path, chosen at run time by :func:`is_contiguous`. For queries
at contiguous positions ``q0 + i`` (``i < T``) and keys at ``k0 + j`` (``j < S``), column ``r`` of
the table holds the offset

    k_pos - q_pos = (k0 - q0) + r - (T - 1),          r = 0 .. T + S - 1,

(the last column is padding that no pair uses). The pair ``(i, j)`` sits at column
``r = j - i + T - 1``, so ``out[i, j] = table[i, j + T - 1 - i]``: row ``i`` of the table, shifted
left by ``T - 1 - i``. :func:`rel_shift` does this shift with pad/reshape/slice (Dai et al. 2019;
Huang et al. 2018 call it "skewing"), which moves memory but never gathers, so its gradient is
another pad/reshape/slice rather than a scatter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rel_shift(x: jax.Array) -> jax.Array:
    """Turns per-offset scores into per-key scores by shifting row ``i`` left by ``T - 1 - i``.

    Worked example with ``T = 2`` queries and ``S = 3`` keys (``R = 5`` table columns; the
    table column ``r`` holds key-minus-query offset ``r - 1``; ``.`` is the unused pad)::

        x = [[a, b, c, d, .],      # query 0: offsets -1, 0, 1, 2, pad
             [e, f, g, h, .]]      # query 1: offsets -1, 0, 1, 2, pad
        rel_shift(x) = [[b, c, d],   # query 0 vs keys 0, 1, 2 = offsets 0, 1, 2
                        [e, f, g]]   # query 1 vs keys 0, 1, 2 = offsets -1, 0, 1

    Args:
      x: ``[..., T, R]`` scores against the relative table, ``R = T + S``.

    Returns:
      ``[..., T, S]`` with ``out[..., i, j] = x[..., i, j + T - 1 - i]``.
    """
    *lead, t, r = x.shape
    s = r - t
    if s < 1:
        raise ValueError(f"rel_shift needs R = T + S columns with S >= 1; got T={t}, R={r}")
    flat = x.reshape(*lead, t * r)  # [..., T * R]
    # Element (i, j + T - 1 - i) of x is flat element T - 1 + i * (R - 1) + j: read rows of
    # length R - 1 starting at T - 1. The last read ends at T - 1 + T * (R - 1) <= T * R.
    flat = flat[..., t - 1 : t - 1 + t * (r - 1)]
    return flat.reshape(*lead, t, r - 1)[..., :s]  # [..., T, S]


def rel_unshift(y: jax.Array) -> jax.Array:
    """The transpose of :func:`rel_shift`: scatters per-key values back to their offset column.

    ``rel_unshift(y)[..., i, r] = y[..., i, r - (T - 1 - i)]`` where that key exists, else 0.
    Shaw's value term uses it to sum attention probabilities per relative offset.

    Args:
      y: ``[..., T, S]``.

    Returns:
      ``[..., T, T + S]``.
    """
    *lead, t, s = y.shape
    template = jax.ShapeDtypeStruct((*lead, t, t + s), y.dtype)
    (out,) = jax.linear_transpose(rel_shift, template)(y)
    return out


def relative_offsets(q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """Key-minus-query offsets of the relative table for contiguous positions.

    Relative encoders assume each row of ``q_pos`` is ``q0 + arange(T)`` and each row of
    ``k_pos`` is ``k0 + arange(S)`` (training windows, evaluation windows, offset windows and
    query blocks all are); only the first position of each row is read.

    Args:
      q_pos: ``[B|1, T]`` integer query positions.
      k_pos: ``[B|1, S]`` integer key positions.

    Returns:
      ``[B|1, T + S]`` int32, column ``r`` = ``(k0 - q0) + r - (T - 1)``.
    """
    t, s = q_pos.shape[-1], k_pos.shape[-1]
    start = (k_pos[:, :1] - q_pos[:, :1]).astype(jnp.int32) - (t - 1)  # [B|1, 1]
    return start + jnp.arange(t + s, dtype=jnp.int32)[None, :]  # [B|1, T + S]


def pairwise_offsets(q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """``k_pos[j] - q_pos[i]`` for every pair: ``[B|1, T]``, ``[B|1, S]`` -> ``[B|1, T, S]``."""
    return k_pos[:, None, :].astype(jnp.int32) - q_pos[:, :, None].astype(jnp.int32)


def is_contiguous(q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """Whether every row of ``q_pos`` and ``k_pos`` counts up by one (a scalar bool array).

    The relative table of :func:`relative_offsets` is exact only then; encoders branch on this
    with ``jax.lax.cond`` so that one compiled program serves contiguous and arbitrary positions.
    """
    steps_q = jnp.diff(q_pos.astype(jnp.int32), axis=-1)
    steps_k = jnp.diff(k_pos.astype(jnp.int32), axis=-1)
    return jnp.all(steps_q == 1) & jnp.all(steps_k == 1)
