"""What the attention paths add to ``q . k``, shared by :mod:`posenc.attention.core` and
:mod:`posenc.attention.blocked`: the masks, the cumulative decays, the contextual logits, and the
per-distance tables of encoders that declare ``bias_by_distance``.

A per-distance table replaces ``T x S`` calls of a bias (a bucket, a log, an MLP per pair) by
``T + S`` of them, once per window, and lays them out per tile by index arithmetic: the bias of
query ``i`` and key ``j`` sits at column ``j - i + T - 1`` of the window's relative table (that of
:func:`~posenc.encodings.relative.relative_offsets`), so a tile is a band of the table skewed by
:func:`~posenc.encodings.relative.rel_shift` (pad, reshape, slice: XLA fuses it into the tile's
logits, and its gradient is dense). That needs contiguous positions; others (randomized
positions) call the bias per pair, chosen once per window with ``lax.cond``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from posenc.attention.options import Window, visible
from posenc.encodings.base import Encoding, Params
from posenc.encodings.relative import is_contiguous, rel_shift

# Masked logits. Far below any real logit, yet far from float32's limit, so that differences
# of masked values (the online softmax subtracts running maxima) never overflow to -inf.
NEG = -1e30


class LayerTerms(NamedTuple):
    """What a layer's attention options (:mod:`posenc.attention.options`) add on every path
    beside the encoder's hooks: the ``window``, the logits' divisor ``denom`` (``sqrt(head_dim)``,
    or ``1 / logit_scale``), the ``softcap`` (0: none) and the per-head sink logits ``sinks``
    (``[H]`` float32, or None)."""

    window: Window
    denom: float
    softcap: float = 0.0
    sinks: jax.Array | None = None


def plain_terms(head_dim: int) -> LayerTerms:
    """The terms of attention without options: full window, ``1 / sqrt(head_dim)``."""
    return LayerTerms(Window(), math.sqrt(head_dim))


def causal_mask(t: int, s: int, total_t: int, q_start: jax.Array | int) -> jax.Array:
    """``[T, S]`` bool: query ``q_start + i`` of ``total_t`` queries may see key ``j``."""
    i = q_start + jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    return j <= i + (s - total_t)


def visibility(
    t: int, s: int, first: jax.Array | int, causal: bool, window: Window
) -> jax.Array | None:
    """``[T, S]`` bool: the query at key index ``first + i`` may see key ``j`` (the causal mask
    and the window), or None when every pair is visible (no causal mask, full window)."""
    if not causal and window.full:
        return None
    i = first + jnp.arange(t)[:, None]
    j = jnp.arange(s)[None, :]
    return visible(i, j, causal, window)


def finish_logits(logits: jax.Array, terms: LayerTerms) -> jax.Array:
    """Scaled logits through the soft cap (``cap * tanh(z / cap)``), if any."""
    if terms.softcap:
        return terms.softcap * jnp.tanh(logits / terms.softcap)
    return logits


def softmax(logits: jax.Array, sinks: jax.Array | None) -> jax.Array:
    """Softmax over the last axis of ``[B, H, T, S]`` float32 logits; with ``sinks [H]`` each
    head's sink logit joins the denominator only (its probability is dropped)."""
    if sinks is None:
        return jax.nn.softmax(logits, axis=-1)
    sink = jnp.broadcast_to(sinks[None, :, None, None], (*logits.shape[:3], 1))
    both = jax.nn.softmax(jnp.concatenate([logits, sink.astype(logits.dtype)], axis=-1), axis=-1)
    return both[..., :-1]


def weights(logits: jax.Array, sinks: jax.Array | None, normalized: bool = True) -> jax.Array:
    """The attention weights of ``[B, H, T, S]`` float32 logits: :func:`softmax` with the sinks,
    or ``exp(logits)`` as they are for an encoder that declares ``normalized = False`` (its
    logits are log weights; sinks are refused with it, :func:`~posenc.attention.core.
    check_implementation`)."""
    return softmax(logits, sinks) if normalized else jnp.exp(logits)


def decay_bias(decay: tuple[jax.Array, jax.Array]) -> jax.Array:
    """``c_i - c_j = sum_{l=j+1..i} log_decay_l``: ``[B, T, H]``, ``[B, S, H]`` ->
    ``[B, H, T, S]``."""
    c_q, c_k = decay
    return c_q.transpose(0, 2, 1)[:, :, :, None] - c_k.transpose(0, 2, 1)[:, :, None, :]


