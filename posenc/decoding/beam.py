"""Beam search over a ``step(tokens, slot, state) -> (logits, state)`` closure.

The search knows nothing about the model (as Flax's ``examples/wmt/decode.py``): ``step`` reads
a token buffer ``[N, S]`` (``N`` = batch x beam) at ``slot`` and returns the next-token logits
``[N, V]`` and its updated state (a pytree whose leaves have ``N`` leading rows, e.g. key/value
caches); the search reorders the state's rows when beams are reordered.

Scoring is the GNMT length penalty (Wu et al. 2016, eq. 14) that Vaswani et al. and Shaw et al.
decode with (beam 4, ``alpha = 0.6``): a finished hypothesis of ``n`` tokens (its EOS included)
with log probability ``log p`` scores ``log p / ((5 + n) / 6) ** alpha``. A hypothesis that
reaches its row's limit (``max_len``, or ``limits[b]``) without EOS is finished there. The
search keeps ``K`` alive and ``K`` finished hypotheses per row; each step extends the alive ones
by their ``2K`` best tokens (so ``K`` survive even if ``K`` of them end), and it stops once no
alive hypothesis can beat the worst finished one (its score is at most
``log p / penalty(max_len)``, since ``log p`` only falls and, for ``alpha >= 0``, the penalty
only grows) or at ``max_len``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Step = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]
_NEG_INF = -1.0e7  # far below any score, finite so that sums and comparisons stay exact


def length_penalty(length: jax.Array | int, alpha: float) -> jax.Array:
    """GNMT's ``((5 + length) / 6) ** alpha``."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def beam_search(
    step: Step,
    state: Any,
    tokens: jax.Array,
    *,
    start: int,
    beam_size: int,
    alpha: float,
    max_len: int,
    eos_id: int,
    limits: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The ``beam_size`` best continuations of each row, best first.

    Args:
      step: the model closure (module docstring).
      state: its initial state, rows ``[B * K, ...]`` (each row's state repeated ``K`` times).
      tokens: ``[B, S]`` int32 buffer, filled up to and including slot ``start`` (a BOS, or a
        prompt's last token); the continuation is written from ``start + 1`` on.
      start: the slot whose logits predict the first new token.
      beam_size: ``K``, at least 1.
      alpha: the length penalty's exponent (0: plain log probability).
      max_len: new tokens at most; ``start + max_len < S`` must hold.
      eos_id: the end-of-sequence token.
      limits: ``[B]`` int, each row's most new tokens (at most ``max_len``; Vaswani et al.
        stop at the source length + 50); None: ``max_len`` for every row.

    Returns:
      ``[B, K, max_len]`` int32 continuations (after their end: EOS) and their scores
      ``[B, K]`` float32, in decreasing score.
    """
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam size must be a positive integer, got {beam_size!r}")
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    b, s = tokens.shape
    k = beam_size
    if start + max_len > s - 1:
        raise ValueError(f"the buffer has {s} slots; start {start} + max_len {max_len} needs more")
    if not alpha >= 0:
        raise ValueError(f"the length penalty's alpha must be >= 0, got {alpha!r}")

    def flat(x):  # [B, K, ...] -> [B * K, ...]
        return x.reshape(b * k, *x.shape[2:])

    def gather(x, rows):  # x: [B, K, ...], rows: [B, M] beam indices -> [B, M, ...]
        return jnp.take_along_axis(x, rows.reshape(b, -1, *([1] * (x.ndim - 2))), axis=1)

    def gather_state(state, rows):
        return jax.tree.map(lambda x: flat(gather(x.reshape(b, k, *x.shape[1:]), rows)), state)

    limits = jnp.full((b,), max_len) if limits is None else jnp.minimum(limits, max_len)
    # Slots after `start` read EOS until written, so a hypothesis that ends at its limit
    # reads as ended there; the model never looks at slots after the one it decodes.
    tokens = jnp.where(jnp.arange(s) > start, eos_id, tokens).astype(jnp.int32)
    alive = jnp.broadcast_to(tokens[:, None, :], (b, k, s))  # [B, K, S]
    # Only the first beam is live at first: the others would repeat it.
    alive_lp = jnp.tile(jnp.array([0.0] + [_NEG_INF] * (k - 1), jnp.float32), (b, 1))
    finished = alive
    finished_score = jnp.full((b, k), _NEG_INF, jnp.float32)
    finished_flag = jnp.zeros((b, k), bool)
    max_penalty = length_penalty(max_len, alpha)

    def not_done(carry):
        n, _, alive_lp, _, finished_score, finished_flag, _ = carry
        best_alive = alive_lp[:, 0] / max_penalty  # [B]
        worst_finished = jnp.where(finished_flag, finished_score, _NEG_INF).min(axis=1)
        can_improve = ~jnp.all(finished_flag, axis=1) | (best_alive > worst_finished)
        return (n < max_len) & jnp.any(can_improve)

    def body(carry):
        n, alive, alive_lp, finished, finished_score, finished_flag, state = carry
        slot = start + n  # the newest token's slot
        logits, state = step(flat(alive), slot, state)
        lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B * K, V]
        v = lp.shape[-1]
        cand = (alive_lp[:, :, None] + lp.reshape(b, k, v)).reshape(b, k * v)  # [B, K * V]
        top_lp, top_idx = jax.lax.top_k(cand, 2 * k)  # [B, 2K]
        rows, ids = top_idx // v, (top_idx % v).astype(jnp.int32)
        seqs = gather(alive, rows)  # [B, 2K, S]
        seqs = jax.lax.dynamic_update_slice_in_dim(seqs, ids[:, :, None], slot + 1, axis=2)
        length = n + 1  # new tokens so far, the one just chosen included
        real = top_lp > _NEG_INF / 2  # not the extension of an empty beam
        ends = real & ((ids == eos_id) | (length >= limits[:, None]))
        # Alive: the K best that did not end.
        keep_lp = jnp.where(ends | ~real, _NEG_INF, top_lp)
        alive_lp, keep = jax.lax.top_k(keep_lp, k)  # [B, K]
        alive = gather(seqs, keep)
        state = gather_state(state, gather(rows, keep))
        # Finished: the K best of the old finished and those that ended now.
        new_score = jnp.where(ends, top_lp / length_penalty(length, alpha), _NEG_INF)
        all_seqs = jnp.concatenate([finished, seqs], axis=1)  # [B, 3K, S]
        all_score = jnp.concatenate([finished_score, new_score], axis=1)
        all_flag = jnp.concatenate([finished_flag, ends], axis=1)
        finished_score, best = jax.lax.top_k(jnp.where(all_flag, all_score, 2 * _NEG_INF), k)
        finished = gather(all_seqs, best)
        finished_flag = gather(all_flag, best)
        finished_score = jnp.where(finished_flag, finished_score, _NEG_INF)
        return n + 1, alive, alive_lp, finished, finished_score, finished_flag, state

    carry = (jnp.int32(0), alive, alive_lp, finished, finished_score, finished_flag, state)
    _, alive, alive_lp, finished, finished_score, finished_flag, _ = jax.lax.while_loop(
        not_done, body, carry
    )
    out = finished[:, :, start + 1 : start + 1 + max_len]  # [B, K, max_len]
    return _after_eos(out, eos_id), finished_score


def _after_eos(seqs: jax.Array, eos_id: int) -> jax.Array:
    """Every token after a row's first EOS replaced by EOS (the buffer may hold stale ones)."""
    ended = jnp.cumsum(seqs == eos_id, axis=-1) - (seqs == eos_id) > 0
    return jnp.where(ended, eos_id, seqs)
