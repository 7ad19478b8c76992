"""Per-token losses: cross entropy, with label smoothing for training translation models, and
the same computed a chunk of positions at a time from the final hidden states
(:func:`chunked_token_losses`), so that the ``[B, T, V]`` float32 logits of a large vocabulary
are never all held at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def token_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-token cross entropy in nats: ``[B, T, V]`` logits -> ``[B, T]`` float32."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def smoothed_token_loss(logits: jax.Array, targets: jax.Array, smoothing: float) -> jax.Array:
    """Cross entropy against a label smoothed toward the other ids (Szegedy et al. 2016), as
    Vaswani et al. train with ``smoothing = 0.1``: ``1 - smoothing`` on the target and
    ``smoothing / (V - 1)`` on each other id, as tensor2tensor and Flax's WMT example spread it.
    ``[B, T, V]``, ``[B, T]`` -> ``[B, T]`` float32; ``smoothing = 0`` is :func:`token_loss`.

    Its minimum is the entropy of the smoothed label, not 0; evaluation reports the plain cross
    entropy.
    """
    _check_smoothing(smoothing)
    logits = logits.astype(jnp.float32)
    if smoothing == 0.0:
        return token_loss(logits, targets)
    v = logits.shape[-1]
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [B, T, V]
    on_target = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [B, T]
    others = jnp.sum(log_probs, axis=-1) - on_target
    return -((1.0 - smoothing) * on_target + smoothing / (v - 1) * others)


def _check_smoothing(smoothing: float) -> None:
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"label smoothing must be in [0, 1), got {smoothing!r}")


@dataclasses.dataclass(frozen=True)
class TokenLosses:
    """Per-token results of :func:`chunked_token_losses`, each ``[B, T]``.

    Attributes:
      loss: the cross entropy in nats, float32.
      smoothed: the label-smoothed cross entropy (:func:`smoothed_token_loss`), or None when
        not asked for.
      correct: whether the logits' arg max is the target (bool), or None when not asked for.
    """

    loss: jax.Array
    smoothed: jax.Array | None = None
    correct: jax.Array | None = None


def _chunk_stats(
    logits: jax.Array, targets: jax.Array, smoothing: float | None, correct: bool
) -> tuple[jax.Array, ...]:
    """``(loss, [smoothed], [correct])`` ``[B, C]`` of one chunk's logits ``[B, C, V]``."""
    out = [token_loss(logits, targets)]
    if smoothing is not None:
        out.append(smoothed_token_loss(logits, targets, smoothing))
    if correct:
        out.append(logits.argmax(-1) == targets)
    return tuple(out)


def chunk_positions(rows: int, length: int, chunk: int) -> int:
    """Positions per chunk: ``chunk`` tokens over ``rows`` rows (at least one position), evened
    out over the chunks a window of ``length`` needs, so that padding is under one per chunk;
    ``length`` itself (one chunk) when ``chunk`` is 0 or the window's tokens fit in one."""
    if chunk <= 0 or rows * length <= chunk:
        return length
    per = max(1, chunk // rows)
    n = -(-length // per)  # chunks
    return -(-length // n)


def chunked_token_losses(
    hidden: jax.Array,
    targets: jax.Array,
    logits_of: Callable[[jax.Array], jax.Array],
    *,
    chunk: int,
    smoothing: float | None = None,
    correct: bool = False,
) -> TokenLosses:
    """Per-token cross entropy from the final hidden states, forming the logits of ``chunk``
    tokens (rows x positions) at a time.

    The window's positions are cut into chunks (:func:`chunk_positions`; the last padded); for
    each, ``logits_of`` (the model's head: final norm, head transform, output projection and
    bias, all per token) gives its ``[B, C, V]`` float32 logits and the loss is taken from them
    at once (``jax.lax.map``). Under differentiation each chunk is recomputed in the backward
    pass (``jax.checkpoint``) instead of keeping its logits, so training holds one chunk's
    logits too, as Levanter's blockwise cross entropy does. A window whose tokens fit in one
    chunk (or ``chunk = 0``) is the unchunked computation itself.

    Args:
      hidden: ``[B, T, D]`` the last block's output (before the head).
      targets: ``[B, T]`` integer target ids.
      logits_of: ``[B, C, D] -> [B, C, V]`` float32 logits, applied per token.
      chunk: tokens per chunk; 0: all at once.
      smoothing: also the label-smoothed loss (:func:`smoothed_token_loss`) with this
        smoothing; None: not computed.
      correct: also whether each position's arg max is its target.

    Returns:
      :class:`TokenLosses` of ``[B, T]`` arrays.
    """
    if smoothing is not None:
        _check_smoothing(smoothing)
    rows, length = targets.shape
    per = chunk_positions(rows, length, chunk)
    if per >= length:
        stats = _chunk_stats(logits_of(hidden), targets, smoothing, correct)
        return _pack(stats, smoothing, correct)
    n = -(-length // per)
    pad = n * per - length
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    d = hidden.shape[-1]
    hs = hidden.reshape(rows, n, per, d).swapaxes(0, 1)  # [n, B, C, D]
    ts = targets.reshape(rows, n, per).swapaxes(0, 1)  # [n, B, C]

    @jax.checkpoint  # the backward pass recomputes a chunk's logits instead of storing them
    def one(h_t):
        h, t = h_t
        return _chunk_stats(logits_of(h), t, smoothing, correct)

    stats = jax.lax.map(one, (hs, ts))  # each [n, B, C]
    stats = tuple(s.swapaxes(0, 1).reshape(rows, n * per)[:, :length] for s in stats)
    return _pack(stats, smoothing, correct)


def _pack(stats: tuple[jax.Array, ...], smoothing: float | None, correct: bool) -> TokenLosses:
    it = iter(stats)
    loss = next(it)
    smoothed = next(it) if smoothing is not None else None
    right = next(it) if correct else None
    return TokenLosses(loss, smoothed, right)
