"""GLUE metrics against examples worked by hand (and scikit-learn's, where installed)."""

import math

import numpy as np
import pytest

from posenc.kinds import classification_metrics as cm

# tp = 2 (rows 0, 4), fn = 1 (row 1), tn = 1 (row 2), fp = 1 (row 3).
LABELS = np.array([1, 1, 0, 0, 1])
PREDS = np.array([1, 0, 0, 1, 1])


def test_binary_metrics_by_hand():
    assert cm.accuracy(LABELS, PREDS) == pytest.approx(3 / 5)
    assert cm.f1(LABELS, PREDS) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    # (tp tn - fp fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (2 - 1) / sqrt(3 * 3 * 2 * 2)
    assert cm.matthews(LABELS, PREDS, 2) == pytest.approx(1 / 6)


def test_multiclass_matthews_by_hand():
    # confusion rows [1,0,0], [0,0,1], [0,1,1]: n = 4, trace 2, row and column sums (1, 1, 2);
    # (2 * 4 - 6) / sqrt((16 - 6) (16 - 6)) = 0.2
    assert cm.matthews([0, 1, 2, 2], [0, 2, 2, 1], 3) == pytest.approx(0.2)


def test_degenerate_cases_match_sklearn_conventions():
    assert cm.matthews([0, 1, 1], [1, 1, 1], 2) == 0.0  # one predicted class
    assert cm.f1([0, 0], [0, 0]) == 0.0  # no positive label nor prediction
    assert math.isnan(cm.pearson([1, 2, 3], [2, 2, 2]))


def test_correlations_by_hand():
    # x = 1, 2, 3 and y = 1, 2, 4: cov sum 3, sum dx^2 = 2, sum dy^2 = 42/9.
    assert cm.pearson([1, 2, 3], [1, 2, 4]) == pytest.approx(3 / math.sqrt(2 * 42 / 9))
    assert cm.spearman([1, 2, 3], [1, 2, 4]) == pytest.approx(1.0)
    # Tied ranks (1, 2.5, 2.5, 4) against (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5).
    assert cm.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))


def test_metrics_per_kind_and_glue_headline():
    out = cm.metrics(LABELS, PREDS, num_classes=2)
    assert out["examples"] == 5 and set(out) == {"examples", "accuracy", "matthews", "f1"}
    reg = cm.metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]), num_classes=None)
    assert reg["mse"] == pytest.approx(1 / 3)
    assert cm.headline("tfds:glue/cola", False) == "matthews"
    assert cm.headline("tfds:glue/stsb", True) == "pearson"
    assert cm.headline("tsv:/data/x", False) == "accuracy"


def test_against_sklearn_when_installed():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 3, 50), rng.integers(0, 3, 50)
    assert cm.matthews(y, p, 3) == pytest.approx(metrics.matthews_corrcoef(y, p))
    y, p = y % 2, p % 2
    assert cm.f1(y, p) == pytest.approx(metrics.f1_score(y, p))
