"""CAPE (Likhomanenko et al. 2021) against explicit float64 transcriptions: x' = (x + Delta +
eps_n) * lambda with Delta ~ U[-g, g] per row, eps_n ~ U[-e/2, e/2] per position, log lambda ~
U[-log s, log s] per row, in training only; sin/cos(x * freq_scale * 10000^(-2i/D)); and its
training key, a pure function of (seed, step) also without dropout."""

from __future__ import annotations

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.encodings import Dims
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer
from posenc.runs.config import apply_overrides, load_config

BASE = pathlib.Path(__file__).resolve().parents[2] / "configs" / "base.py"
D = 8
DIMS = Dims(num_heads=2, head_dim=4, model_dim=D)


def _cape(**hparams):
    return encodings.get("cape", **hparams).bind(DIMS)


def _positions(b=3, t=10):
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.float32), (b, t))


def test_embedding_is_the_papers_sinusoid_at_continuous_positions():
    enc = _cape(freq_scale=0.5)
    x = np.array([[0.0, 0.25, 1.7, -3.2, 40.5]])
    got = np.asarray(enc.embed({}, jnp.asarray(x, jnp.float32)), np.float64)
    expected = np.zeros((1, 5, D))
    for n in range(5):
        for i in range(D // 2):
            freq = 0.5 * 10000.0 ** (-2 * i / D)
            expected[0, n, 2 * i] = math.sin(x[0, n] * freq)
            expected[0, n, 2 * i + 1] = math.cos(x[0, n] * freq)
    np.testing.assert_allclose(got, expected, atol=2e-5)


def test_global_shift_alone_moves_each_row_by_one_bounded_amount():
    enc = _cape(max_global_shift=3.0, max_local_shift=0.0, max_global_scaling=1.0)
    x = _positions()
    moved = np.asarray(enc.augment_positions({}, x, jax.random.key(0)), np.float64) - np.asarray(x)
    assert np.allclose(moved, moved[:, :1]) and (np.abs(moved) <= 3.0).all()
    assert len(set(np.round(moved[:, 0], 6))) == 3  # one draw per row


def test_local_shifts_alone_move_each_position_within_half_of_max_local_shift():
    enc = _cape(max_global_shift=0.0, max_local_shift=0.8, max_global_scaling=1.0, pos_scale=2.0)
    x = _positions(4, 50)
    moved = np.asarray(enc.augment_positions({}, x, jax.random.key(1)), np.float64)
    shift = moved - 2.0 * np.asarray(x)  # pos_scale scales positions and the local shift
    assert (np.abs(shift) <= 0.8 * 2.0 / 2 + 1e-6).all() and np.abs(shift).max() > 0.6
    assert np.unique(np.round(shift, 6)).size == shift.size  # one draw per position


def test_global_scaling_alone_is_one_log_uniform_factor_per_row():
    enc = _cape(max_global_shift=0.0, max_local_shift=0.0, max_global_scaling=1.5)
    x = _positions() + 1.0
    ratio = np.asarray(enc.augment_positions({}, x, jax.random.key(2)), np.float64) / np.asarray(x)
    assert np.allclose(ratio, ratio[:, :1], rtol=1e-6)
    assert (ratio >= 1 / 1.5 - 1e-6).all() and (ratio <= 1.5 + 1e-6).all()


def test_full_augmentation_centres_shifts_then_scales():
    """With the draws taken from the same key (in the hook's order: global, local, scale), the
    result is ((x - mean x) + Delta + eps) * lambda, in float64."""
    enc = _cape(max_global_shift=4.0, max_local_shift=0.5, max_global_scaling=1.2, normalize=True)
    x, key = _positions(2, 7), jax.random.key(3)
    got = np.asarray(enc.augment_positions({}, x, key), np.float64)
    r_global, r_local, r_scale = jax.random.split(key, 3)
    delta = np.asarray(jax.random.uniform(r_global, (2, 1), jnp.float32, -4.0, 4.0), np.float64)
    eps = np.asarray(jax.random.uniform(r_local, (2, 7), jnp.float32, -0.25, 0.25), np.float64)
    log_l = math.log(1.2)
    lam = np.exp(np.asarray(jax.random.uniform(r_scale, (2, 1), jnp.float32, -log_l, log_l)))
    xs = np.asarray(x, np.float64)
    expected = (xs - xs.mean(1, keepdims=True) + delta + eps) * lam
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # At evaluation: only the centring.
    evaluation = np.asarray(enc.augment_positions({}, x, None))
    np.testing.assert_allclose(evaluation, xs - 3.0, atol=1e-6)


def tiny_config(*overrides):
    """``configs/base.py:tiny`` shrunk to one float32 layer of width 32."""
    shrink = ("model.num_layers=1", "model.model_dim=32", "model.num_heads=2", "model.mlp_dim=64",
              "model.dtype=float32", "train.seq_len=16")  # fmt: skip
    return apply_overrides(load_config(f"{BASE}:tiny"), [*shrink, *overrides])


@nnx.jit
def _run(model, tokens, rng=None):
    return model(tokens, rng=rng)


def _model(name, **hparams):
    config = ModelConfig(vocab_size=32, num_layers=1, model_dim=D, num_heads=2, mlp_dim=16,
                         dtype="float32")  # fmt: skip
    return Transformer(config, encodings.get(name, **hparams), rngs=nnx.Rngs(0))


def test_evaluation_uses_plain_positions_and_training_keys_augment():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (2, 9)), jnp.int32)
    cape, vaswani = _model("cape"), _model("sinusoidal")  # the same weights (same init order)
    np.testing.assert_allclose(
        np.asarray(_run(cape, tokens)), np.asarray(_run(vaswani, tokens)), atol=1e-5
    )
    key = jax.random.key(5)
    trained = np.asarray(_run(cape, tokens, key))
    np.testing.assert_array_equal(trained, np.asarray(_run(cape, tokens, key)))
    assert np.abs(trained - np.asarray(_run(cape, tokens))).max() > 1e-3
    # Other encoders: a key with dropout 0 changes nothing, bit for bit.
    np.testing.assert_array_equal(
        np.asarray(_run(vaswani, tokens, key)), np.asarray(_run(vaswani, tokens))
    )


