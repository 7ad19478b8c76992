"""Run kinds: one module per kind of run behind the run-kind contract.

- :mod:`posenc.kinds.base`: the contract (:class:`RunKind`) and what it exchanges with the
  generic machinery (:class:`TrainingData`, :class:`StepLoss`, :class:`EvalContext`,
  :class:`Command`).
- :mod:`posenc.kinds.registry`: names -> kinds, filled from this package and the
  ``posenc.kinds`` entry points; :func:`kind_of` chooses a config's kind.
- one module per kind: causal LM, masked LM, translation, classification, synthetic tasks;
  :mod:`posenc.kinds.stream`, the exact scoring of a token stream in windows that causal and
  masked LM runs evaluate.

Below the run machinery (:mod:`posenc.runs`), above the models and data.
"""

from posenc.kinds.base import Command, EvalContext, RunKind, StepLoss, TrainingData
from posenc.kinds.registry import get, kind_of, kinds, names, register, require

__all__ = [
    "Command",
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
