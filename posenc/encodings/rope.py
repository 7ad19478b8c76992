"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer", Sec. 3.4), and its scaling at
evaluation.

Each pair of query/key channels ``(x_a, x_b)`` is rotated by the angle ``m * theta_i`` where
``m`` is the token's position and ``theta_i = base^(-2i/d)``, ``i = 0 .. d/2 - 1``::

    [x_a']   [cos(m theta_i)  -sin(m theta_i)] [x_a]
    [x_b'] = [sin(m theta_i)   cos(m theta_i)] [x_b]

so that ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on positions only through ``n - m``.
Two layouts pair the channels differently:

- ``"interleaved"`` (the paper, Eq. 34): pairs ``(x_{2i}, x_{2i+1})``;
- ``"half"`` (GPT-NeoX, LLaMA): pairs ``(x_i, x_{i + d/2})``.

Partial rotation, in two conventions that must not be confused:

- ``fraction < 1`` (GPT-NeoX's ``rotary_pct``, Hugging Face's ``partial_rotary_factor`` with the
  default RoPE): only the first ``d = 2 * floor(fraction * Dh / 2)`` channels of each head are
  rotated, with frequencies *recomputed over those channels*, ``theta_i = base^(-2i/d)``; the
  other channels pass through unchanged.
- ``rotated_frequencies = p`` (p-RoPE, Barbero et al. 2025, "Round and Round We Go! What makes
  Rotary Positional Encodings useful?", Sec. 6; Gemma 4's global layers, Hugging Face's
  ``"proportional"`` RoPE): the frequencies are those of the *whole head*,
  ``theta_i = base^(-2i/Dh)``, ``i = 0 .. Dh/2 - 1``; the ``k = floor(p * Dh / 2)`` highest
  (``i < k``) rotate and the ``Dh/2 - k`` lowest are set to 0, so their pairs are left
  unrotated. In the ``"half"`` layout the unrotated pairs are ``(x_i, x_{i + Dh/2})`` for
  ``i >= k``: the rotated channels are not a prefix of the head. ``p = 1`` is plain RoPE.

For the same share of rotated channels the two differ: ``fraction=0.25`` rotates 16 of 64
channels at ``base^(-2i/16)`` (the fastest pair at 1, the slowest at ``base^(-14/16)``), while
``rotated_frequencies=0.25`` rotates 16 of 64 at ``base^(-2i/64)`` (the fastest at 1, the slowest
at ``base^(-14/64)``, near 1/7.5 for base 10000: only the fast quarter of plain RoPE's spectrum).
Setting both is refused.

Scaling (context extension without retraining)
----------------------------------------------

A model trained on windows of ``L = original_max_len`` tokens is evaluated on longer ones with
the frequencies changed as Hugging Face's ``rope_scaling`` names them (``s = factor``):

- ``"linear"`` — position interpolation (Chen et al. 2023, *Extending Context Window of Large
  Language Models via Positional Interpolation*, Eq. 2): position ``m`` becomes ``m / s``, written
  as ``theta_i / s`` (the same angles).
- ``"ntk"`` — static NTK-aware scaling (bloc97 2023, "NTK-Aware Scaled RoPE"; Peng et al. 2023,
  *YaRN*, Sec. 3.1): ``base' = base * s^(d / (d - 2))``, which leaves the fastest pair as it is
  and interpolates the slowest by ``s``.
- ``"dynamic"`` — dynamic NTK (emozilla 2023; Hugging Face's ``dynamic``; YaRN Sec. 3.3): the
  NTK base for the current sequence length ``l``:
  ``base' = base * (s * l / L - (s - 1))^(d / (d - 2))`` when ``l > L``, no scaling for
  ``l <= L``. (With ``s = 1`` this is the YaRN paper's ``s = max(1, l / L)``.) Here ``l`` is the
  number of positions the keys span, ``max(k_pos) - min(k_pos) + 1`` per batch row: for a window
  starting at 0, as evaluation's are, that is Hugging Face's ``max(position_ids) + 1`` and the
  YaRN code's key length, and it keeps the encoder relative (shifting all positions changes
  nothing).
- ``"yarn"`` — Peng et al. 2023, *YaRN: Efficient Context Window Extension of Large Language
  Models* (Sec. 3.2 "NTK-by-parts" and 3.4). Pair ``i`` turns ``r_i = L theta_i / (2 pi)`` times
  over the training window. Pairs turning more than ``beta_fast`` (32) times keep ``theta_i``
  (extrapolation), those turning fewer than ``beta_slow`` (1) times get ``theta_i / s``
  (interpolation), and in between a linear ramp::

      i(beta) = d ln(L / (2 pi beta)) / (2 ln base)     the pair index where r_i = beta
      lo = max(floor(i(beta_fast)), 0),   hi = min(ceil(i(beta_slow)), d - 1)
      gamma_i = 1 - clip((i - lo) / (hi - lo), 0, 1)
      theta'_i = gamma_i theta_i + (1 - gamma_i) theta_i / s

  This is the authors' code (``jquesnelle/yarn``, ``scaled_rope/LlamaYaRNScaledRotaryEmbedding.py``
  ``find_correction_range`` and ``linear_ramp_mask``; Hugging Face ``_compute_yarn_parameters``),
  including its ``d - 1`` clamp and ``hi + 0.001`` when ``hi == lo``: the ramp is linear in the
  pair index between the two boundary pairs, where the paper's Eq. writes it linear in ``r``;
  the boundaries, and so which pairs extrapolate and which interpolate, are the same. Queries and
  keys are then multiplied by the attention temperature ``sqrt(1/t) = 0.1 ln(s) + 1`` (Eq. 22;
  ``attention_factor`` overrides it), so the logits are divided by ``t``. The whole head is
  multiplied, as the paper's logits ``q.k / (t sqrt(D))`` say (with ``fraction < 1`` Hugging Face
  multiplies only the rotated channels).

- ``"llama3"`` — Llama 3.1's frequency bands (fast pairs kept, slow ones divided by ``s``, a
  smooth blend between; ``low_freq_factor``, ``high_freq_factor``) and ``"longrope"`` —
  LongRoPE's searched per-pair factors (``short_factor`` up to ``L``, ``long_factor`` beyond,
  chosen by the keys' span as dynamic NTK's length; an attention factor
  ``sqrt(1 + ln s / ln L)``): :mod:`posenc.encodings.rope_bands`.

