"""Scoring a retrieval output, and RULER's effective context length.

- ``first_integer`` (Landmark Attention's passkey test): the first run of decimal digits in the
  output, read as an integer, must equal the key: 1 or 0.
- ``all`` (RULER's ``string_match_all``): the share of expected strings found in the output,
  case-insensitively, as substrings (partial credit for multi-value and multi-query needles).
- ``part`` (RULER's ``string_match_part``): 1 if any expected string is found, else 0.

A trial is ``correct`` when its score is 1. The effective length (RULER, Sec. 4) is the longest
evaluated length up to which the average score stays above a threshold (strictly: RULER's
"exceeds"); RULER's threshold is Llama-2-7B's average at 4k, 85.6 (%).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# RULER's threshold: Llama-2-7B's average over its 13 tasks at 4k (Table 3), in percent.
RULER_THRESHOLD = 85.6

_DIGITS = re.compile(r"\d+")


def score_output(metric: str, output: str, answers: Sequence[str]) -> float:
    """The score in [0, 1] of ``output`` against the expected ``answers`` (module docstring).

    Raises:
      ValueError: an unknown metric or no answers.
    """
    if not answers:
        raise ValueError("a retrieval trial needs at least one expected answer")
    if metric == "first_integer":
        found = _DIGITS.search(output)
        return float(found is not None and int(found.group()) == int(answers[0]))
    hits = [a.lower() in output.lower() for a in answers]
    if metric == "all":
        return sum(hits) / len(hits)
    if metric == "part":
        return float(any(hits))
    raise ValueError(f"retrieval metric must be first_integer, all or part, got {metric!r}")


def effective_length(
    averages: Mapping[int, float], threshold: float = RULER_THRESHOLD
) -> int | None:
    """The longest length ``L`` such that every evaluated length ``<= L`` averages above
    ``threshold`` (percent); None when the shortest does not.

    Args:
      averages: ``{length: average score in percent}``.
      threshold: in percent.
    """
    best = None
    for length in sorted(averages):
        if not averages[length] > threshold:  # NaN (no trials) fails too
            break
        best = length
    return best
