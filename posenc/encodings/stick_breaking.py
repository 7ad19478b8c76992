"""Stick-breaking attention (Tan, Yang, Courville, Panda, Shen, ICLR 2025, "Scaling Stick-Breaking
Attention: An Efficient Implementation and In-depth Study"; official code
``shawntan/stickbreaking-attention``).

No softmax and no positional encoding. Each query breaks a unit stick from its nearest key
backwards: key ``j`` takes the fraction ``beta_ij`` of what the keys between it and the query left::

    z_ij   = q_i . k_j / sqrt(Dh)
    beta_ij = sigmoid(z_ij)
    A_ij   = beta_ij * prod_{j<k<i} (1 - beta_ik)          for j < i (0 otherwise)
    o_i    = sum_j A_ij v_j

so a row's weights sum to ``1 - prod_{k<i} (1 - beta_ik) <= 1`` and recency is built in (a near
key that takes most of the stick hides the ones behind it). In log space, as the paper and its
kernel compute it (``log(1 - sigmoid z) = -softplus(z)``)::

    log A_ij = logsigmoid(z_ij) - sum_{j<k<i} softplus(z_ik)

posenc's transcription:

- The weights are ``exp(log A_ij)`` as they are: the encoder declares ``normalized = False``
  (:mod:`posenc.encodings.base`), so attention forms no softmax; the fused kernels and linear
  attention refuse it, and so do attention sinks (a share of a softmax's denominator).
- The sum over the keys after ``j`` is a ``contextual_logits`` hook with a carry over key tiles
  (as CoPE's count), so the ``blocked`` path evaluates long windows in memory linear in their
  length. The hook returns ``log A_ij - z_ij`` (attention adds ``z_ij``), which is
  ``-sum_{j<=k<i} softplus(z_ik)`` since ``logsigmoid(z) = z - softplus(z)``: one softplus and
  one suffix sum per pair.
- The query's own key: the paper's product and sum run over ``j < i`` and the official kernel
  excludes the diagonal by default (``attend_current=False``); so does posenc. The hook finds
  the query's own key as the last visible key of its row (under the causal mask it is, with or
  without a window, a cache's unfilled slots or padding), gives it weight 0 and leaves it out of
  the product. ``attend_current=True`` is the kernel's other option: ``j <= i``, the product over
  ``j < k <= i``.
- The leftover weight ``1 - sum_j A_ij`` is dropped, as the paper's formula has it. (The official
  repository's reference tests add ``(1 - sum_j A_ij) v_i``, the query's own value, and a later
  model implementation from the same authors adds the leftover times a learned per-head vector;
  neither is in the paper's definition.) So the first token, which has no earlier key, gets a
  zero attention output.
- The carry is ``[B, H, T]`` float32: 0 until the query's own key has been passed (it lies in a
  later tile), then ``1 + sum`` of ``softplus`` over the later keys, so one float says both
  whether the diagonal was met and the running sum (with ``attend_current=True``: the sum). The
  search for the own key runs only on tiles where some query has not met it (``lax.cond``).
- ``carry_limit``: once the later keys' sum passes 104, ``log A_ij <= -104`` and every weight is
  exactly 0 in float32; the hook then says so (a ``-1e30`` term for every key), and the
  ``blocked`` path runs the key tiles before such queries at NoPE's cost (as CoPE's clipped
  count). With ``softplus(z)`` near ``log 2`` for logits near 0, a few hundred keys break that
  much of the stick: how many tiles a query block reads depends on its logits.
- The scale is ``1/sqrt(Dh)`` (the kernel's default ``inv_temp``); no bias or temperature.

Positions never enter (``relative = True``): order comes from the product over the keys between
query and key. Causal as defined (the stick is broken from the query backwards): ``causal_only``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Encoding, Params
from posenc.encodings.registry import register

# Attention passes masked pairs at -1e30 (the contract); every real logit lies far above this.
_MASKED_BELOW = -1e29
# The weight-zero term for the query's own key (attention adds it to the logit).
_ZERO_WEIGHT = -1e30
# exp(x) is exactly 0 in float32 for x < -103.98 (half the smallest subnormal): once the keys after
# a tile have broken off this much of the stick (sum of softplus), every weight there is 0.
_UNDERFLOW = 104.0


@register
@dataclasses.dataclass(frozen=True)
class StickBreaking(Encoding):
    """Stick-breaking attention weights in place of a softmax, no positional term.

    Attributes:
      attend_current: include the query's own key (``j <= i``, the product over
        ``j < k <= i``), the official kernel's ``attend_current``; False (the paper, and the
        kernel's default): keys before the query only.
    """

    name = "stick_breaking"
    paper = (
        "Tan, Yang, Courville, Panda, Shen 2025 (ICLR), Scaling Stick-Breaking Attention: An "
        "Efficient Implementation and In-depth Study"
    )
    relative = True  # no position is read; order comes from the product over the keys between
    causal_only = True  # the stick is broken from the query backwards over earlier keys
    normalized = False  # the weights are exp(log A_ij), summing to at most 1: no softmax

    attend_current: bool = False

    def __post_init__(self):
        if not isinstance(self.attend_current, bool):
            raise ValueError(
                f"encoding.attend_current must be one of [True, False], got {self.attend_current!r}"
            )

    @property
    def carry_limit(self) -> float:
        """Past ``_UNDERFLOW`` of ``softplus`` summed over the later keys, every weight of an
        earlier key is below float32's smallest number (``log A_ij <= -sum``): exactly 0, which
        the hook returns as such (a ``-1e30`` term) for every key, whatever its logit. The
        carry holds ``1 + sum`` once the own key is met (module docstring), and only then can
        the sum grow."""
        return _UNDERFLOW if self.attend_current else 1.0 + _UNDERFLOW

    def contextual_logits(
        self, params: Params, q: jax.Array, k: jax.Array, logits: jax.Array, carry: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``log A_ij - z_ij`` for a tile of keys, and the carry for the tile before it.

        Args:
          params: ``{}``.
          q: ``[B, T, H, Dh]`` queries (unused: the weights come from ``logits``).
          k: ``[B, S, H, Dh]`` keys (unused).
          logits: ``[B, H, T, S]`` float32 scaled logits ``z``, masked pairs at ``-1e30``.
          carry: ``[B, H, T]`` float32 (module docstring): 0 before the query's own key has
            been met, then ``1 + sum`` of ``softplus(z)`` over the counted keys after this tile.

        Returns:
          ``[B, H, T, S]`` float32 terms for the scaled logits, and the ``[B, H, T]`` carry.
        """
        del params, q, k
        visible = logits > _MASKED_BELOW
        if self.attend_current:  # carry: the sum over the keys after this tile, own included
            terms, total = _broken_stick(logits, visible, carry)
            return _underflow(terms, carry), total
        met = carry > 0.0  # the query's own key lay in a later tile
        later = jnp.maximum(carry - 1.0, 0.0)

        def own_met():  # every query's own key is past: every visible key counts
            terms, total = _broken_stick(logits, visible, later)
            return _underflow(terms, later), 1.0 + total

        def own_here():  # some query's own key may be in this tile: the last visible of its row
            cols = jnp.arange(logits.shape[-1], dtype=jnp.float32)  # float: XLA:CPU's int32
            last = jnp.max(jnp.where(visible, cols, -1.0), axis=-1)  # max is ~10x slower here
            own = (cols == last[..., None]) & ~met[..., None]  # [B, H, T, S]
            terms, total = _broken_stick(logits, visible & ~own, later)
            passed = met | (last >= 0.0)
            return jnp.where(own, _ZERO_WEIGHT, terms), jnp.where(passed, 1.0 + total, 0.0)

        # Most key tiles lie wholly before their queries' own keys: no search for them there.
        return jax.lax.cond(jnp.all(met), own_met, own_here)


