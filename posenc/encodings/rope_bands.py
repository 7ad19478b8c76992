"""RoPE scalings that rescale each frequency by its own factor: Llama 3.1's frequency bands and
LongRoPE's per-pair factors. :mod:`posenc.encodings.rope` applies them (``scaling="llama3"``,
``scaling="longrope"``); this module holds their formulas.

Llama 3.1 (Meta 2024, *The Llama 3 Herd of Models*; Meta's ``apply_scaling`` in
``llama/models/llama3/reference_impl/model.py``; Hugging Face ``_compute_llama3_parameters``).
With ``L = original_max_len``, wavelength ``w_i = 2 pi / theta_i`` and the band edges
``w_high = L / high_freq_factor`` (4) and ``w_low = L / low_freq_factor`` (1)::

    theta'_i = theta_i                              w_i < w_high   (fast pairs: unchanged)
    theta'_i = theta_i / s                          w_i > w_low    (slow pairs: interpolated)
    theta'_i = (1 - a_i) theta_i / s + a_i theta_i  otherwise, a_i = (L / w_i - low) / (high - low)

LongRoPE (Ding et al. 2024, *LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens*,
Sec. 3; Phi-3's ``rope_scaling``; Hugging Face ``_compute_longrope_parameters``): each pair has
its own rescale factor ``lambda_i`` found by search, one set for windows up to the training
length (``short_factor``) and one beyond it (``long_factor``)::

    theta'_i = theta_i / lambda_i,   lambda = long_factor if l > L else short_factor

where ``l`` is the current sequence length (the span of the keys' positions, as dynamic NTK's),
and queries and keys are multiplied by ``sqrt(1 + ln s / ln L)`` (``s = factor``, the extension;
1 when ``s <= 1``) unless ``attention_factor`` is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp


def llama3_frequencies(
    theta: jax.Array,
    factor: float,
    original_max_len: int,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> jax.Array:
    """``theta [d/2]`` float32 -> Llama 3.1's scaled frequencies ``[d/2]`` (module docstring)."""
    wavelen = 2 * math.pi / theta
    low_wavelen = original_max_len / low_freq_factor
    high_wavelen = original_max_len / high_freq_factor
    scaled = jnp.where(wavelen > low_wavelen, theta / factor, theta)
    smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def longrope_frequencies(
    theta: jax.Array,
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_len: int,
    seq_len: jax.Array | int,
) -> jax.Array:
    """``theta [d/2]`` -> ``[B|1, 1, d/2]``: divided by the long factors in rows whose
    ``seq_len`` (an int or ``[B|1]``) exceeds ``original_max_len``, by the short ones
    otherwise."""
    length = jnp.reshape(jnp.asarray(seq_len, jnp.float32), (-1, 1, 1))  # [B|1, 1, 1]
    short = jnp.asarray(short_factor, jnp.float32)
    long = jnp.asarray(long_factor, jnp.float32)
    return theta / jnp.where(length > original_max_len, long, short)


def longrope_attention_factor(factor: float, original_max_len: int) -> float:
    """LongRoPE's default ``sqrt(1 + ln s / ln L)`` (1 for ``s <= 1``)."""
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_len))


def check_factors(short_factor, long_factor) -> None:
    """Raises a one-line ``ValueError`` unless both are equally long sequences of positive
    numbers (LongRoPE's rescale factors)."""
    for name, value in (("short_factor", short_factor), ("long_factor", long_factor)):
        ok = isinstance(value, list | tuple) and len(value) > 0
        ok = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        if not ok or min(value) <= 0:
            raise ValueError(
                f"encoding.{name} must be a list of positive numbers (one rescale factor per "
                f"rotated channel pair) for encoding.scaling='longrope', got {value!r}"
            )
    if len(short_factor) != len(long_factor):
        raise ValueError(
            f"encoding.short_factor and encoding.long_factor must be equally long (one factor "
            f"per rotated channel pair), got {len(short_factor)} and {len(long_factor)}"
        )
