"""p-RoPE (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu, Veličković, ICLR 2025, "Round and
Round We Go! What makes Rotary Positional Encodings useful?", Sec. 6).

RoPE's frequencies over the whole head, ``g_i = base^(-2i/Dh)``, ``i = 0 .. Dh/2 - 1``, with
the lowest-frequency fraction ``1 - p`` of the pairs set to 0::

    theta_i = g_i   for i <  floor(p * Dh / 2)       (the fastest pairs rotate)
    theta_i = 0     for i >= floor(p * Dh / 2)       (the slowest are left unrotated)

so pair ``i`` of a query at ``m`` and a key at ``n`` meets at the angle ``(m - n) theta_i``: the
unrotated pairs are a position-free channel the model can use for semantics, which the paper
argues the slowest RoPE frequencies were only approximating (and which breaks down past the
training length). ``p = 1`` is RoPE and ``p = 0`` is NoPE (no pair turns). The frequencies are
those of the whole head, not recomputed over the rotated channels: this is not GPT-NeoX's
``rotary_pct`` (RoPE's ``fraction``). The paper gives ``floor`` nowhere explicitly for a share that
does not divide the pairs; posenc keeps ``floor(p * Dh / 2)`` pairs, as Gemma's and Hugging
Face's ``"proportional"`` RoPE do.

This is :class:`posenc.encodings.rope.RoPE` with its ``rotated_frequencies`` convention set to
``p`` (module docstring there), so it composes with the rest of RoPE: ``layout``, ``base``, the
scalings at evaluation (which change ``g_i`` of the rotating pairs; the unrotated stay at 0), and
STRING. The paper's code is not public; its formula is transcribed here.
"""

from __future__ import annotations

import dataclasses

import jax

from posenc.encodings.registry import register
from posenc.encodings.rope import RoPE, _is_number


@register
@dataclasses.dataclass(frozen=True)
class PRoPE(RoPE):
    """p-RoPE (module docstring): the fastest ``floor(p * Dh / 2)`` pairs rotate.

    Attributes:
      p: the share of the head's frequencies that rotate, in ``[0, 1]`` (1: RoPE; 0: NoPE);
        0.75 is the paper's best Gemma 2B setting.
      base, layout, scaling, factor, original_max_len, ...: as :class:`~posenc.encodings.rope.RoPE`
        (``fraction`` and ``rotated_frequencies`` stay at their defaults: ``p`` is the share).
    """

    name = "p_rope"
    paper = (
        "Barbero et al. 2025 (ICLR), Round and Round We Go! What makes Rotary Positional "
        "Encodings useful?"
    )

    p: float = 0.75

    def __post_init__(self):
        super().__post_init__()
        if not (_is_number(self.p) and 0.0 <= self.p <= 1.0):
            raise ValueError(
                "encoding.p must be a number in [0, 1] (the share of the head's frequencies that "
                f"rotate; 1: RoPE, 0: NoPE), got {self.p!r}"
            )
        if self.rotated_frequencies is not None:
            raise ValueError(
                f"encoding.rotated_frequencies={self.rotated_frequencies!r}: p_rope's share is "
                "encoding.p; leave encoding.rotated_frequencies at None"
            )
        if self.fraction != 1.0:
            raise ValueError(
                f"encoding.fraction={self.fraction!r}: p_rope takes the frequencies of the whole "
                "head (encoding.p is its share); leave encoding.fraction at 1.0"
            )

    def rope_kwargs(self, k_pos: jax.Array) -> dict:
        kwargs = super().rope_kwargs(k_pos)
        kwargs["rotated_frequencies"] = self.p
        return kwargs
