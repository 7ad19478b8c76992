"""Attention analysis of trained runs: attention weight and logit by relative distance, and the
entropy of attention rows, per layer and head, at the training length and beyond it.

- :mod:`posenc.analysis.stats`: the statistics of one layer (:func:`attention_sums`) and of a
  model (:func:`model_attention_sums`), exact (the encoder's own hooks, as
  :mod:`posenc.attention.core` applies them) and computed in query blocks.
- :mod:`posenc.analysis.run`: ``posenc analyze``, over a run's evaluation windows
  (:func:`analyze_workdir`).
- :mod:`posenc.analysis.output`: its tables and plots.
"""

from posenc.analysis.output import summary_lines, write_analysis
from posenc.analysis.run import analyze, analyze_workdir, check_analyzable
from posenc.analysis.stats import AttentionSums, attention_sums, model_attention_sums

__all__ = [
    "AttentionSums",
    "analyze",
    "analyze_workdir",
    "attention_sums",
    "check_analyzable",
    "model_attention_sums",
    "summary_lines",
    "write_analysis",
]