STRING (an option at evaluation)
--------------------------------

An et al. 2024, *Why Does the Effective Context Length of LLMs Fall Short?* (official code
``HKUNLP/STRING``): the distances a model saw least in training are the longest, so at inference
STRING scores every pair at distance ``d = i - j >= S`` as if it were ``d - S + W`` apart, a
distance that was well trained, and leaves the nearer pairs as they are::

    P[i, j] = i - j              if i - j < S
    P[i, j] = i - j - S + W      if i - j >= S          (0 <= W < S; the paper: S ~ L/3, W = 128)

``string_shift = S`` turns it on (None, the default, is RoPE exactly: no hook is added) and
``string_window = W``. Both are ``eval_safe_hparams``, so ``posenc eval`` may set them on any
RoPE run or imported RoPE model (``encoding.hparams.string_shift=...``). The encoder then has a
``content_logits`` hook: given the rotated ``q`` and ``k``, the logit at the shifted distance is
``(R_{-(S-W)} q) . k`` (the rotated query turned back by ``S - W`` positions with the same,
scaled, frequencies), so the hook adds ``(R_{-(S-W)} q - q) . k`` to the pairs ``d >= S``. This
runs on every path that takes content logits (einsum, blocked, xla, the key/value cache) with
any scaling whose frequencies do not depend on the window's length (not dynamic or longrope).
Where the sources differ, posenc follows the paper's matrix: the official code's two
flash-attention calls (a sliding window ``[i - S, i]`` and the shifted queries against keys
``j <= i - S``) count the pair at ``d = S`` in both, and its rotary tables multiply queries and
keys by ``0.1 ln 2 + 1``, which the paper's matrix does not say; posenc scores each pair once
and adds no factor. STRING is defined for causal attention (the model refuses it with
``model.causal=False``).

