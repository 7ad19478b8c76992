"""Run kinds: one module per kind of run behind the run-kind contract.

- :mod:`posenc.kinds.base`: the contract (:class:`RunKind`) and what it exchanges with the
  generic machinery (:class:`TrainingData`, :class:`StepLoss`, :class:`EvalContext`).
- :mod:`posenc.kinds.registry`: names -> kinds, filled from this package and the
  ``posenc.kinds`` entry points; :func:`kind_of` chooses a config's kind.
- one module per kind: causal LM, masked LM, translation, classification, synthetic tasks.

Below the run machinery (:mod:`posenc.runs`), above the models and data.
"""

from posenc.kinds.base import EvalContext, RunKind, StepLoss, TrainingData
from posenc.kinds.registry import get, kind_of, kinds, names, register, require

__all__ = [
    "EvalContext",
    "RunKind",
    "StepLoss",
    "TrainingData",
    "get",
    "kind_of",
    "kinds",
    "names",
    "register",
    "require",
]
