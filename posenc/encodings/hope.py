"""HoPE, high-frequency rotary position encoding (Chen et al., ACL 2025, "HoPE: A Novel
Positional Encoding Without Long-Term Decay for Enhanced Context Awareness and Extrapolation",
arXiv:2410.21216; posenc found no official code).

RoPE turns pair ``i`` of a head by ``m * theta_i``, ``theta_i = base^(-2i/Dh)``. Over a training
window of ``L`` tokens, pair ``i`` completes ``r_i = L theta_i / (2 pi)`` turns. The paper finds
that the pairs that do not complete a turn within ``L`` (the lowest frequencies) learn
near-constant patterns that carry semantics rather than positions, and that the slowest pairs
that do (the "activated" components, whose ``cos`` over the window is high at distance 0 and
near ``L``) form the U-shaped attention it blames for poor context use and extrapolation. HoPE
keeps the high-frequency pairs as RoPE rotates them and replaces the others with
*position-independent* components, i.e. leaves them unrotated::

    HoPE(x, m) = diag(R(m theta_0), ..., R(m theta_{k-1}), I, ..., I) x
    pair i rotates  <=>  theta_i L >= 2 pi * min_turns            (k pairs do)

so the logits are ``sum_{i<k} q_i^T R((n - m) theta_i) k_i + sum_{i>=k} q_i^T k_i``: relative,
with no long-term decay from the unrotated half.

What the paper leaves open, and what posenc chooses:

- The boundary. ``min_turns = 1`` (the default) rotates exactly the pairs that complete at least
  one full period within the training length ("frequencies below ``2 pi / L``" are the
  low-frequency components). The paper also counts the slowest rotating pairs as "activated";
  it gives no formula for how many, so ``min_turns > 1`` removes those too (a pair rotates only
  if it completes ``min_turns`` turns over ``L``).
- Position-independent components are the unrotated channels themselves (no learned constant
  is added); the frequencies are those of the whole head, as RoPE's, not recomputed over the
  rotated pairs. HoPE is therefore p-RoPE (Barbero et al. 2025) with ``p = 2k / Dh`` chosen
  from the training length (tested as an equality).
- ``train_len`` is the run's training length: a run config that does not set it gets
  ``train.seq_len`` when the model is built (:func:`posenc.models.build.fill_train_len`; 512,
  the dataclass default, only where an encoder is made outside a run); it defines the model,
  so evaluation may not change it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Dims, Encoding, Params, check_choice, check_positive
from posenc.encodings.registry import register
from posenc.encodings.rope import LAYOUTS, rotate_pairs


def check_train_len(train_len, what: str) -> None:
    """One-line error unless ``train_len`` is a positive integer (the training length)."""
    ok = isinstance(train_len, int) and not isinstance(train_len, bool) and train_len >= 1
    if not ok:
        raise ValueError(
            f"encoding.train_len must be a positive integer (the training length {what}), got "
            f"{train_len!r}; a run config that leaves it unset takes train.seq_len"
        )


def hope_frequencies(head_dim: int, base: float, train_len: int, min_turns: float) -> np.ndarray:
    """float64 ``[Dh/2]``: ``theta_i = base^(-2i/Dh)`` where pair ``i`` completes at least
    ``min_turns`` turns over ``train_len`` tokens, 0 (unrotated) elsewhere."""
    theta = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    return np.where(theta * train_len >= 2 * math.pi * min_turns, theta, 0.0)


def apply_hope(
    x: jax.Array,
    positions: jax.Array,
    *,
    train_len: int,
    base: float = 10000.0,
    layout: str = "half",
    min_turns: float = 1.0,
) -> jax.Array:
    """Rotates the pairs of ``x`` that turn at least ``min_turns`` times over ``train_len``
    tokens as RoPE does and leaves the others as they are (module docstring).

    Args:
      x: ``[B, T, H, Dh]`` queries or keys (``Dh`` even).
      positions: ``[B|1, T]`` or ``[T]`` integer positions.
      train_len: the training length ``L``.
      base: ``theta_i = base^(-2i/Dh)``.
      layout: ``"half"`` or ``"interleaved"`` (:mod:`posenc.encodings.rope`).
      min_turns: turns over ``L`` a pair must complete to rotate.

    Returns:
      ``[B, T, H, Dh]``, same dtype as ``x``; angles and rotation in float32.
    """
    theta = jnp.asarray(hope_frequencies(x.shape[-1], base, train_len, min_turns), jnp.float32)
    positions = jnp.atleast_2d(positions)  # [B|1, T]
    angles = positions.astype(jnp.float32)[..., None] * theta  # [B|1, T, Dh/2]
    return rotate_pairs(x, angles, layout=layout)


@register
@dataclasses.dataclass(frozen=True)
class HoPE(Encoding):
    """HoPE (module docstring): RoPE's high-frequency pairs, the rest unrotated.

    Attributes:
      train_len: the training length ``L`` (a run config that does not set it gets
        ``train.seq_len``; 512 elsewhere).
      base: ``theta_i = base^(-2i/Dh)``.
      layout: ``"half"`` (GPT-NeoX/LLaMA) or ``"interleaved"`` (RoFormer).
      min_turns: a pair rotates if it completes at least this many turns over ``L`` (1: the
        pairs whose period fits in the training window).
    """

    name = "hope"
    paper = (
        "Chen et al. 2025, HoPE: A Novel Positional Encoding Without Long-Term Decay for "
        "Enhanced Context Awareness and Extrapolation"
    )
    relative = True

    train_len: int = 512
    base: float = 10000.0
    layout: str = "half"
    min_turns: float = 1.0

    def __post_init__(self):
        check_train_len(self.train_len, "whose period decides which pairs rotate")
        check_positive("encoding.base", self.base)
        check_choice("encoding.layout", self.layout, LAYOUTS)
        check_positive("encoding.min_turns", self.min_turns)

    def validate(self, dims: Dims) -> None:
        if dims.head_dim % 2:
            raise ValueError(
                f"HoPE rotates channel pairs and cannot take a head dimension of {dims.head_dim} "
                "(odd); choose model.model_dim / model.num_heads even"
            )
        if not hope_frequencies(dims.head_dim, self.base, self.train_len, self.min_turns).any():
            raise ValueError(
                f"encoding.min_turns={self.min_turns!r} with encoding.train_len={self.train_len} "
                f"rotates no pair of a head of {dims.head_dim} channels (the fastest completes "
                f"{self.train_len / (2 * math.pi):.3g} turns); use a smaller min_turns, or "
                "encoding.name=nope for no rotation"
            )

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> both with their fast pairs rotated."""
        del params
        kwargs = dict(
            train_len=self.train_len, base=self.base, layout=self.layout, min_turns=self.min_turns
        )
        return apply_hope(q, q_pos, **kwargs), apply_hope(k, k_pos, **kwargs)
