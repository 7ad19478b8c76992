"""Shared by the tests of the bias encoders (ALiBi, T5, KERPLE, FIRE, dynamic position bias):
naive float64 attention with a bias given as a numpy function, and every attention path of
``posenc.attention.core.attend`` at the training length, at 16 times it (256 tokens, 5-6 tiles) and
in the slow step at 128 times it (2048 tokens: the ``blocked`` path's 48-token tiles make 43
query and key tiles, ``auto``'s 64-token ones 32 and 33), causal and bidirectional."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from posenc.attention.core import attend

H, DH = 3, 8  # three heads: a head mixed up with another shows

# (path, block size): `blocked` with tiles that divide neither length (a padded last tile);
# `auto` with a block between the two lengths, so it picks `xla` at 16 and `blocked` at 2048.
PATHS = [("einsum", 512), ("blocked", 5), ("xla", 512), ("auto", 64)]
TRAIN_LENGTH = 16
LONG = 128 * TRAIN_LENGTH  # 2048 queries, the last of LONG + EXTRA_KEYS keys
LENGTHS = [TRAIN_LENGTH, 16 * TRAIN_LENGTH, LONG]
# (length, causal): the training length both ways, 16x causal; 2048 tokens both ways in the
# slow step (3-10 s a case on a CPU, mostly the float64 reference and compiling).
WINDOWS = [(TRAIN_LENGTH, True), (16 * TRAIN_LENGTH, True), (TRAIN_LENGTH, False)]
# (length, causal, path, block): every window on every path; the long windows, which are about
# many tiles, on the tiling paths (`blocked`, and `auto`, which picks it there).
CASES = [(length, causal, *path) for length, causal in WINDOWS for path in PATHS] + [
    pytest.param(LONG, causal, path, block, marks=pytest.mark.slow)
    for causal in (True, False)
    for path, block in PATHS
    if path in ("blocked", "auto")
]
EXTRA_KEYS = 3  # S = T + 3 keys; the queries are the last T
OFFSETS = (0, 37)  # first position of each batch row

# Compiling dominates at these sizes; LLVM at -O0 compiles about twice as fast, same program.
_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def block_for(path: str, block: int, length: int) -> int:
    """The small tile scales with the window so the long case stays a few dozen tiles."""
    return 7 * block + 13 if path == "blocked" and length > TRAIN_LENGTH else block


# The long window is at least 16 tiles on every tiling path (the point of the long case).
assert all(-(-LONG // block_for(p, b, LONG)) >= 16 for p, b in PATHS if p in ("blocked", "auto"))


def inputs(length: int, seed: int = 0):
    """Float32 ``q [B, T, H, DH]``, ``k, v [B, S, H, DH]``; ``q_pos [B, T]``, ``k_pos [B, S]``."""
    b, t, s = len(OFFSETS), length, length + EXTRA_KEYS
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.standard_normal((b, n, H, DH)), jnp.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)[None, :]
    return q, k, v, jnp.asarray(k_pos[:, s - t :]), jnp.asarray(k_pos)


def run(encoding, params, path, block, q, k, v, q_pos, k_pos, causal=True) -> np.ndarray:
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
    )
    return np.asarray(out, np.float64)


def naive(q, k, v, q_pos, k_pos, bias, causal=True) -> np.ndarray:
    """``softmax(q . k / sqrt(DH) + bias) v`` in float64, the last query seeing the last key.

    ``bias(q_pos, k_pos)`` maps numpy ``[B, T]``, ``[B, S]`` positions to ``[B, H, T, S]``.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    t, s = q.shape[1], k.shape[1]
    out = []
    for lo in range(0, t, 64):  # 64 queries at a time: a learned bias's [.., S, width] is large
        rows = slice(lo, lo + 64)
        logits = np.einsum("bthd,bshd->bhts", q[:, rows], k) / np.sqrt(DH)
        logits = logits + bias(q_pos[:, rows], k_pos)
        if causal:
            visible = np.arange(s)[None, :] <= np.arange(t)[rows, None] + (s - t)
            logits = np.where(visible, logits, -np.inf)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out.append(np.einsum("bhts,bshd->bthd", p, v))
    return np.concatenate(out, axis=1)


def largest_constant(fn, *args) -> int:
    """The number of elements of the largest constant baked into ``fn``'s program for ``args``
    (an ``L x L`` table computed in numpy would show up here)."""
    closed = jax.make_jaxpr(fn)(*args)
    sizes = [np.size(c) for c in closed.consts]
    for eqn in closed.jaxpr.eqns:
        sizes += [np.size(var.val) for var in eqn.invars if hasattr(var, "val")]  # literals
    return max(sizes, default=0)
