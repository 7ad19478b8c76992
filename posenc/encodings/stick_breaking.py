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
  repository's reference tests add ``(1 - sum_j A_ij) v_i``, and the model in IBM's lm-engine adds
  the leftover times a learned per-head vector; neither is in the paper's definition.) So the
  first token, which has no earlier key, gets a zero attention output.
- The carry is ``[B, H, T]`` float32: 0 until the query's own key has been passed (it lies in a
  later tile), then ``1 + sum`` of ``softplus`` over the later keys, so one float says both
  whether the diagonal was met and the running sum (with ``attend_current=True``: the sum).

Positions never enter (``relative = True``): order comes from the product over the keys between
query and key. Causal as defined (the stick is broken from the query backwards): ``causal_only``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Encoding, Params
from posenc.encodings.cope import suffix_sums
from posenc.encodings.registry import register

# Attention passes masked pairs at -1e30 (the contract); every real logit lies far above this.
_MASKED_BELOW = -1e29
# The weight-zero term for the query's own key (attention adds it to the logit).
_ZERO_WEIGHT = -1e30


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
        s = logits.shape[-1]
        visible = logits > _MASKED_BELOW
        if self.attend_current:
            own = jnp.zeros_like(visible)
            later = carry  # sum over the keys after this tile, the query's own included
        else:
            met = carry > 0.0  # the query's own key lay in a later tile
            cols = jnp.arange(s)
            last = jnp.max(jnp.where(visible, cols, -1), axis=-1)  # [B, H, T]; -1: none
            own = (cols == last[..., None]) & ~met[..., None]
            later = jnp.maximum(carry - 1.0, 0.0)
        counted = visible & ~own
        softplus = jax.nn.softplus(logits)  # -log(1 - beta_ij)
        broken = jnp.where(counted, softplus, 0.0)  # 0 if masked or the query's own key
        from_here = later[..., None] + suffix_sums(broken)  # sum over counted keys k >= j
        after = jnp.concatenate([from_here[..., 1:], later[..., None]], axis=-1)  # k > j
        # log A_ij - z_ij = logsigmoid(z_ij) - z_ij - sum_{k>j} = -softplus(z_ij) - sum_{k>j}.
        # (Not -from_here, the same sum: its gradient through the masked `broken` came out NaN
        # at XLA:CPU's -O0 on the blocked path, tests/encodings/test_stick_breaking.py.)
        terms = jnp.where(own, _ZERO_WEIGHT, -softplus - after)
        total = from_here[..., 0]
        if self.attend_current:
            return terms, total
        passed = met | jnp.any(visible, axis=-1)
        return terms, jnp.where(passed, 1.0 + total, 0.0)
