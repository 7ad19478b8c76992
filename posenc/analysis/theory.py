"""Closed-form analysis of positional encodings (no training, no model).

RoPE long-term decay (Su et al., "RoFormer: Enhanced Transformer with Rotary Position
Embedding", arXiv 2104.09864, Section 3.4.3 and Figure 2).

Group the query and key into ``d/2`` complex pairs and write ``h_i = q_[2i:2i+1] k*_[2i:2i+1]``.
The RoPE logit between positions ``m`` and ``n`` is the real part of

    sum_{i=0}^{d/2-1} h_i e^{i (m-n) theta_i},    theta_i = base^(-2i/d).

With the partial sums ``S_j = sum_{k=0}^{j-1} e^{i (m-n) theta_k}`` (``S_0 = 0``) and the
convention ``h_{d/2} = 0``, Abel summation gives the identity

    sum_i h_i e^{i (m-n) theta_i} = -sum_{i=0}^{d/2-1} S_{i+1} (h_{i+1} - h_i)

and so the bound

    |sum_i h_i e^{i (m-n) theta_i}| <= (max_i |h_{i+1} - h_i|) * sum_{j=1}^{d/2} |S_j|.

The content-independent factor, normalised by the number of pairs,

    B(m - n) = (1 / (d/2)) * sum_{j=1}^{d/2} |S_j|,

is what the paper plots as the "relative upper bound" against the "relative distance" m - n.
It decays (with oscillations) as the distance grows; that decay is the paper's claim.

Everything here is float64 numpy: the figure is pure mathematics and is reproduced exactly,
without the float32 rounding the model's RoPE uses.
"""

from __future__ import annotations

import math
import operator

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["rope_partial_sums", "rope_relative_upper_bound", "rope_thetas"]

# Rows per block in rope_relative_upper_bound: bounds the temporary [rows, dim/2] complex
# array (8192 x 64 x 16 bytes = 8 MiB at dim 128) however many distances are asked for.
_BLOCK_ROWS = 8192


def _check_dim(dim: int) -> int:
    if isinstance(dim, bool):
        raise ValueError(f"dim must be an even integer >= 2, got {dim!r}")
    try:
        dim = operator.index(dim)
    except TypeError:
        raise ValueError(f"dim must be an even integer >= 2, got {dim!r}") from None
    if dim < 2 or dim % 2:
        raise ValueError(f"dim must be an even integer >= 2, got {dim}")
    return dim


def _check_base(base: float) -> float:
    try:
        value = float(base)
    except (TypeError, ValueError):
        raise ValueError(f"base must be a finite number > 0, got {base!r}") from None
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    return value


def _check_distances(distances: ArrayLike) -> np.ndarray:
    arr = np.asarray(distances)
    if arr.ndim > 1:
        raise ValueError(
            f"distances must be a scalar or a 1-D array of shape [N], got shape {arr.shape}"
        )
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"distances must be real numbers, got dtype {arr.dtype}")
    arr = np.atleast_1d(arr).astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("distances must be finite")
    return arr