def test_the_training_key_is_a_function_of_seed_and_step_even_without_dropout():
    from posenc.runs.train import Trainer

    trainer = Trainer(tiny_config("encoding.name=cape", "model.dropout=0.0"))
    assert Trainer(tiny_config("model.dropout=0.0")).dropout_key(0) is None  # as before
    state = trainer.init_state()
    model = trainer.model(state)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 200, (2, 16)), jnp.int32)

    def logits(step, seed_trainer=trainer):
        return np.asarray(_run(model, tokens, seed_trainer.dropout_key(jnp.int32(step))))

    np.testing.assert_array_equal(logits(3), logits(3))
    other = Trainer(tiny_config("encoding.name=cape", "model.dropout=0.0"))
    np.testing.assert_array_equal(logits(3), logits(3, other))  # a fresh trainer, same seed
    assert np.abs(logits(3) - logits(4)).max() > 1e-4
    reseeded = Trainer(tiny_config("encoding.name=cape", "seed=7"))
    assert np.abs(logits(3) - logits(3, reseeded)).max() > 1e-4
    assert np.abs(logits(3) - np.asarray(_run(model, tokens))).max() > 1e-4  # evaluation: no draw


@pytest.mark.parametrize(
    "hparams,field",
    [
        ({"max_global_shift": -1.0}, "max_global_shift"),
        ({"max_local_shift": "x"}, "max_local_shift"),
        ({"max_global_scaling": 0.9}, "max_global_scaling"),
        ({"pos_scale": 0.0}, "pos_scale"),
        ({"normalize": 1}, "normalize"),
    ],
)
def test_bad_hyperparameters_name_the_field(hparams, field):
    with pytest.raises(ValueError, match=rf"encoding\.hparams\.{field}"):
        encodings.get("cape", **hparams)