def contextual(q, k, logits, visible, carry, encoding: Encoding, params: Params):
    """Adds the encoder's contextual logits to masked ``logits`` and masks again (the terms of
    masked pairs are meaningless); returns the logits and the carry for the earlier keys."""
    terms, carry = encoding.contextual_logits(params, q, k, logits, carry)
    logits = jnp.where(visible, logits + terms.astype(jnp.float32), NEG)
    return logits, carry.astype(jnp.float32)


def distance_table(
    encoding: Encoding, params: Params, q_pos: jax.Array, k_pos: jax.Array
) -> jax.Array:
    """The bias of every distance of a window of contiguous positions, from one call of
    ``bias`` (valid for an encoder that declares ``bias_by_distance``).

    Column ``r`` holds the bias at key-minus-query distance ``(k0 - q0) + r - (T - 1)``, the
    distance of the window's relative table (the last column is padding no pair uses): ``bias``
    of one query at ``q0 + T - 1`` against keys at ``k0 + r``, all at or after the window's
    first position.

    Args:
      encoding: a bound encoder with a ``bias`` hook and ``bias_by_distance``.
      params: its parameters.
      q_pos: ``[B|1, T]`` contiguous query positions (only the first of each row is read).
      k_pos: ``[B|1, S]`` contiguous key positions (likewise).

    Returns:
      ``[B|1, H, T + S]`` float32.
    """
    t, s = q_pos.shape[-1], k_pos.shape[-1]
    query = q_pos[:, :1] + (t - 1)  # [B|1, 1]
    keys = k_pos[:, :1] + jnp.arange(t + s, dtype=k_pos.dtype)[None, :]  # [B|1, T + S]
    return encoding.bias(params, query, keys)[:, :, 0, :].astype(jnp.float32)


def bias_from_table(
    table: jax.Array,
    window_t: int,
    q_start: jax.Array | int,
    k_start: jax.Array | int,
    t: int,
    s: int,
) -> jax.Array:
    """The bias of ``t`` queries from window index ``q_start`` and ``s`` keys from ``k_start``,
    read from the window's :func:`distance_table`.

    Query ``q_start + i`` and key ``k_start + j`` of a window of ``T`` queries sit at table
    column ``(k_start - q_start) + (T - t) + (j + t - 1 - i)``: the band of ``t + s`` columns
    from ``(k_start - q_start) + T - t`` on, one copy per query row, skewed by ``rel_shift``.

    Args:
      table: ``[B|1, H, T + S]`` from :func:`distance_table` for the whole window.
      window_t: the window's number of queries ``T``.
      q_start, k_start: the tile's first query and key index in the window.
      t, s: the tile's numbers of queries and keys.

    Returns:
      ``[B|1, H, t, s]`` float32.
    """
    start = k_start - q_start + window_t - t
    band = jax.lax.dynamic_slice_in_dim(table, start, t + s, axis=-1)  # [B|1, H, t + s]
    rows = jnp.broadcast_to(band[:, :, None, :], (*band.shape[:2], t, t + s))
    return rel_shift(rows)  # [B|1, H, t, s]


def window_bias(
    encoding: Encoding, params: Params, q_pos: jax.Array, k_pos: jax.Array
) -> jax.Array:
    """The bias of every pair of a window, ``[B|1, H, T, S]`` float32: the encoder's ``bias``
    per pair, or for a ``bias_by_distance`` encoder at contiguous positions its per-distance
    table laid out (``lax.cond`` on the positions)."""
    t, s = q_pos.shape[-1], k_pos.shape[-1]
    rows = max(q_pos.shape[0], k_pos.shape[0])
    h = encoding.bound_dims.num_heads

    def per_pair():
        bias = encoding.bias(params, q_pos, k_pos).astype(jnp.float32)
        return jnp.broadcast_to(bias, (rows, h, t, s))

    if not encoding.bias_by_distance:
        return per_pair()

    def by_distance():
        table = distance_table(encoding, params, q_pos, k_pos)
        return jnp.broadcast_to(bias_from_table(table, t, 0, 0, t, s), (rows, h, t, s))

    return jax.lax.cond(is_contiguous(q_pos, k_pos), by_distance, per_pair)
