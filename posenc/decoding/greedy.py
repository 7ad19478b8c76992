"""Greedy (arg max) decoding over a ``step(tokens, slot, state) -> (logits, state)`` closure.

The closure is the same one :func:`posenc.decoding.beam.beam_search` takes: it reads the token
buffer ``[B, S]`` at ``slot`` and returns the next-token logits ``[B, V]`` and its new state. One
``lax.fori_loop`` over a fixed number of steps, so one compilation whatever the output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from posenc.decoding.beam import Step


def greedy_search(
    step: Step,
    state,
    tokens: jax.Array,
    *,
    start: int,
    max_len: int,
    eos_id: int | None = None,
    return_logits: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The arg max continuation of every row.

    Args:
      step: the model closure (module docstring).
      state: its initial state (e.g. key/value caches filled before ``start``).
      tokens: ``[B, S]`` int32 buffer, filled up to and including slot ``start``.
      start: the slot whose logits predict the first new token.
      max_len: new tokens; ``start + max_len < S`` must hold.
      eos_id: once a row has produced it, the row continues with it (None: no end token).
      return_logits: also return the logits each token was chosen from.

    Returns:
      ``[B, max_len]`` int32 tokens, and with ``return_logits`` also ``[B, max_len, V]``
      float32 logits.
    """
    if not isinstance(max_len, int) or max_len < 0:
        raise ValueError(f"max_len must be a non-negative integer, got {max_len!r}")
    b, s = tokens.shape
    if start + max_len > s - 1:
        raise ValueError(f"the buffer has {s} slots; start {start} + max_len {max_len} needs more")
    tokens = tokens.astype(jnp.int32)
    if eos_id is not None:  # unwritten slots read EOS (the model never reads ahead)
        tokens = jnp.where(jnp.arange(s) > start, eos_id, tokens)
    if max_len == 0:
        empty = jnp.zeros((b, 0), jnp.int32)
        return (empty, jnp.zeros((b, 0, 0), jnp.float32)) if return_logits else empty

    def body(n, carry):
        tokens, ended, state, out = carry
        slot = start + n
        logits, state = step(tokens, slot, state)
        logits = logits.astype(jnp.float32)  # [B, V]
        new = jnp.argmax(logits, -1).astype(jnp.int32)
        if eos_id is not None:
            new = jnp.where(ended, eos_id, new)
            ended = ended | (new == eos_id)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, new[:, None], slot + 1, axis=1)
        if out is not None:
            out = jax.lax.dynamic_update_slice_in_dim(out, logits[:, None], n, axis=1)
        return tokens, ended, state, out

    out = None
    if return_logits:  # the vocabulary size, from one abstract step
        v = jax.eval_shape(step, tokens, start, state)[0].shape[-1]
        out = jnp.zeros((b, max_len, v), jnp.float32)
    carry = (tokens, jnp.zeros((b,), bool), state, out)
    tokens, _, _, out = jax.lax.fori_loop(0, max_len, body, carry)
    new = tokens[:, start + 1 : start + 1 + max_len]
    return (new, out) if return_logits else new