def _broken_stick(
    logits: jax.Array, counted: jax.Array, later: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``log A_ij - z_ij`` for the counted keys of a tile, and the sum from its first key on.

    Args:
      logits: ``[B, H, T, S]`` float32 ``z``, masked pairs at ``-1e30``.
      counted: ``[B, H, T, S]`` bool, the keys the product runs over (visible, not the query's
        own unless ``attend_current``).
      later: ``[B, H, T]`` the sum of ``softplus`` over the counted keys after this tile.

    Returns:
      The terms (meaningless where not counted: attention masks them) and ``[B, H, T]``
      ``later`` plus this tile's sum.
    """
    broken = jnp.where(counted, _softplus(logits), 0.0)  # -log(1 - beta_ij); 0 if not counted
    after = later[..., None] + _later_sums(broken)  # sum over counted keys k > j
    # log A_ij - z_ij = logsigmoid(z_ij) - z_ij - sum_{k>j} = -softplus(z_ij) - sum_{k>j}, from
    # `broken` (which the matmul reads anyway) rather than the softplus, which XLA would
    # recompute in this fusion.
    return -broken - after, after[..., 0] + broken[..., 0]


def _underflow(terms: jax.Array, later: jax.Array) -> jax.Array:
    """The terms, or ``-1e30`` (weight 0) for every key of a query whose later keys' sum is past
    ``_UNDERFLOW``, where float32 gives every weight 0 anyway (the ``carry_limit`` promise:
    the same terms for every key, whatever its logit)."""
    return jnp.where(later[..., None] >= _UNDERFLOW, _ZERO_WEIGHT, terms)


def _softplus(z: jax.Array) -> jax.Array:
    """``log(1 + exp(z))`` as ``max(z, 0) + log1p(exp(-|z|))``: the same float32 values as
    ``jax.nn.softplus`` (a ``logaddexp``), at two thirds of its cost per tile on XLA:CPU (this VM,
    ``[1, 4, 512, 512]`` inside the blocked path's scan: 6.1 ms against 9.4 ms); 0 at ``-1e30``."""
    return jnp.maximum(z, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(z)))


def _later_sums(x: jax.Array, chunk: int = 32) -> jax.Array:
    """``sum_{k > j} x[..., k]`` for every ``j`` of the last axis (the keys strictly after).

    Chunks of ``chunk`` columns: a matmul with a strict triangle of ones within each, plus the
    sums of the chunks after it (CoPE's suffix sums, :mod:`posenc.encodings.cope`, made
    exclusive: one pass fewer than shifting inclusive sums). ``lax.cumsum(reverse=True)`` is a
    window reduction on XLA:CPU, ``S`` additions per entry, and costlier.
    """
    s = x.shape[-1]
    pad = -s % chunk
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x
    pieces = padded.reshape(*x.shape[:-1], (s + pad) // chunk, chunk)  # [..., N, C]
    strictly_later = jnp.tril(jnp.ones((chunk, chunk), x.dtype), -1)  # [k, j] = 1 where k > j
    # HIGHEST: float32 sums, not TF32's (GPUs) or bfloat16 passes (TPUs) of a default matmul.
    within = jnp.einsum(
        "...nk,kj->...nj", pieces, strictly_later, precision=jax.lax.Precision.HIGHEST
    )
    totals = within[..., 0] + pieces[..., 0]  # [..., N]: each chunk's sum, without a pass
    after = jax.lax.cumsum(totals, axis=totals.ndim - 1, reverse=True) - totals
    return (within + after[..., None]).reshape(padded.shape)[..., :s]
