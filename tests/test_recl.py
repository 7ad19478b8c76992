"""RECL (Dai et al. 2019, Appendix C) against a hand-worked example and a naive transcription,
and the per-context losses it is computed from."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.analysis.recl import context_losses, recl, relative_gains
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer

# Two models, four targets, contexts 10, 15, 20 (rows).
A = np.array([[2.0, 1.0, 3.0, 0.5], [1.5, 1.0, 2.0, 0.5], [1.2, 0.9, 2.0, 0.5]])
B = np.array([[2.5, 0.8, 3.0, 0.4]] * 3)


def _naive_recl(losses, start, delta, r, threshold=0.01):
    """The definition, loop by loop (float64 Python)."""
    names = list(losses)
    k_count, n = losses[names[0]].shape
    out = {}
    for name in names:
        k = 0
        while k + 1 < k_count:
            best = [min(losses[m][k][t] for m in names) for t in range(n)]
            order = sorted(range(n), key=lambda t: (-best[t], t))
            hard = order[: math.ceil(r * n)]
            f_same = sum(best[t] for t in hard) / len(hard)
            f_longer = sum(min(best[t], losses[name][k + 1][t]) for t in hard) / len(hard)
            gain = (math.exp(f_same) - math.exp(f_longer)) / math.exp(f_same)
            if gain < threshold:
                break
            k += 1
        out[name] = start + k * delta
    return out


def test_hand_worked_example():
    # r = 0.5: the two hardest under b(10, .) = [2, .8, 3, .4] are targets 2 and 0, f = 2.5;
    # A at 15 gives min(3, 2), min(2, 1.5): 1.75, gain 1 - e^-0.75; B gains nothing. From 15,
    # b = [1.5, .8, 2, .4], hardest 2 and 0 again (1.75); A at 20: min(2, 2), min(1.5, 1.2): 1.6.
    gains = relative_gains({"A": A, "B": B}, r=0.5)
    np.testing.assert_allclose(gains["A"], [1 - math.exp(-0.75), 1 - math.exp(-0.15)])
    np.testing.assert_allclose(gains["B"], [0.0, 0.0], atol=1e-15)
    assert recl({"A": A, "B": B}, start=10, delta=5, r=0.5) == {"A": 20, "B": 10}
    # A threshold above the second gain stops A at 15.
    assert recl({"A": A, "B": B}, start=10, delta=5, r=0.5, threshold=0.2) == {"A": 15, "B": 10}
    # r = 0.25: target 2 alone; A gains at the first step (3 -> 2), not at the second (2 -> 2).
    assert recl({"A": A, "B": B}, start=10, delta=5, r=0.25) == {"A": 15, "B": 10}
    # r = 1: all four targets; mean b(10, .) = 1.55, A at 15: 1.175, then 1.175 -> 1.1.
    gains = relative_gains({"A": A, "B": B}, r=1.0)
    np.testing.assert_allclose(gains["A"], [1 - math.exp(-0.375), 1 - math.exp(-0.075)])


@pytest.mark.parametrize("r", [0.1, 0.5, 1.0])
def test_random_groups_match_the_naive_transcription(r):
    rng = np.random.default_rng(0)
    for _ in range(20):
        losses = {m: rng.uniform(0, 5, (6, 30)) for m in "abc"}
        losses["b"] = np.sort(losses["b"], axis=0)[::-1]  # one model that keeps improving
        expected = _naive_recl(losses, 32, 16, r)
        assert recl(losses, start=32, delta=16, r=r) == expected


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="r .* must be in"):
        recl({"A": A}, start=10, delta=5, r=0.0)
    with pytest.raises(ValueError, match="delta"):
        recl({"A": A}, start=10, delta=0, r=0.5)
    with pytest.raises(ValueError, match=r"\[K, N\]"):
        recl({"A": A, "B": B[:2]}, start=10, delta=5, r=0.5)


@pytest.mark.slow
def test_context_losses_score_each_target_with_exactly_c_tokens():
    cfg = ModelConfig(
        vocab_size=32, num_layers=2, model_dim=16, num_heads=2, mlp_dim=32, dtype="float32"
    )
    model = Transformer(cfg, encodings.get("xl"), rngs=nnx.Rngs(0))
    stream = np.asarray(jax.random.randint(jax.random.key(2), (40,), 0, 32), np.uint16)
    targets = [12, 20, 39]
    got = context_losses(model, stream, targets, [3, 10], batch_tokens=20)
    for i, c in enumerate([3, 10]):
        windows = np.stack([stream[t - c : t] for t in targets]).astype(np.int32)  # [3, c]
        logits = np.asarray(model(windows)[:, -1], np.float64)  # [3, V]
        top = logits.max(-1)
        expected = np.log(np.exp(logits - top[:, None]).sum(-1)) + top
        expected -= logits[np.arange(3), stream[targets]]
        np.testing.assert_allclose(got[i], expected, rtol=1e-5)
    # Read as segments of 4 with memory holding all of the context: the same numbers (the memory
    # equivalence), although no pass sees more than 4 queries.
    segmented = context_losses(model, stream, targets, [3, 10], segment_len=4, batch_tokens=20)
    np.testing.assert_allclose(segmented, got, rtol=2e-5)
    # A fixed-context model scores longer contexts with its own.
    capped = context_losses(model, stream, targets, [3, 10], max_context=3, batch_tokens=20)
    np.testing.assert_allclose(capped[1], got[0], rtol=1e-6)
    with pytest.raises(ValueError, match="targets must be"):
        context_losses(model, stream, [5], [10])
