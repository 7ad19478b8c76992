"""Shared by the tests of RoPE's variants (p-RoPE, Resonance RoPE, STRING): the float64 logits of
a rotary encoding written from its definition, ``q_i . R(P[i, j] theta) k_j`` for a matrix of
relative positions ``P`` (``i - j`` for RoPE, STRING's shifted one) and per-pair frequencies
``theta`` (the transcriptions choose them); naive float64 attention over those logits; and every
attention path of ``posenc.attention.core.attend`` at 1x and 16x the tile size (8 and 128
queries, tiles of 8), causal and bidirectional, plus the key/value cache's form (one query at its
last filled slot, the later slots invalid)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from posenc.attention.core import attend

H, DH = 2, 16
TILE = 8  # the blocked path's tile; `auto` gets the same block, so it tiles the long window
LENGTHS = (TILE, 16 * TILE)
EXTRA_KEYS = 3  # S = T + 3 keys; the queries are the last T
OFFSETS = (0, 37)  # first position of each batch row
# (path, block size): `auto` picks `xla` at one tile and `blocked` at 16 on a CPU.
PATHS = [("einsum", 512), ("blocked", TILE), ("xla", 512), ("auto", TILE)]
CACHE_PATHS = ("einsum", "blocked")  # the paths that take k_valid (a cache's slots)

# Compiling dominates at these sizes; LLVM at -O0 compiles about twice as fast, same program.
_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def inputs(length: int, seed: int = 0):
    """Float32 ``q [B, T, H, DH]``, ``k, v [B, S, H, DH]``; integer ``q_pos [B, T]``,
    ``k_pos [B, S]`` (row ``b`` at ``OFFSETS[b] + j``, the queries the last ``T`` keys)."""
    b, t, s = len(OFFSETS), length, length + EXTRA_KEYS
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, n, H, DH)).astype(np.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)[None, :]
    return q, k, v, k_pos[:, s - t :], k_pos


def run(encoding, path, block, q, k, v, q_pos, k_pos, causal=True, k_valid=None, q_index=None):
    """``attend`` on one path, as float64 numpy."""
    out = _attend(
        jnp.asarray(q),
        jnp.asarray(k),
        jnp.asarray(v),
        encoding=encoding,
        params={},
        q_pos=jnp.asarray(q_pos),
        k_pos=jnp.asarray(k_pos),
        causal=causal,
        implementation=path,
        block_size=block,
        k_valid=None if k_valid is None else jnp.asarray(k_valid),
        q_index=q_index,
    )
    return np.asarray(out, np.float64)


def pair_channels(i: int, dh: int, layout: str) -> tuple[int, int]:
    """The channels of rotation pair ``i``: ``(2i, 2i+1)`` interleaved, ``(i, i + Dh/2)`` half."""
    return (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + dh // 2)


def rotary_logits(q, k, distances, theta, layout="half") -> np.ndarray:
    """``[B, H, T, S]`` float64 ``q_i . R(P[i, j] theta) k_j``: pair ``c`` of the query turned by
    ``P[i, j] * theta_c`` against the key's pair, i.e. ``<R_m q, R_n k> = <R_{m-n} q, k>`` with
    ``m - n`` replaced by ``P``. The channels past ``2 len(theta)`` meet unrotated.

    ``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]``, ``distances: [B, T, S]``, ``theta: [Dh/2]`` (0 for
    a pair that does not turn)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    dh = q.shape[-1]
    distances = np.asarray(distances, np.float64)[:, None]  # [B, 1, T, S]
    out = np.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    for i, th in enumerate(np.asarray(theta, np.float64)):
        a, b = pair_channels(i, dh, layout)
        qa, qb = q[..., a].transpose(0, 2, 1), q[..., b].transpose(0, 2, 1)  # [B, H, T]
        ka, kb = k[..., a].transpose(0, 2, 1), k[..., b].transpose(0, 2, 1)  # [B, H, S]
        cos, sin = np.cos(distances * th), np.sin(distances * th)
        # (R_phi q) . k = cos phi (qa ka + qb kb) + sin phi (qa kb - qb ka)
        same = qa[..., :, None] * ka[..., None, :] + qb[..., :, None] * kb[..., None, :]
        cross = qa[..., :, None] * kb[..., None, :] - qb[..., :, None] * ka[..., None, :]
        out += cos * same + sin * cross
    rotated = {c for i in range(len(theta)) for c in pair_channels(i, dh, layout)}
    for c in sorted(set(range(dh)) - rotated):
        qc, kc = q[..., c].transpose(0, 2, 1), k[..., c].transpose(0, 2, 1)  # [B, H, T|S]
        out += qc[..., :, None] * kc[..., None, :]
    return out


def naive(logits, v, causal=True, scale=1.0) -> np.ndarray:
    """``softmax(scale * logits / sqrt(DH)) v`` in float64, the last query seeing the last key.
    ``logits: [B, H, T, S]`` (unscaled), ``v: [B, S, H, DH]``."""
    logits = scale * np.asarray(logits, np.float64) / np.sqrt(DH)
    t, s = logits.shape[-2:]
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, np.asarray(v, np.float64))


def distances(q_pos, k_pos) -> np.ndarray:
    """``[B, T, S]``: ``i - j``, RoPE's relative positions."""
    return np.asarray(q_pos)[:, :, None] - np.asarray(k_pos)[:, None, :]


def run_cache(encoding, path, q, k, v, q_pos, k_pos, k_valid) -> np.ndarray:
    """``attend`` in the cache's form (:func:`cache_inputs`) on one path."""
    filled = int(np.asarray(k_valid)[0].sum())
    return run(encoding, path, TILE, q, k, v, q_pos, k_pos, k_valid=k_valid, q_index=filled - 1)


def cache_inputs(filled: int, slots: int, seed: int = 1):
    """The cache's form of attention: one query at slot ``filled - 1`` of ``slots`` preallocated
    key slots, the later ones invalid (NaN content, garbage positions). Returns ``q [B, 1, H, DH]``,
    ``k, v [B, slots, H, DH]``, ``q_pos [B, 1]``, ``k_pos [B, slots]``, ``k_valid [B, slots]``."""
    q, k, v, _, k_pos = inputs(slots - EXTRA_KEYS, seed)
    q = q[:, -1:]
    k[:, filled:] = np.nan
    v[:, filled:] = np.nan
    k_pos = k_pos.copy()
    k_pos[:, filled:] = 10**6  # never read: invalid slots take their row's last valid position
    k_valid = np.broadcast_to(np.arange(slots) < filled, k_pos.shape)
    return q, k, v, k_pos[:, filled - 1 : filled], k_pos, k_valid
