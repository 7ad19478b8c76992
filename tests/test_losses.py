"""The per-token losses against naive float64 formulas, one token at a time.

``smoothed_token_loss`` is what every translation run trains with. Its docstring states the
convention: ``1 - smoothing`` on the target and ``smoothing / (V - 1)`` on each other id
(tensor2tensor's, Flax's WMT example's and fairseq's, ``eps_i = eps / (V - 1)``), not Szegedy et
al.'s ``smoothing / V`` on every id including the target; the reference here is that sentence
written out, and the training step's mean leaves the padded target positions out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from posenc import kinds
from posenc.models.losses import chunked_token_losses, smoothed_token_loss, token_loss


def _log_softmax64(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def _naive_smoothed(logits: np.ndarray, targets: np.ndarray, smoothing: float) -> np.ndarray:
    """``-sum_v q(v) log p(v)`` per token, ``q`` the docstring's smoothed label, in float64."""
    b, t, v = logits.shape
    out = np.zeros((b, t))
    for i in range(b):
        for j in range(t):
            q = np.full(v, smoothing / (v - 1))
            q[targets[i, j]] = 1.0 - smoothing
            out[i, j] = -(q * _log_softmax64(logits[i, j])).sum()
    return out


def _inputs(seed=0, shape=(3, 5, 11), scale=4.0):
    rng = np.random.default_rng(seed)
    logits = (scale * rng.standard_normal(shape)).astype(np.float32)
    targets = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    return logits, targets


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.35])
def test_smoothed_token_loss_is_the_documented_smoothed_cross_entropy(smoothing):
    logits, targets = _inputs()
    got = np.asarray(smoothed_token_loss(jnp.asarray(logits), jnp.asarray(targets), smoothing))
    assert got.dtype == np.float32 and got.shape == targets.shape
    np.testing.assert_allclose(got, _naive_smoothed(logits, targets, smoothing), rtol=1e-5)


def test_smoothing_spreads_over_the_other_ids_not_all_of_them():
    # The two conventions differ by smoothing / V on the target: a test that could not tell them
    # apart would not pin the documented one.
    logits, targets = _inputs(seed=1)
    smoothing, v = 0.1, logits.shape[-1]
    got = np.asarray(smoothed_token_loss(jnp.asarray(logits), jnp.asarray(targets), smoothing))
    over_all = np.zeros(targets.shape)
    for (i, j), target in np.ndenumerate(targets):
        q = np.full(v, smoothing / v)
        q[target] += 1.0 - smoothing  # Szegedy et al.: (1 - eps) one-hot + eps uniform over V
        over_all[i, j] = -(q * _log_softmax64(logits[i, j])).sum()
    assert np.abs(got - over_all).max() > 1e-3


def test_smoothed_loss_in_bfloat16_logits_is_computed_in_float32():
    logits, targets = _inputs(seed=2)
    low = jnp.asarray(logits, jnp.bfloat16)
    got = np.asarray(smoothed_token_loss(low, jnp.asarray(targets), 0.1))
    expected = _naive_smoothed(np.asarray(low.astype(jnp.float32)), targets, 0.1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, 1.5])
def test_smoothing_outside_0_1_is_refused(smoothing):
    logits, targets = _inputs()
    with pytest.raises(ValueError, match=r"label smoothing must be in \[0, 1\)"):
        smoothed_token_loss(jnp.asarray(logits), jnp.asarray(targets), smoothing)


def test_plain_token_loss_is_the_float64_cross_entropy():
    logits, targets = _inputs(seed=3)
    got = np.asarray(token_loss(jnp.asarray(logits), jnp.asarray(targets)))
    expected = np.array(
        [
            [-_log_softmax64(logits[i, j])[targets[i, j]] for j in range(targets.shape[1])]
            for i in range(targets.shape[0])
        ]
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5)


class _FixedLogits:
    """A stand-in model whose hidden states are fixed logits and whose head is the identity,
    scored two target positions at a time."""

    def __init__(self, logits: np.ndarray):
        self.logits = jnp.asarray(logits)

    def hidden_states(self, src, tgt_in, *, src_mask=None, rng=None):
        return self.logits

    def token_losses(self, hidden, targets, **options):
        rows = targets.shape[0]
        return chunked_token_losses(hidden, targets, lambda x: x, chunk=2 * rows, **options)


def test_the_translation_step_averages_the_smoothed_loss_over_real_target_tokens_only():
    # The translation kind's loss with a stand-in model returning fixed logits: the padded
    # positions (tgt_mask 0) must not count, whatever their logits and targets.
    logits, targets = _inputs(seed=4, shape=(2, 6, 9))
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.int32)
    logits[0, 4:] = 50.0 * np.random.default_rng(5).standard_normal((2, 9))  # huge, if read
    batch = {
        "src": jnp.zeros((2, 3), jnp.int32),
        "src_mask": jnp.ones((2, 3), jnp.int32),
        "tgt_in": jnp.zeros((2, 6), jnp.int32),
        "tgt_out": jnp.asarray(targets),
        "tgt_mask": jnp.asarray(mask),
    }
    config = ml_collections.ConfigDict({"train": {"label_smoothing": 0.1}})
    step = kinds.get("translation").loss(config, _FixedLogits(logits), batch, jax.random.key(0))
    loss, loss_sum = step.mean, step.loss_sum
    real = mask.astype(bool)
    expected = _naive_smoothed(logits, targets, 0.1)[real].mean()
    plain = np.array(
        [-_log_softmax64(logits[i, j])[targets[i, j]] for i, j in np.argwhere(real)]
    ).sum()
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(loss_sum), plain, rtol=1e-5)
