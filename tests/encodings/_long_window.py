"""Shared by the 16x tests of the founding content encoders (Shaw, Transformer-XL, DeBERTa), whose
naive transcriptions loop over every (query, key) pair: a short training length, the window 16
times it, and the blocks that make each path tile it.

Length extrapolation is the subject, so every path that serves an encoder is compared with the
encoder's own float64 transcription at ``LONG`` tokens, not only at the few tokens of the other
tests (the learned bias encoders do the same through ``_bias_attention.py``).
"""

from __future__ import annotations

import numpy as np

TRAIN_LENGTH = 8
LONG = 16 * TRAIN_LENGTH  # 128 queries, the last of LONG + EXTRA_KEYS keys
EXTRA_KEYS = 3
OFFSETS = (0, 37)  # first position of each batch row

# (path, block_size): `blocked` with tiles that divide neither 128 queries nor 131 keys (a padded
# last tile); `auto` with a block below the window, so it tiles too (with tiles of 64).
PATHS = {"einsum": 512, "blocked": 5, "xla": 512, "auto": 64}


def inputs(heads: int, head_dim: int, seed: int, length: int = LONG):
    """Float32 ``q [B, T, H, Dh]``, ``k, v [B, S, H, Dh]`` and integer ``q_pos [B, T]``, ``k_pos
    [B, S]``: row ``b``'s keys at ``OFFSETS[b] + j``, the queries the last ``T`` of them."""
    b, t, s = len(OFFSETS), length, length + EXTRA_KEYS
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((b, n, heads, head_dim)).astype(np.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)[None, :]
    return q, k, v, k_pos[:, s - t :], k_pos
