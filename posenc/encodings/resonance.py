"""Resonance RoPE (Wang, Kobyzev, Lu, Rezagholizadeh, Liu 2024, "Resonance RoPE: Improving
Context Length Generalization of Large Language Models"; official code ``sheryc/resonance_rope``).

RoPE's pair ``i`` turns with wavelength ``lambda_i = 2 pi / theta_i`` tokens, rarely an integer,
so past the training length ``L`` it meets angles (phases) it never saw in training. Resonance
RoPE rounds the wavelengths to integers::

    lambda~_i = round(2 pi / theta_i),     theta~_i = 2 pi / lambda~_i

so a pair with ``lambda~_i <= L`` repeats, at every later position, exactly the angles it had
within the training window (the paper's pre-critical dimensions: no feature gap there). The
longer wavelengths are barely changed by the rounding (relative change below ``1 / (2 L)``).

What posenc transcribes, where the paper and the code leave room:

- Which pairs are rounded: the official code rounds *every* wavelength (``resonance_register``:
  ``r_wavelengths = torch.round(2 * math.pi / inv_freq)`` over all pairs), which is the default
  here (``train_len=None``). The paper's analysis concerns the wavelengths shorter than the
  training length; ``train_len = L`` rounds only those (``lambda_i < L``) and keeps the others.
- With a RoPE scaling (Resonance-YaRN, the paper's Sec. 4.2): the code first computes the scaled
  frequencies (YaRN's, NTK's, dynamic NTK's at the current length) and then rounds them (*scale,
  then round*); posenc does the same for every scaling of :mod:`posenc.encodings.rope` (linear,
  llama3 and longrope too, which the code does not combine: its "resonance-linear" rotary class
  adds no rounding). So the wavelengths the model sees at evaluation are integers, and a
  training length ``train_len`` compares against the scaled wavelengths.
- Angles are computed as RoPE's, ``m * theta~_i`` in float32; the code reduces ``m`` modulo
  ``lambda~_i`` first (the same angle, exact in float32 at any position). The two differ by
  float32 rounding of ``m * theta~_i`` (about ``m * 6e-8`` radians), not in float64.

This is :class:`posenc.encodings.rope.RoPE` with Resonance's rounding
(:func:`~posenc.encodings.rope.resonance_frequencies`) inside RoPE's frequencies, so it composes
with RoPE's layout, base, ``rotated_frequencies``, scalings at evaluation and STRING.
"""

from __future__ import annotations

import dataclasses
import math

import jax

from posenc.encodings.registry import register
from posenc.encodings.rope import RoPE


@register
@dataclasses.dataclass(frozen=True)
class Resonance(RoPE):
    """RoPE with its (scaled) wavelengths rounded to integers (module docstring).

    Attributes:
      train_len: only wavelengths shorter than this (the training length ``L``, in tokens) are
        rounded; None (the default) rounds every wavelength, as the official code does. It
        changes what is trained, so evaluation may not change it.
      base, layout, scaling, factor, original_max_len, ...: as :class:`~posenc.encodings.rope.RoPE`.
    """

    name = "resonance"
    paper = (
        "Wang et al. 2024, Resonance RoPE: Improving Context Length Generalization of Large "
        "Language Models"
    )

    train_len: int | None = None

    def __post_init__(self):
        super().__post_init__()
        ok = isinstance(self.train_len, int) and not isinstance(self.train_len, bool)
        if self.train_len is not None and not (ok and self.train_len >= 1):
            raise ValueError(
                "encoding.train_len must be a positive integer (the training length: shorter "
                f"wavelengths are rounded) or None (round every wavelength), got {self.train_len!r}"
            )

    def rope_kwargs(self, k_pos: jax.Array) -> dict:
        kwargs = super().rope_kwargs(k_pos)
        kwargs["resonance_below"] = math.inf if self.train_len is None else float(self.train_len)
        return kwargs
