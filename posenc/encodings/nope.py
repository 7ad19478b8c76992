"""No positional encoding (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers"; Haviv et al. 2022).

A causal decoder can infer position from the mask alone, so NoPE provides no hook at all:
attention runs plain causal attention, on the fused kernel where one is available.
"""

from __future__ import annotations

import dataclasses

from posenc.encodings.base import Encoding
from posenc.encodings.registry import register


@register
@dataclasses.dataclass(frozen=True)
class NoPE(Encoding):
    """No positional information beyond the causal mask."""

    name = "nope"
    paper = "Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization"
    relative = True
