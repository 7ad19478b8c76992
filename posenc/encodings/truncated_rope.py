"""Truncated RoPE with a partial key offset: the rotary of modded-nanogpt (Keller Jordan et al.,
the NanoGPT speedrun, github.com/KellerJordan/modded-nanogpt, ``train_gpt.py``: the ``Yarn``
class's ``reset`` and ``rotary``, and ``CausalSelfAttention.forward``'s ``key_offset``).

Half of each head rotates and half stays put ("half-truncate RoPE"). With ``Dh`` channels the
``Dh/4`` frequencies are spaced geometrically from 1 down to 1/1024::

    omega_j = (1/1024)^(j / (Dh/4 - 1)),   j = 0 .. Dh/4 - 1      (torch.linspace(0, 1, Dh/4))

and each drives one interleaved pair of the first half of the head, ``(x_{2j}, x_{2j+1})``; the
last ``Dh/2`` channels have frequency 0. The code's rotation, ``factor1 * x + factor2 *
x_flip`` with ``factor2``'s odd entries negated, is::

    x'_{2j}   = x_{2j} cos(m omega_j) + x_{2j+1} sin(m omega_j)
    x'_{2j+1} = x_{2j+1} cos(m omega_j) - x_{2j} sin(m omega_j)

that is RoFormer's rotation by ``-m omega_j`` (queries and keys alike, so the logits depend on
``n - m`` only; the opposite sign is RoPE up to swapping the two channels of each pair).

The key offset (``key_offset=True``; modded-nanogpt applies it on its long-window layers and
names it "partial key offset ... enables 1-layer induction"): after the rotation, the
stationary half of each key is replaced by that of the previous token's key::

    k[:, 1:, :, Dh/2:] = k[:, :-1, :, Dh/2:]

so a query's stationary channels match the token *before* a key (an induction head in one
layer). The first key of a window keeps its own stationary channels, as the code leaves
``k[:, 0]`` untouched; the queries and the rotating half are not shifted.

Transcription choices:

- Positions are the explicit positions (the code's ``arange``); the shift is along the key axis
  of the window ``rotate`` receives (the previous *token*, whatever the positions). Attention
  calls ``rotate`` once on a whole window, a key/value cache on all of its filled slots in time
  order (:mod:`posenc.decoding`), so the shift reads what a full pass reads: ``cacheable``, and
  ``relative`` (shifting every position changes nothing). A window-sized cache drops the key
  before its oldest slot, which this shift reads: the encoder declares ``key_lookback = 1``
  and such a cache keeps one slot more (:mod:`posenc.decoding.window`).
- The code's bfloat16 tables of ``cos`` and ``sin`` are float32 angles here (posenc's rule), its
  YaRN updates on window changes and its attention scale 0.1 are not part of the encoder (RoPE's
  scaling and the attention options hold those), and its "paired heads" layers are not
  transcribed.
- modded-nanogpt sets the offset per layer; here it is a hyperparameter, so a layer pattern
  (:mod:`posenc.layers.pattern`) gives it to the long-window kinds only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Dims, Encoding, Params
from posenc.encodings.registry import register
from posenc.encodings.rope import rotate_pairs


def truncated_frequencies(head_dim: int) -> jax.Array:
    """float32 ``[Dh/4]``: ``(1/1024)^linspace(0, 1, Dh/4)``, the rotating pairs' frequencies
    (the stationary half's are 0 and not listed)."""
    return (1.0 / 1024.0) ** jnp.linspace(0.0, 1.0, head_dim // 4, dtype=jnp.float32)


def apply_truncated_rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotates interleaved pair ``j`` of the first half of ``x`` by ``-m omega_j`` (module
    docstring); the second half passes through.

    Args:
      x: ``[B, T, H, Dh]`` queries or keys, ``Dh`` a multiple of 4.
      positions: ``[B|1, T]`` or ``[T]`` integer positions.

    Returns:
      ``[B, T, H, Dh]``, same dtype as ``x``.
    """
    positions = jnp.atleast_2d(positions).astype(jnp.float32)  # [B|1, T]
    angles = -positions[..., None] * truncated_frequencies(x.shape[-1])  # [B|1, T, Dh/4]
    return rotate_pairs(x, angles, layout="interleaved")


def offset_keys(k: jax.Array) -> jax.Array:
    """The key offset: each key's stationary half (channels ``Dh/2 ..``) replaced by the previous
    key's, the first key keeping its own. ``k: [B, S, H, Dh]`` -> same shape."""
    half = k.shape[-1] // 2
    still = k[..., half:]  # [B, S, H, Dh/2]
    shifted = jnp.concatenate([still[:, :1], still[:, :-1]], axis=1)
    return jnp.concatenate([k[..., :half], shifted], axis=-1)


@register
@dataclasses.dataclass(frozen=True)
class TruncatedRoPE(Encoding):
    """modded-nanogpt's rotary (module docstring): a quarter of the pairs' frequencies from 1 to
    1/1024 on the first half of each head, the second half stationary.

    Attributes:
      key_offset: shift each key's stationary half to the next token (the partial key offset
        modded-nanogpt applies on its long-window layers).
    """

    name = "truncated_rope"
    paper = (
        "Jordan et al. 2024-2025, modded-nanogpt (NanoGPT speedrun): half-truncated RoPE with "
        "a partial key offset"
    )
    relative = True

    key_offset: bool = False

    def __post_init__(self):
        if not isinstance(self.key_offset, bool):
            raise ValueError(
                f"encoding.key_offset must be one of [False, True], got {self.key_offset!r}"
            )

    @property
    def key_lookback(self) -> int:
        """How many keys before its own a rotated key reads: 1 with the key offset."""
        return 1 if self.key_offset else 0

    def validate(self, dims: Dims) -> None:
        if dims.head_dim % 4:
            raise ValueError(
                f"truncated_rope rotates the first half of a head in pairs and keeps the second "
                f"half stationary, so it needs a head dimension divisible by 4, got "
                f"{dims.head_dim}; choose model.model_dim / model.num_heads a multiple of 4"
            )

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> rotated (and, with the key offset, the
        keys' stationary halves shifted by one token along the window)."""
        del params
        q, k = apply_truncated_rope(q, q_pos), apply_truncated_rope(k, k_pos)
        return q, offset_keys(k) if self.key_offset else k
