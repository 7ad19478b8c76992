"""Shared by the tests of the rotary variants of issue 33 (HoPE, truncated RoPE, FoPE): float64
naive attention over queries and keys already transformed by a test's own transcription, and
:func:`posenc.attention.core.attend` on every path at 1x and 16x the tile size, causal and
bidirectional, plus the single-query call a key/value cache makes (``k_valid``, ``q_index``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc.attention.core import attend

H, DH = 2, 16
BLOCK = 4  # the tile of the `blocked` path; windows of 1x and 16x it
EXTRA_KEYS = 3  # S = T + 3 keys, the queries the last T
OFFSETS = (0, 29)  # first position of each batch row
# (path, block size): the tiling path at the tile, the others in one block.
PATHS = [("einsum", 512), ("blocked", BLOCK), ("xla", 512)]
# (queries, causal): the tile and 16 tiles causal, one tile bidirectional.
WINDOWS = [(BLOCK, True), (16 * BLOCK, True), (BLOCK, False)]
CASES = [(t, causal, path, block) for t, causal in WINDOWS for path, block in PATHS]

_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size", "q_index"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def inputs(t: int, seed: int = 0, head_dim: int = DH):
    """Float32 ``q [B, T, H, Dh]``, ``k, v [B, S, H, Dh]``; int ``q_pos [B, T]``, ``k_pos [B, S]``
    (row ``b``'s keys at ``OFFSETS[b] + j``, the queries the last ``T``)."""
    b, s = len(OFFSETS), t + EXTRA_KEYS
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, n, H, head_dim)).astype(np.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)[None, :]
    return q, k, v, k_pos[:, s - t :], k_pos


def naive(qr, kr, v, causal=True) -> np.ndarray:
    """``softmax(qr . kr / sqrt(Dh)) v`` in float64, the last query seeing the last key."""
    qr, kr, v = (np.asarray(x, np.float64) for x in (qr, kr, v))
    logits = np.einsum("bthd,bshd->bhts", qr, kr) / np.sqrt(qr.shape[-1])
    t, s = qr.shape[1], kr.shape[1]
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def run(enc, params, path, block, q, k, v, q_pos, k_pos, causal=True) -> np.ndarray:
    out = _attend(
        *(jnp.asarray(x) for x in (q, k, v)),
        encoding=enc,
        params=params,
        q_pos=jnp.asarray(q_pos),
        k_pos=jnp.asarray(k_pos),
        causal=causal,
        implementation=path,
        block_size=block,
    )
    return np.asarray(out, np.float64)


def cached_last_query(enc, params, q, k, v, q_pos, k_pos, empty_slots: int = 5) -> np.ndarray:
    """The last query's output as a key/value cache computes it: its keys (before ``rotate``)
    in the first ``S`` of ``S + empty_slots`` slots, the empty slots full of garbage and masked
    by ``k_valid``, the query at key index ``S - 1`` (``q_index``), on the ``einsum`` path.
    Returns ``[B, 1, H, Dh]``."""
    b, s = k.shape[0], k.shape[1]
    rng = np.random.default_rng(99)

    def pad(x):  # [B, S, ...] -> [B, S + empty_slots, ...], the new slots garbage
        garbage = 1e3 * rng.standard_normal((b, empty_slots, *x.shape[2:])).astype(x.dtype)
        return np.concatenate([x, garbage], axis=1)

    slots_pos = np.concatenate([k_pos, k_pos[:, -1:] + 1 + np.arange(empty_slots)], axis=1)
    valid = np.arange(s + empty_slots)[None, :] < s
    out = _attend(
        jnp.asarray(q[:, -1:]),
        jnp.asarray(pad(k)),
        jnp.asarray(pad(v)),
        encoding=enc,
        params=params,
        q_pos=jnp.asarray(q_pos[:, -1:]),
        k_pos=jnp.asarray(slots_pos),
        implementation="einsum",
        k_valid=jnp.asarray(valid),
        q_index=s - 1,
    )
    return np.asarray(out, np.float64)
