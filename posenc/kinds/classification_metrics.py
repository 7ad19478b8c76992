"""The GLUE metrics of sequence classification and regression (Wang et al. 2019), per task.

GLUE scores each task with the metrics its paper names, which the RoFormer and BERT tables
report: accuracy for most tasks, accuracy and F1 of the positive class for MRPC and QQP,
Matthews correlation for CoLA, Pearson and Spearman correlation for STS-B. Accuracy, F1 and
Matthews correlation are computed from the confusion matrix here (their definitions are one
line each, and the counts are what a report sums); Pearson and Spearman are SciPy's
(``scipy.stats``), the implementation GLUE's own scorer and Hugging Face's ``evaluate`` use.

Every function takes whole-split arrays on the host (NumPy), never per-batch means, so the
numbers are exact.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# GLUE task -> the metrics its leaderboard reports (the first is the table's headline number).
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "mnli": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": ("matthews",),
}
# What a task GLUE does not name reports: classes or a regression.
CLASSIFICATION_METRICS = ("accuracy", "f1", "matthews")
REGRESSION_METRICS = ("pearson", "spearman", "mse")


def confusion(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """The ``[num_classes, num_classes]`` count matrix, rows true class, columns predicted."""
    labels, predictions = np.asarray(labels, np.int64), np.asarray(predictions, np.int64)
    counts = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts


def accuracy(labels: np.ndarray, predictions: np.ndarray) -> float:
    """The share of predictions equal to the label (0 for no examples)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    return float((labels == predictions).mean()) if labels.size else 0.0


def f1(labels: np.ndarray, predictions: np.ndarray, positive: int = 1) -> float:
    """F1 of class ``positive`` (GLUE's MRPC and QQP: class 1, "equivalent" / "duplicate"):
    ``2 tp / (2 tp + fp + fn)``; 0 when there is neither a positive label nor prediction
    (scikit-learn's ``zero_division=0``)."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    tp = int(((labels == positive) & (predictions == positive)).sum())
    fp = int(((labels != positive) & (predictions == positive)).sum())
    fn = int(((labels == positive) & (predictions != positive)).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def matthews(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> float:
    """Matthews correlation coefficient (CoLA), in its multiclass form (Gorodkin 2004), which
    for two classes is ``(tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn))``; 0 when a
    denominator factor is 0 (every prediction one class), as scikit-learn returns."""
    c = confusion(labels, predictions, num_classes).astype(np.float64)
    n = c.sum()
    correct = np.trace(c)
    true_k, pred_k = c.sum(axis=1), c.sum(axis=0)
    cov = correct * n - true_k @ pred_k
    denominator = math.sqrt((n * n - pred_k @ pred_k) * (n * n - true_k @ true_k))
    return float(cov / denominator) if denominator else 0.0


def pearson(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Pearson correlation (STS-B); NaN when either side is constant or has < 2 values."""
    from scipy import stats

    labels, predictions = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
    if labels.size < 2 or np.ptp(labels) == 0 or np.ptp(predictions) == 0:
        return math.nan
    return float(stats.pearsonr(labels, predictions).statistic)


def spearman(labels: np.ndarray, predictions: np.ndarray) -> float:
    """Spearman rank correlation (STS-B; ties get their mean rank); NaN as :func:`pearson`."""
    from scipy import stats

    labels, predictions = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
    if labels.size < 2 or np.ptp(labels) == 0 or np.ptp(predictions) == 0:
        return math.nan
    return float(stats.spearmanr(labels, predictions).statistic)


def classification_metrics(
    labels: np.ndarray, predictions: np.ndarray, num_classes: int
) -> dict[str, float]:
    """Accuracy, Matthews correlation and, for two classes, F1 of class 1."""
    out = {
        "accuracy": accuracy(labels, predictions),
        "matthews": matthews(labels, predictions, num_classes),
    }
    if num_classes == 2:
        out["f1"] = f1(labels, predictions)
    return out


def regression_metrics(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """Pearson, Spearman and the mean squared error."""
    labels, predictions = np.asarray(labels, np.float64), np.asarray(predictions, np.float64)
    mse = float(((labels - predictions) ** 2).mean()) if labels.size else math.nan
    return {
        "pearson": pearson(labels, predictions),
        "spearman": spearman(labels, predictions),
        "mse": mse,
    }


def glue_task(spec: str) -> str | None:
    """The GLUE task of a data spec (``tfds:glue/mrpc`` -> ``"mrpc"``), None for others."""
    name = spec.removeprefix("tfds:").split(":")[0]
    family, _, task = name.partition("/")
    return task if family == "glue" and task in GLUE_METRICS else None


def headline(spec: str, regression: bool) -> str:
    """The metric a table reports first for data ``spec``: GLUE's for a GLUE task, else
    Pearson for a regression and accuracy for classes."""
    task = glue_task(spec)
    if task is not None:
        return GLUE_METRICS[task][0]
    return "pearson" if regression else "accuracy"


def metrics(
    labels: np.ndarray, predictions: np.ndarray, *, num_classes: int | None
) -> dict[str, Any]:
    """Every metric of the kind (``num_classes`` None: a regression) plus the example count."""
    if num_classes is None:
        out = regression_metrics(labels, predictions)
    else:
        out = classification_metrics(labels, predictions, num_classes)
    return {"examples": int(np.asarray(labels).size), **out}
