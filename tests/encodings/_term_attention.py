"""Shared by the tests of encoders whose logit terms read the queries and keys (GRAPE-A, DAPE) or
rotate them (GRAPE-M): float64 attention with a given ``[B, H, T, S]`` term, and every attention
path of ``attend`` over the windows and tile sizes of :mod:`_bias_attention` (the training length
both ways, 16 times it causal, and 128 times it in the slow step). The head width is 16, whose
square root 4 is a power of two: a term returned in unscaled units (``sqrt(Dh) b``) and divided
by ``sqrt(Dh)`` again is then ``b`` exactly, so equalities with bias encoders are exact."""

from __future__ import annotations

import jax
import numpy as np
from _bias_attention import CASES, EXTRA_KEYS, OFFSETS, PATHS, TRAIN_LENGTH
from _bias_attention import block_for as block_for

from posenc.attention.core import attend

__all__ = ["CASES", "PATHS", "TRAIN_LENGTH", "block_for"]

# The default-suite cases (the long windows are pytest.param(..., marks=slow)), and the causal ones.
SHORT_CASES = [c for c in CASES if not hasattr(c, "marks")]
CAUSAL_CASES = [c for c in CASES if (c.values if hasattr(c, "marks") else c)[1]]
# Where an equality with another encoder is checked (two compiles a case): each explicit path at
# the training length, `blocked` at 16 times it, and tiled and not without the mask (`auto` picks
# one of these; the transcription tests run it).
EQUALITY_CASES = [c for c in SHORT_CASES if c[0] == TRAIN_LENGTH and c[1] and c[2] != "auto"]
EQUALITY_CASES += [c for c in SHORT_CASES if c[0] > TRAIN_LENGTH and c[2] == "blocked"]
EQUALITY_CASES += [c for c in SHORT_CASES if not c[1] and c[2] in ("einsum", "blocked")]

H, DH = 3, 16

_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def inputs(length: int, seed: int = 0):
    """Float32 ``q [B, T, H, DH]``, ``k, v [B, S, H, DH]``; ``q_pos [B, T]``, ``k_pos [B, S]``
    (the queries the last ``T`` of ``S = T + 3`` keys, rows starting at 0 and 37)."""
    b, t, s = len(OFFSETS), length, length + EXTRA_KEYS
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, n, H, DH)).astype(np.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)[None, :]
    return q, k, v, k_pos[:, s - t :], k_pos


def run(encoding, params, path, block, q, k, v, q_pos, k_pos, causal=True, layer_input=None):
    out = _attend(
        q,
        k,
        v,
        encoding=encoding,
        params=params,
        q_pos=q_pos,
        k_pos=k_pos,
        causal=causal,
        implementation=path,
        block_size=block,
        inputs=layer_input,
    )
    return np.asarray(out, np.float64)


def naive(q, k, v, term, causal=True) -> np.ndarray:
    """``softmax(q . k / sqrt(d) + term) v`` in float64, the last query seeing the last key.

    Args:
      q: ``[B, T, H, d]``; k, v: ``[B, S, H, d]`` (any float dtype).
      term: ``[B|1, H, T, S]`` added to the scaled logits (0 for none).
      causal: mask keys after the query.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    t, s = q.shape[1], k.shape[1]
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1]) + term
    if causal:
        visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
        logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", p, v)


def distance(q_pos, k_pos) -> np.ndarray:
    """``|j - i|`` as float64 ``[B, 1, T, S]``."""
    return np.abs(np.asarray(k_pos)[:, None, None, :] - np.asarray(q_pos)[:, None, :, None]).astype(
        np.float64
    )


def cached_query(encoding, params, q, k, v, q_pos, k_pos, slots=32):
    """The last query through a key/value cache's call of attention: ``slots`` preallocated keys,
    the window's ``S`` filled and the rest garbage (NaN) marked invalid, one query at the last
    filled slot (``q_index``), on ``einsum`` as decoding runs it. Returns ``[B, 1, H, d]``."""
    b, s = k.shape[0], k.shape[1]
    garbage = np.full((b, slots - s, *k.shape[2:]), np.nan, np.float32)
    k_slots, v_slots = (np.concatenate([x, garbage], axis=1) for x in (k, v))
    pos_slots = np.concatenate([k_pos, np.zeros((b, slots - s), k_pos.dtype)], axis=1)
    valid = np.arange(slots)[None, :] < s
    out = _attend_cached(
        q[:, -1:],
        k_slots,
        v_slots,
        encoding=encoding,
        params=params,
        q_pos=q_pos[:, -1:],
        k_pos=pos_slots,
        implementation="einsum",
        k_valid=valid,
        q_index=s - 1,
    )
    return np.asarray(out, np.float64)


_attend_cached = jax.jit(
    attend,
    static_argnames=("encoding", "implementation"),
    compiler_options={"xla_backend_optimization_level": 0},
)
