"""xPos: RoPE with a decay by distance (Sun et al. 2022, "A Length-Extrapolatable Transformer",
Sec. 3.2-3.3; torchscale ``component/xpos_relative_position.py``).

Pair ``i`` of the ``d`` rotated channels is rotated as in RoPE (:mod:`posenc.encodings.rope`) and
also scaled: queries at position ``n`` by ``zeta_i^(n / scale_base)`` and keys at position ``m``
by ``zeta_i^(-m / scale_base)``, with::

    zeta_i = (2i/d + gamma) / (1 + gamma),   i = 0 .. d/2 - 1      (gamma = 0.4, scale_base = 512)

so pair ``i`` contributes ``zeta_i^((n - m) / scale_base)`` times its RoPE term to the logit: the
fast pairs (``zeta_i`` near ``gamma / (1 + gamma)``) fade with distance and the slow ones (near 1)
hardly do, which is what stabilises attention past the training length (the paper's
"attention resolution").

Only ``n - m`` matters, so positions are counted from a reference ``c`` shared by queries and
keys, as the reference code does (torchscale centres them, ``-(length + offset) // 2``;
x-transformers subtracts ``(max position + 1) // 2``): ``zeta^((n - c) / scale_base)`` and
``zeta^(-(m - c) / scale_base)``. The encoder takes ``c`` at the centre of each row's key
positions, which keeps every exponent within ``ln(1 / zeta_0) * span / (2 * scale_base)``: about
80 for a 65536-token window, inside float32's range (``exp(88)``), where ``c = 0`` overflows
past about 36000 tokens. The rotation uses ``n - c`` too (the same logits, smaller angles). Both
make the encoder exactly relative: shifting every position moves ``c`` with them.

Hyperparameters: ``scale_base``, ``gamma``, and RoPE's ``base``, ``layout``, ``fraction`` and
scaling modes (``scaling``, ``factor``, ``original_max_len``, ...), which change ``theta_i`` (and
YaRN's temperature multiplies queries and keys) exactly as for RoPE; like RoPE's, the scaling
hyperparameters may change at evaluation. The reference code pairs channels ``(2i, 2i+1)``
(``layout="interleaved"``); the default ``"half"`` matches posenc's RoPE, so that the two
encoders differ only by the decay (the layouts are a fixed permutation of channels that the
learned projections absorb).

Bidirectional attention (``model.causal=False``) keeps the same factors: for a key after the
query (``m > n``) the pair's factor ``zeta_i^((n - m) / scale_base)`` exceeds 1 and grows with the
distance, as torchscale applies xPos in its encoders too (``EncoderConfig.xpos_rel_pos``); the
paper's experiments are causal.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from posenc.encodings.base import Params, check_positive
from posenc.encodings.registry import register
from posenc.encodings.rope import SCALING_HPARAMS, RoPE, rotate_pairs, rotation_setup


def xpos_zeta(d: int, gamma: float = 0.4) -> jax.Array:
    """``[d/2]`` float32: ``zeta_i = (2i/d + gamma) / (1 + gamma)``."""
    return (jnp.arange(0, d, 2, dtype=jnp.float32) / d + gamma) / (1.0 + gamma)


def center(positions: jax.Array) -> jax.Array:
    """``[B|1, 1]``: the reference position of each row, the middle of its span."""
    positions = jnp.atleast_2d(positions)
    return (positions.min(axis=-1, keepdims=True) + positions.max(axis=-1, keepdims=True) + 1) // 2


def apply_xpos(
    x: jax.Array,
    positions: jax.Array,
    *,
    reference: jax.Array | int,
    keys: bool = False,
    scale_base: float = 512.0,
    gamma: float = 0.4,
    base: float = 10000.0,
    layout: str = "half",
    fraction: float = 1.0,
    scaling: str | None = None,
    factor: float = 1.0,
    original_max_len: int | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    attention_factor: float | None = None,
    seq_len: jax.Array | int | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    short_factor: tuple[float, ...] | None = None,
    long_factor: tuple[float, ...] | None = None,
    rotated_frequencies: float | None = None,
) -> jax.Array:
    """Rotates and scales queries (``keys=False``) or keys (``keys=True``) as xPos does.

    Pair ``i`` at position ``p`` turns by ``(p - reference) * theta_i`` and is multiplied by
    ``zeta_i^(+-(p - reference) / scale_base)`` (``+`` for queries, ``-`` for keys), in float32.
    Use the same ``reference`` for the queries and keys of one attention (:func:`center` of the
    keys' positions keeps the exponents smallest); the logits do not depend on it.

    Args:
      x: ``[B, T, H, Dh]`` queries or keys.
      positions: ``[B, T]``, ``[1, T]`` or ``[T]`` integer positions.
      reference: an int, ``[B|1]`` or ``[B|1, 1]`` integer reference position per row.
      keys: scale by ``zeta^(-(p - c) / scale_base)`` (keys) instead of ``zeta^(+...)``.
      scale_base: the decay's length scale (512 in the paper).
      gamma: ``zeta_i = (2i/d + gamma) / (1 + gamma)`` (0.4 in the paper).
      base, layout, fraction, scaling, factor, original_max_len, beta_fast, beta_slow,
        attention_factor, low_freq_factor, high_freq_factor, short_factor, long_factor,
        rotated_frequencies: as :func:`posenc.encodings.rope.apply_rope`.
      seq_len: ``"dynamic"``: the current sequence length; None: the span of ``positions``.

    Returns:
      ``[B, T, H, Dh]``, same dtype as ``x``.
    """
    positions, theta, scale = rotation_setup(
        x,
        positions,
        base=base,
        layout=layout,
        fraction=fraction,
        scaling=scaling,
        factor=factor,
        original_max_len=original_max_len,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        attention_factor=attention_factor,
        seq_len=seq_len,
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        short_factor=short_factor,
        long_factor=long_factor,
        rotated_frequencies=rotated_frequencies,
    )
    reference = jnp.reshape(jnp.asarray(reference, positions.dtype), (-1, 1))  # [B|1, 1]
    relative = (positions - reference).astype(jnp.float32)[..., None]  # [B|1, T, 1]
    power = (-relative if keys else relative) / scale_base  # [B|1, T, 1]
    magnitude = xpos_zeta(2 * theta.shape[-1], gamma) ** power  # [B|1, T, d/2]
    return rotate_pairs(x, relative * theta, layout=layout, magnitude=magnitude, scale=scale)


@register
@dataclasses.dataclass(frozen=True)
class XPos(RoPE):
    """xPos (module docstring): RoPE's rotation and a per-pair decay with distance.

    Attributes:
      scale_base: the decay's length scale (512 in the paper).
      gamma: ``zeta_i = (2i/d + gamma) / (1 + gamma)`` (0.4 in the paper).
      base, layout, fraction, scaling, factor, original_max_len, beta_fast, beta_slow,
        attention_factor: as :class:`posenc.encodings.rope.RoPE`.
    """

    name = "xpos"
    paper = "Sun et al. 2022, A Length-Extrapolatable Transformer"
    relative = True  # only n - m enters (positions are taken from a reference that moves with them)
    eval_safe_hparams = SCALING_HPARAMS  # not RoPE's STRING: xPos's rotation is its own

    scale_base: float = 512.0
    gamma: float = 0.4

    def __post_init__(self):
        super().__post_init__()
        check_positive("encoding.scale_base", self.scale_base)
        check_positive("encoding.gamma", self.gamma)

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> rotated and scaled (queries up, keys
        down) from the centre of each row's key positions."""
        del params
        kwargs = self.rope_kwargs(k_pos)
        kwargs.update(reference=center(k_pos), scale_base=self.scale_base, gamma=self.gamma)
        return apply_xpos(q, q_pos, **kwargs), apply_xpos(k, k_pos, keys=True, **kwargs)