``scaling=None`` (the default) is plain RoPE, computed exactly as before these options existed;
it refuses the other scaling hyperparameters away from their defaults (``factor`` without
``scaling`` would be ignored, yet recorded in the run and its reports' names). A hyperparameter
a scaling mode does not use is ignored, as in ``rope_scaling``. All of them are
``eval_safe_hparams``: ``posenc eval`` may change them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from posenc.encodings.base import Dims, Encoding, Params, check_choice, check_positive
from posenc.encodings.registry import register
from posenc.encodings.rope_bands import (
    check_factors,
    llama3_frequencies,
    longrope_attention_factor,
    longrope_frequencies,
)

LAYOUTS = ("half", "interleaved")
SCALINGS = (None, "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
# The hyperparameters of scaling, all safe to change at evaluation.
SCALING_HPARAMS = (
    "scaling",
    "factor",
    "original_max_len",
    "beta_fast",
    "beta_slow",
    "attention_factor",
    "low_freq_factor",
    "high_freq_factor",
    "short_factor",
    "long_factor",
)
# The scaling hyperparameters' defaults: the only values plain RoPE (scaling=None) accepts.
_UNSCALED = dict(
    factor=1.0,
    original_max_len=None,
    beta_fast=32.0,
    beta_slow=1.0,
    attention_factor=None,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    short_factor=None,
    long_factor=None,
)
# Modes that need the training length, and modes whose base exponent d / (d - 2) needs d > 2.
_NEED_ORIGINAL = ("dynamic", "yarn", "llama3", "longrope")
NEEDS_ORIGINAL = _NEED_ORIGINAL  # read by evaluation, which defaults it to the training length
_NTK = ("ntk", "dynamic")
# Modes whose frequencies depend on the window's length (the keys' span).
_WINDOWED = ("dynamic", "longrope")
# STRING's hyperparameters (safe to change at evaluation: it is an inference-time method), and
# the local window W's default (the paper's 128).
STRING_HPARAMS = ("string_shift", "string_window")
_STRING_WINDOW = 128


def rotary_dims(head_dim: int, fraction: float = 1.0) -> int:
    """How many channels of a head RoPE rotates: the even number ``2 * floor(fraction*Dh/2)``."""
    return 2 * int(fraction * head_dim // 2)


def kept_pairs(d: int, rotated_frequencies: float) -> int:
    """p-RoPE's ``k = floor(p * d / 2)``: how many of the ``d/2`` pairs (the fastest) rotate."""
    return int(rotated_frequencies * d // 2)


def check_rotated_frequencies(
    rotated_frequencies: float | None,
    fraction: float,
    head_dim: int | None = None,
    *,
    allow_none_rotated: bool = False,
) -> None:
    """One-line errors for p-RoPE's ``rotated_frequencies``: in ``(0, 1]``, not combined with
    ``fraction < 1`` (the other convention), and (given ``head_dim``) rotating at least one
    pair. With ``allow_none_rotated`` (the functions, and the ``p_rope`` encoder) ``[0, 1]``
    and a share that rotates no pair are accepted: nothing turns, as NoPE."""
    if rotated_frequencies is None:
        return
    share = rotated_frequencies
    above = _is_number(share) and (share >= 0.0 if allow_none_rotated else share > 0.0)
    if not (above and share <= 1.0):
        interval = "[0, 1]" if allow_none_rotated else "(0, 1]"
        raise ValueError(
            f"encoding.rotated_frequencies must be a number in {interval} (p-RoPE's share of the "
            f"head's frequencies that rotate) or None, got {rotated_frequencies!r}"
        )
    if fraction != 1.0:
        raise ValueError(
            f"encoding.fraction={fraction!r} and encoding.rotated_frequencies="
            f"{rotated_frequencies!r} are two conventions of partial rotation (GPT-NeoX's "
            "rotary_pct, frequencies over the rotated channels; p-RoPE's, frequencies of the "
            "whole head); set one of them"
        )
    if allow_none_rotated:
        return
    if head_dim is not None and kept_pairs(rotary_dims(head_dim), rotated_frequencies) < 1:
        raise ValueError(
            f"encoding.rotated_frequencies={rotated_frequencies!r} rotates no pair of a head of "
            f"{head_dim} channels (floor(p * {rotary_dims(head_dim)} / 2) = 0); use a larger "
            "share, or encoding.name=nope for no rotation"
        )


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_scaling(
    scaling: str | None,
    factor: float,
    original_max_len: int | None,
    beta_fast: float,
    beta_slow: float,
    attention_factor: float | None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    short_factor: tuple[float, ...] | None = None,
    long_factor: tuple[float, ...] | None = None,
) -> None:
    """Raises a one-line ``ValueError`` naming the first bad scaling hyperparameter."""
    check_choice("encoding.scaling", scaling, SCALINGS)
    if not (_is_number(factor) and factor >= 1):
        raise ValueError(f"encoding.factor must be a number >= 1 (the extension s), got {factor!r}")
    if original_max_len is not None and not (
        isinstance(original_max_len, int)
        and not isinstance(original_max_len, bool)
        and original_max_len >= 1
    ):
        raise ValueError(
            "encoding.original_max_len must be a positive integer (the training length) or None, "
            f"got {original_max_len!r}"
        )
    if scaling in _NEED_ORIGINAL and original_max_len is None:
        raise ValueError(
            f"encoding.scaling={scaling!r} needs encoding.original_max_len (the training length), "
            "got None"
        )
    check_positive("encoding.beta_fast", beta_fast)
    check_positive("encoding.beta_slow", beta_slow)
    if not beta_fast > beta_slow:
        raise ValueError(
            f"encoding.beta_fast must be greater than encoding.beta_slow (rotations over the "
            f"training length; YaRN uses 32 and 1), got {beta_fast!r} and {beta_slow!r}"
        )
    if attention_factor is not None:
        check_positive("encoding.attention_factor", attention_factor)
    check_positive("encoding.low_freq_factor", low_freq_factor)
    check_positive("encoding.high_freq_factor", high_freq_factor)
    if not high_freq_factor > low_freq_factor:
        raise ValueError(
            "encoding.high_freq_factor must be greater than encoding.low_freq_factor (Llama 3.1 "
            f"uses 4 and 1), got {high_freq_factor!r} and {low_freq_factor!r}"
        )
    if scaling == "longrope":
        check_factors(short_factor, long_factor)
    given = (
        factor,
        original_max_len,
        beta_fast,
        beta_slow,
        attention_factor,
        low_freq_factor,
        high_freq_factor,
        short_factor,
        long_factor,
    )
    if scaling is None:  # plain RoPE would ignore them, and the run would record them
        for name, value in zip(SCALING_HPARAMS[1:], given, strict=True):
            if value != _UNSCALED[name]:
                raise ValueError(
                    f"encoding.{name}={value!r} has no effect without encoding.scaling (plain "
                    f"RoPE); set encoding.scaling to one of {list(SCALINGS[1:])} or leave "
                    f"encoding.{name} at {_UNSCALED[name]!r}"
                )


def check_rope(
    head_dim: int,
    fraction: float,
    scaling: str | None = None,
    layout: str = "half",
    short_factor: tuple[float, ...] | None = None,
) -> int:
    """The number of rotated channels ``d``; raises a ``ValueError`` if it is unusable."""
    check_choice("encoding.layout", layout, LAYOUTS)
    d = rotary_dims(head_dim, fraction)
    if d < 2:
        raise ValueError(
            f"RoPE rotates pairs of channels but a head of {head_dim} channels with "
            f"encoding.fraction={fraction} leaves {d}; use a larger head or fraction"
        )
    if scaling in _NTK and d < 4:
        raise ValueError(
            f"encoding.scaling={scaling!r} scales the base by s^(d / (d - 2)), which needs at "
            f"least 4 rotated channels per head; this head rotates {d}"
        )
    if scaling == "longrope" and len(short_factor) != d // 2:
        raise ValueError(
            f"encoding.short_factor and encoding.long_factor need one factor per rotated pair: "
            f"{d // 2} for this head ({d} rotated channels), got {len(short_factor)}"
        )
    return d


def check_string(string_shift: int | None, string_window: int, scaling: str | None) -> None:
    """One-line errors for STRING's ``string_shift`` ``S`` and ``string_window`` ``W``:
    integers, ``0 <= W < S``, ``W`` at its default while ``S`` is unset, and no scaling whose
    frequencies depend on the window's length (the hook sees one tile's positions)."""

    def integer(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if string_shift is None:
        if string_window != _STRING_WINDOW:
            raise ValueError(
                f"encoding.string_window={string_window!r} has no effect without "
                f"encoding.string_shift (STRING is off); set encoding.string_shift or leave "
                f"encoding.string_window at {_STRING_WINDOW}"
            )
        return
    if not (integer(string_shift) and string_shift >= 1):
        raise ValueError(
            "encoding.string_shift must be a positive integer (STRING's shift S: distances >= S "
            f"are scored at d - S + W) or None, got {string_shift!r}"
        )
    if not (integer(string_window) and 0 <= string_window < string_shift):
        raise ValueError(
            "encoding.string_window must be an integer in [0, encoding.string_shift) (STRING's "
            f"local window W < S={string_shift}), got {string_window!r}"
        )
    if scaling in _WINDOWED:
        raise ValueError(
            f"encoding.string_shift with encoding.scaling={scaling!r}: that scaling's frequencies "
            "depend on the whole window, which STRING's tiles do not see; use another scaling"
        )


def span(positions: jax.Array) -> jax.Array:
    """``[B|1]``: the number of positions each row spans, ``max - min + 1`` (dynamic NTK's
    current sequence length)."""
    positions = jnp.atleast_2d(positions)
    return positions.max(axis=-1) - positions.min(axis=-1) + 1


def _yarn_gamma(
    d: int, base: float, original_max_len: int, beta_fast: float, beta_slow: float
) -> np.ndarray:
    """float64 ``[d/2]``: 1 where pair ``i`` extrapolates (keeps ``theta_i``), 0 where it
    interpolates (``theta_i / s``), the authors' linear ramp in between (module docstring)."""

    def pair_index(rotations: float) -> float:  # the i where L theta_i / (2 pi) == rotations
        return d * math.log(original_max_len / (2 * math.pi * rotations)) / (2 * math.log(base))

    lo = max(math.floor(pair_index(beta_fast)), 0)
    hi = min(math.ceil(pair_index(beta_slow)), d - 1)
    if hi == lo:
        hi += 0.001  # as the YaRN code: a step rather than a division by zero
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0.0, 1.0)
    return 1.0 - ramp


def rope_frequencies(
    d: int,
    *,
    base: float = 10000.0,
    scaling: str | None = None,
    factor: float = 1.0,
    original_max_len: int | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    seq_len: jax.Array | int | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    short_factor: tuple[float, ...] | None = None,
    long_factor: tuple[float, ...] | None = None,
) -> jax.Array:
    """The float32 rotation frequencies ``theta_i`` of ``d`` rotated channels, after scaling.

    Args:
      d: rotated channels (even).
      base: ``theta_i = base^(-2i/d)`` before scaling.
      scaling, factor, original_max_len, beta_fast, beta_slow: see the module docstring.
      seq_len: ``"dynamic"`` and ``"longrope"`` only: the current sequence length, an int or
        ``[B|1]``.
      low_freq_factor, high_freq_factor: ``"llama3"``'s band edges
        (:mod:`posenc.encodings.rope_bands`).
      short_factor, long_factor: ``"longrope"``'s per-pair rescale factors, ``d/2`` each.

    Returns:
      ``[d/2]``, or ``[B|1, 1, d/2]`` for ``"dynamic"`` and ``"longrope"`` (one set per batch
      row), so that ``positions[..., None] * theta`` is ``[B|1, T, d/2]`` either way.
    """
    exponents = -jnp.arange(0, d, 2, dtype=jnp.float32) / d  # -2i/d
    if scaling == "ntk":
        base = base * factor ** (d / (d - 2))
    theta = base**exponents
    if scaling == "linear":
        return theta / factor
    if scaling == "yarn":
        gamma = _yarn_gamma(d, base, original_max_len, beta_fast, beta_slow)
        return theta * jnp.asarray(gamma + (1.0 - gamma) / factor, jnp.float32)
    if scaling == "llama3":
        return llama3_frequencies(
            theta, factor, original_max_len, low_freq_factor, high_freq_factor
        )
    if scaling in _WINDOWED and seq_len is None:
        raise ValueError(f"encoding.scaling={scaling!r} needs the current sequence length")
    if scaling == "longrope":
        return longrope_frequencies(theta, short_factor, long_factor, original_max_len, seq_len)
    if scaling == "dynamic":
        length = jnp.reshape(jnp.asarray(seq_len, jnp.float32), (-1, 1, 1))  # [B|1, 1, 1]
        stretch = factor * length / original_max_len - (factor - 1)
        scaled = (base * stretch ** (d / (d - 2))) ** exponents  # [B|1, 1, d/2]
        return jnp.where(length > original_max_len, scaled, theta)
    return theta


def attention_scale(
    scaling: str | None,
    factor: float,
    attention_factor: float | None = None,
    original_max_len: int | None = None,
) -> float | None:
    """What multiplies queries and keys: YaRN's ``sqrt(1/t) = 0.1 ln(s) + 1``, LongRoPE's
    ``sqrt(1 + ln s / ln L)``, or ``attention_factor`` for either; None for the other modes."""
    if scaling not in ("yarn", "longrope"):
        return None
    if attention_factor is not None:
        return float(attention_factor)
    if scaling == "longrope":
        return longrope_attention_factor(factor, original_max_len)
    return 0.1 * math.log(factor) + 1.0


def rotate_pairs(
    x: jax.Array,
    angles: jax.Array,
    *,
    layout: str = "half",
    magnitude: jax.Array | None = None,
    scale: float | None = None,
) -> jax.Array:
    """Rotates pair ``i`` of the first ``d = 2 * angles.shape[-1]`` channels of ``x``.

    In float32, cast back to ``x.dtype``; the other channels pass through.

    Args:
      x: ``[B, T, H, Dh]``.
      angles: ``[B|1, T, d/2]`` float32.
      layout: ``"half"`` or ``"interleaved"`` (module docstring).
      magnitude: ``[B|1, T, d/2]``: pair ``i`` is also multiplied by ``magnitude[..., i]`` (xPos).
      scale: the whole head is also multiplied by it (YaRN's temperature).

    Returns:
      ``[B, T, H, Dh]``, same dtype as ``x``.
    """
    d = 2 * angles.shape[-1]
    cos = jnp.cos(angles)[:, :, None, :]  # [B|1, T, 1, d/2]
    sin = jnp.sin(angles)[:, :, None, :]
    if magnitude is not None:
        cos = cos * magnitude[:, :, None, :]
        sin = sin * magnitude[:, :, None, :]
    dtype = x.dtype
    if scale is not None:
        x = x.astype(jnp.float32) * scale  # one rounding to x's dtype, at the end
    rot, rest = x[..., :d].astype(jnp.float32), x[..., d:]
    if layout == "interleaved":
        pairs = rot.reshape(*rot.shape[:-1], d // 2, 2)  # [B, T, H, d/2, 2]
        a, b = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
        out = out.reshape(rot.shape)  # [B, T, H, d]
    else:
        a, b = rot[..., : d // 2], rot[..., d // 2 :]
        out = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return jnp.concatenate([out.astype(dtype), rest.astype(dtype)], axis=-1)


def apply_rope(
    x: jax.Array,
    positions: jax.Array,
    *,
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
    resonance_below: float | None = None,
) -> jax.Array:
    """Rotates the channels of ``x`` by position-dependent angles.

    Angles are computed in float32 from the integer positions, the rotation in float32, and the
    result cast back to ``x.dtype``.

    Args:
      x: ``[B, T, H, Dh]`` queries or keys.
      positions: ``[B, T]``, ``[1, T]`` or ``[T]`` integer positions.
      base: ``theta_i = base^(-2i/d)``; 10000 in the paper, 500000 (LLaMA 3) or 1e6 in newer LLMs.
      layout: ``"half"`` or ``"interleaved"`` (see the module docstring).
      fraction: fraction of each head's channels to rotate, with frequencies over them
        (GPT-NeoX's ``rotary_pct``).
      scaling: None, ``"linear"``, ``"ntk"``, ``"dynamic"``, ``"yarn"``, ``"llama3"`` or
        ``"longrope"`` (module docstring).
      factor: the extension ``s >= 1``.
      original_max_len: the training length ``L`` (all but ``"linear"`` and ``"ntk"``).
      beta_fast, beta_slow: YaRN's ramp boundaries, in rotations over ``L``.
      attention_factor: YaRN's ``sqrt(1/t)`` (None: ``0.1 ln(s) + 1``) or LongRoPE's (None:
        ``sqrt(1 + ln s / ln L)``).
      seq_len: ``"dynamic"``, ``"longrope"``: the current sequence length (an int or ``[B|1]``);
        None: the span of ``positions`` per row. Pass the keys' span when rotating queries and
        keys separately.
      low_freq_factor, high_freq_factor: ``"llama3"``'s band edges (1 and 4).
      short_factor, long_factor: ``"longrope"``'s per-pair factors (``d/2`` each).
      rotated_frequencies: p-RoPE's ``p``: frequencies of the whole head, the fastest
        ``floor(p * Dh / 2)`` pairs rotated and the rest left unrotated; None: every pair (module
        docstring). Not with ``fraction < 1``. 0 rotates nothing (NoPE).
      resonance_below: Resonance RoPE: the (scaled) wavelengths shorter than it rounded to
        integers (:func:`resonance_frequencies`; ``inf``: all); None: none.

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
        resonance_below=resonance_below,
    )
    angles = positions.astype(jnp.float32)[..., None] * theta  # [B|1, T, d/2]
    return rotate_pairs(x, angles, layout=layout, scale=scale)


def rotation_setup(
    x: jax.Array,
    positions: jax.Array,
    *,
    base: float,
    layout: str,
    fraction: float,
    scaling: str | None,
    factor: float,
    original_max_len: int | None,
    beta_fast: float,
    beta_slow: float,
    attention_factor: float | None,
    seq_len: jax.Array | int | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    short_factor: tuple[float, ...] | None = None,
    long_factor: tuple[float, ...] | None = None,
    rotated_frequencies: float | None = None,
    resonance_below: float | None = None,
) -> tuple[jax.Array, jax.Array, float]:
    """What RoPE and xPos share before rotating: the hyperparameters checked, ``positions`` as
    ``[B|1, T]``, the (scaled) frequencies ``theta`` ``[B|1 or 1, d/2]`` and the attention
    scale of the scaling mode. With ``resonance_below`` (Resonance RoPE) the scaled wavelengths
    shorter than it are rounded to integers (:func:`resonance_frequencies`); with
    ``rotated_frequencies`` (p-RoPE) the lowest frequencies of ``theta`` are then 0 (module
    docstring)."""
    bands = dict(
        low_freq_factor=low_freq_factor,
        high_freq_factor=high_freq_factor,
        short_factor=short_factor,
        long_factor=long_factor,
    )
    check_scaling(
        scaling, factor, original_max_len, beta_fast, beta_slow, attention_factor, **bands
    )
    d = check_rope(x.shape[-1], fraction, scaling, layout, short_factor)
    positions = jnp.atleast_2d(positions)  # [B|1, T]
    if scaling in _WINDOWED and seq_len is None:
        seq_len = span(positions)
    theta = rope_frequencies(
        d,
        base=base,
        scaling=scaling,
        factor=factor,
        original_max_len=original_max_len,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        seq_len=seq_len,
        **bands,
    )
    if resonance_below is not None:
        theta = resonance_frequencies(theta, resonance_below)
    if rotated_frequencies is not None:
        check_rotated_frequencies(
            rotated_frequencies, fraction, x.shape[-1], allow_none_rotated=True
        )
        theta = jnp.where(jnp.arange(d // 2) < kept_pairs(d, rotated_frequencies), theta, 0.0)
    return positions, theta, attention_scale(scaling, factor, attention_factor, original_max_len)


def resonance_frequencies(theta: jax.Array, below: float) -> jax.Array:
    """Resonance RoPE's frequencies (Wang et al. 2024; :mod:`posenc.encodings.resonance`): each
    wavelength ``lambda_i = 2 pi / theta_i`` shorter than ``below`` rounded to the nearest
    integer, ``theta_i -> 2 pi / round(lambda_i)``; the others (and a frequency of 0, p-RoPE's
    unrotated pairs) kept. ``below = inf`` rounds every wavelength, as the official code does.

    Args:
      theta: float32 frequencies, after any scaling (``[d/2]`` or ``[B|1, 1, d/2]``).
      below: the wavelength (in tokens) under which wavelengths are rounded.

    Returns:
      float32 frequencies of ``theta``'s shape.
    """
    wavelength = 2 * math.pi / theta  # inf where theta is 0
    rounded = 2 * math.pi / jnp.maximum(jnp.round(wavelength), 1.0)
    return jnp.where(wavelength < below, rounded, theta).astype(jnp.float32)


@register
@dataclasses.dataclass(frozen=True)
class RoPE(Encoding):
    """Rotary position embedding applied to queries and keys in every layer.

    Attributes:
      base: ``theta_i = base^(-2i/d)``.
      layout: ``"half"`` (GPT-NeoX/LLaMA) or ``"interleaved"`` (the paper).
      fraction: fraction of each head's channels that are rotated, in ``(0, 1]``, with the
        frequencies recomputed over them (GPT-NeoX's ``rotary_pct``).
      rotated_frequencies: p-RoPE's ``p`` in ``(0, 1]``: the frequencies of the whole head, the
        fastest ``floor(p * Dh / 2)`` pairs rotated, the rest unrotated (Barbero et al. 2025;
        Gemma 4); None: plain RoPE. The other convention of partial rotation; not with
        ``fraction < 1``.
      scaling: None, ``"linear"``, ``"ntk"``, ``"dynamic"``, ``"yarn"``, ``"llama3"`` or
        ``"longrope"`` (module docstring).
      factor: the extension ``s >= 1`` of the scaling.
      original_max_len: the training length ``L`` (needed by all but linear and ntk).
      beta_fast, beta_slow: YaRN's ramp boundaries (32 and 1, rotations over ``L``).
      attention_factor: YaRN's ``sqrt(1/t)`` (None: ``0.1 ln(s) + 1``) or LongRoPE's (None:
        ``sqrt(1 + ln s / ln L)``).
      low_freq_factor, high_freq_factor: Llama 3.1's band edges (1 and 4).
      short_factor, long_factor: LongRoPE's per-pair rescale factors.
      string_shift: STRING's shift ``S`` (module docstring): pairs ``S`` or more tokens apart
        are scored at distance ``d - S + W``; None (the default): off, plain RoPE.
      string_window: STRING's local window ``W``, ``0 <= W < S`` (128 in the paper).
    """

    name = "rope"
    paper = "Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding"
    relative = True
    eval_safe_hparams = SCALING_HPARAMS + STRING_HPARAMS

    base: float = 10000.0
    layout: str = "half"
    fraction: float = 1.0
    scaling: str | None = None
    factor: float = 1.0
    original_max_len: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    rotated_frequencies: float | None = None
    string_shift: int | None = None
    string_window: int = 128

    def __post_init__(self):
        check_positive("encoding.base", self.base)
        check_choice("encoding.layout", self.layout, LAYOUTS)
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"encoding.fraction must be in (0, 1], got {self.fraction!r}")
        check_rotated_frequencies(self.rotated_frequencies, self.fraction)
        for name in ("short_factor", "long_factor"):  # lists from JSON configs, hashable
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        check_scaling(*(getattr(self, name) for name in SCALING_HPARAMS))
        check_string(self.string_shift, self.string_window, self.scaling)
        if self.string_shift is not None and type(self).rotate is not RoPE.rotate:
            raise ValueError(
                f"encoding.string_shift={self.string_shift!r}: STRING turns queries back by "
                f"RoPE's rotation, which encoding {self.name!r} replaces with its own; use it "
                "with rope (or an encoder that keeps RoPE's rotation)"
            )

    def validate(self, dims: Dims) -> None:
        if self.fraction == 1.0 and dims.head_dim % 2:
            raise ValueError(
                f"RoPE rotates channel pairs and cannot rotate a head dimension of "
                f"{dims.head_dim} (odd); choose model.model_dim / model.num_heads even, or set "
                "encoding.fraction < 1 to rotate only part of each head"
            )
        check_rope(dims.head_dim, self.fraction, self.scaling, short_factor=self.short_factor)
        check_rotated_frequencies(self.rotated_frequencies, self.fraction, dims.head_dim)

    @classmethod
    def describe_eval(cls, changes: dict[str, Any], train_len: int) -> str:
        """``yarn x8`` for ``scaling="yarn", factor=8`` (``original_max_len`` unsaid when it is
        the training length), ``string S=42 W=8`` for STRING, then any other change as
        ``name=value``."""
        rest = dict(changes)
        heads = []
        scaling = rest.pop("scaling", None)
        if scaling:
            head = scaling
            if "factor" in rest:
                head += f" x{rest.pop('factor'):g}"
            if rest.get("original_max_len") == train_len:
                rest.pop("original_max_len")
            heads.append(head)
        shift = rest.pop("string_shift", None)
        if shift is not None:
            window = rest.pop("string_window", cls.string_window)
            heads.append(f"string S={shift} W={window}")
        if not heads:
            return super().describe_eval(changes, train_len)
        return ", ".join(heads + ([super().describe_eval(rest, train_len)] if rest else []))

    def check_causal(self, causal: bool) -> None:
        super().check_causal(causal)
        if not causal and self.string_shift is not None:
            raise ValueError(
                f"model.causal=False: encoding.string_shift={self.string_shift!r} (STRING) is "
                "defined for causal attention only (it shifts the distances of earlier keys); "
                "use model.causal=True or leave encoding.string_shift unset"
            )

    def check_cacheable(self) -> None:
        # Dynamic NTK's (and LongRoPE's) one length for the whole window changes the frequencies
        # of every token as the window grows, so the keys and values of layers after the first,
        # cached at shorter lengths, are not what a full pass computes.
        if self.scaling in _WINDOWED:
            raise ValueError(
                f"encoding.scaling={self.scaling!r}: {self.name!r} cannot be decoded with a "
                "key/value cache (the window's length changes every token's frequencies); use "
                "posenc.decoding.lm.greedy_generate_reference or another scaling"
            )

    def rope_kwargs(self, k_pos: jax.Array) -> dict:
        """The keyword arguments of :func:`apply_rope` for attention over keys at ``k_pos``."""
        kwargs = dict(base=self.base, layout=self.layout, fraction=self.fraction)
        kwargs.update((name, getattr(self, name)) for name in SCALING_HPARAMS)
        if self.rotated_frequencies is not None:  # absent when unset: the call is as before
            kwargs["rotated_frequencies"] = self.rotated_frequencies
        if self.scaling in _WINDOWED:
            kwargs["seq_len"] = span(k_pos)  # one length for queries and keys
        return kwargs

    def rotate(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` -> both rotated by their positions."""
        del params  # fixed frequencies; learned rotary variants read theirs from here
        kwargs = self.rope_kwargs(k_pos)
        return apply_rope(q, q_pos, **kwargs), apply_rope(k, k_pos, **kwargs)

    @property
    def content_logits(self):
        """STRING's hook (:meth:`string_logits`) when ``string_shift`` is set; None otherwise,
        so that plain RoPE has no ``content_logits`` and keeps its paths (``hooks``)."""
        return self.string_logits if self.string_shift is not None else None

    def string_logits(
        self, params: Params, q: jax.Array, k: jax.Array, q_pos: jax.Array, k_pos: jax.Array
    ) -> jax.Array:
        """STRING's correction to the rotated logits (module docstring), unscaled, float32
        ``[B, H, T, S]``: for a pair ``d = q_pos - k_pos >= S`` apart, ``(R q - q) . k`` where
        ``R`` turns the rotated query back by ``S - W`` positions, so that ``q . k`` plus this is
        the logit at distance ``d - S + W``; 0 for the other pairs.

        ``q: [B, T, H, Dh]``, ``k: [B, S, H, Dh]`` (both rotated), positions ``[B|1, T]`` and
        ``[B|1, S]`` (one tile's on the blocked path: it reads them through its arguments).
        """
        del params
        _, theta, _ = rotation_setup(q, q_pos, **self.rope_kwargs(k_pos))  # theta: [d/2]
        back = -(self.string_shift - self.string_window) * theta  # [d/2]
        angles = jnp.broadcast_to(back, (1, q.shape[1], back.shape[-1]))  # [1, T, d/2]
        q32 = q.astype(jnp.float32)  # the turn in float32, not in q's dtype
        moved = rotate_pairs(q32, angles, layout=self.layout) - q32  # [B, T, H, Dh]
        delta = jnp.einsum(
            "BTHD,BSHD->BHTS", moved, k.astype(jnp.float32), preferred_element_type=jnp.float32
        )
        far = (q_pos[:, :, None] - k_pos[:, None, :]) >= self.string_shift  # [B|1, T, S]
        return jnp.where(far[:, None], delta, 0.0)