def rope_thetas(dim: int, base: float = 10000.0) -> np.ndarray:
    """RoPE rotation frequencies ``theta_i = base^(-2i/dim)``, ``i = 0 .. dim/2 - 1``.

    RoFormer eq. (15) with base 10000: pair ``i`` of a ``dim``-dimensional query/key rotates by
    ``position * theta_i`` radians. ``theta_0 = 1`` and the frequencies fall geometrically to
    ``base^(-(dim-2)/dim)``.

    Args:
      dim: head dimension ``d``; an even integer >= 2.
      base: the frequency base (10000 in the paper); a finite number > 0.

    Returns:
      float64 array of shape ``[dim/2]``.

    Raises:
      ValueError: if ``dim`` is odd or < 2, or ``base`` is not a finite positive number.
    """
    dim = _check_dim(dim)
    base = _check_base(base)
    i = np.arange(dim // 2, dtype=np.float64)
    return base ** (-2.0 * i / dim)


def rope_partial_sums(distances: ArrayLike, dim: int = 128, base: float = 10000.0) -> np.ndarray:
    """Partial sums ``S_j = sum_{k=0}^{j-1} e^{i r theta_k}`` for each relative distance ``r``.

    RoFormer Section 3.4.3 (the ``S_j`` of the Abel-summation bound), with ``r = m - n`` and
    ``theta_k`` from :func:`rope_thetas`. Distances may be negative or non-integer;
    ``S_j(-r)`` is the complex conjugate of ``S_j(r)``.

    Args:
      distances: relative distances ``m - n``; a scalar or shape ``[N]``.
      dim: head dimension ``d``; an even integer >= 2.
      base: the frequency base; a finite number > 0.

    Returns:
      complex128 array of shape ``[N, dim/2]`` whose column ``j - 1`` holds ``S_j``, for
      ``j = 1 .. dim/2`` (a scalar distance gives ``N = 1``).

    Raises:
      ValueError: on a bad ``dim`` or ``base``, or distances that are not a finite real
        scalar or 1-D array.
    """
    thetas = rope_thetas(dim, base)  # [dim/2]
    r = _check_distances(distances)  # [N]
    angles = r[:, None] * thetas[None, :]  # [N, dim/2]
    return np.cumsum(np.exp(1j * angles), axis=-1)


def rope_relative_upper_bound(
    distances: ArrayLike, dim: int = 128, base: float = 10000.0
) -> np.ndarray:
    """RoFormer's "relative upper bound" ``(1/(d/2)) * sum_{j=1}^{d/2} |S_j|`` (Figure 2).

    The mean over ``j = 1 .. d/2`` of ``|S_j|`` from :func:`rope_partial_sums`. At distance 0
    every term is 1, so ``|S_j| = j`` and the bound is ``(d/2 + 1) / 2`` (32.5 for ``d = 128``);
    it is the largest value the bound can take, and it decays with oscillations as ``|r|``
    grows. It is even in ``r``.

    Matching Figure 2: the figure is for ``d = 128``, base 10000 and integer distances 0..250,
    the defaults here. We compute the quantity exactly as the paper defines it (mean, not sum,
    over ``j = 1 .. d/2``; ``theta_i = base^(-2i/d)``), with no rescaling or clipping. For
    ``d = 128`` that pins the value at distance 0 to 32.5; no reading of the formula with
    ``d = 128`` starts near 20. The curve falls steeply, to 31.5 at distance 1 and 20.9 at
    distance 5, so on a 0..250 axis the first few distances are a near-vertical drop at the
    left edge; a copy of the figure that appears to start near 20 is showing the curve after
    that drop (or a clipped axis), not a different quantity. After it comes the slow,
    oscillating decay the paper describes: 12.6 at 50, 10.2 at 100, 6.5 at 250.

    Distances are processed in blocks of rows, so memory stays bounded for long ranges
    (100k distances at ``d = 128`` take well under a second).

    Args:
      distances: relative distances ``m - n``; a scalar or shape ``[N]``.
      dim: head dimension ``d``; an even integer >= 2 (paper: 128).
      base: the frequency base; a finite number > 0 (paper: 10000).

    Returns:
      float64 array of shape ``[N]``.

    Raises:
      ValueError: on a bad ``dim`` or ``base``, or distances that are not a finite real
        scalar or 1-D array.
    """
    dim = _check_dim(dim)
    base = _check_base(base)
    r = _check_distances(distances)  # [N]
    out = np.empty(r.shape, dtype=np.float64)
    for start in range(0, r.shape[0], _BLOCK_ROWS):
        block = r[start : start + _BLOCK_ROWS]
        sums = rope_partial_sums(block, dim, base)  # [rows, dim/2]
        out[start : start + _BLOCK_ROWS] = np.abs(sums).mean(axis=-1)
    return out
