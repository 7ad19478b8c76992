"""The classifier's own properties: pooling and losses against naive formulas, position use
(NoPE cannot tell text orders apart, RoPE can), the shared parts named as the LM's. Padding
and every registered encoder are the contract battery's ``classifier`` check."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.kinds import classification as classify
from posenc.layers.config import ModelConfig
from posenc.layers.pool import HeadConfig
from posenc.models.classifier import OWN_PARTS, Classifier
from posenc.models.lm import Transformer

CONFIG = ModelConfig(
    vocab_size=40,
    num_layers=1,
    model_dim=32,
    num_heads=2,
    mlp_dim=48,
    dtype="float32",
    causal=False,
)


def _model(name="rope", **head) -> Classifier:
    return Classifier(CONFIG, encodings.get(name), HeadConfig(**head), rngs=nnx.Rngs(0))


# One compilation per model and shape: eager execution compiles every operation on first use.
_call = nnx.jit(lambda model, *args: model(*args))
_encode = nnx.jit(lambda model, *args: model.encode(*args))


def _tokens(seed=0, shape=(2, 9)):
    return jnp.asarray(np.random.default_rng(seed).integers(1, 40, shape), jnp.int32)


def test_mean_pooling_is_the_mean_of_the_real_tokens_states():
    model = _model(pool="mean", pooler=False)
    tokens = _tokens()
    mask = jnp.arange(9)[None, :] < jnp.array([[6], [9]])
    states = _encode(model, tokens, None, mask)  # [B, T, D]
    naive = jnp.stack([states[0, :6].mean(0), states[1].mean(0)])
    expected = naive @ model.head.out.kernel[...] + model.head.out.bias[...]
    np.testing.assert_allclose(_call(model, tokens, None, mask), expected, rtol=1e-5, atol=1e-5)


def test_first_token_pooling_with_the_pooler_is_tanh_dense_then_out_and_reads_segments():
    model = _model(num_labels=3)
    tokens = _tokens(1)
    first = _encode(model, tokens)[:, 0]
    pooled = jnp.tanh(first @ model.head.pooler.kernel[...] + model.head.pooler.bias[...])
    expected = pooled @ model.head.out.kernel[...] + model.head.out.bias[...]
    outputs = _call(model, tokens, jnp.zeros_like(tokens))  # segment 0 throughout, as None
    assert outputs.shape == (2, 3)
    np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-5)
    segments = (jnp.arange(9)[None, :] >= 4).astype(jnp.int32).repeat(2, 0)
    assert np.abs(_call(model, tokens, segments) - outputs).max() > 1e-5, "segments are read"


@pytest.mark.parametrize("name,blind", [("nope", True), ("rope", False)])
def test_text_order_is_invisible_without_positions(name, blind):
    """The embedded task's premise: [CLS] then the same tokens in another order gives NoPE the
    same output (a bag of tokens), and RoPE another."""
    model = _model(name, num_segments=0)
    tokens = _tokens(3, (1, 9))
    swapped = tokens.at[0, 1:].set(tokens[0, 1:][::-1])
    difference = float(np.abs(_call(model, tokens) - _call(model, swapped)).max())
    assert (difference < 1e-5) == blind, difference


def test_losses_against_naive_formulas():
    logits = jnp.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    labels = jnp.array([0, 1])
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    naive = -np.log(probs[[0, 1], [0, 1]])
    np.testing.assert_allclose(classify.example_losses(logits, labels, False), naive, rtol=1e-6)
    outputs, targets = jnp.array([[1.5], [-2.0]]), jnp.array([1.0, 0.0])
    np.testing.assert_allclose(classify.example_losses(outputs, targets, True), [0.25, 4.0])


def test_shared_parts_are_named_as_the_language_models():
    def paths(model):
        state = nnx.split(model, nnx.Param, ...)[1]
        return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)}

    lm = Transformer(CONFIG, encodings.get("rope"), rngs=nnx.Rngs(0))
    mine = paths(_model())
    own = {p for p in mine if p.startswith(tuple(f"['{part}']" for part in OWN_PARTS))}
    assert own and mine - own == paths(lm)


def test_a_causal_model_is_refused_in_one_line():
    import dataclasses

    with pytest.raises(ValueError, match="needs model.causal=False") as err:
        Classifier(
            dataclasses.replace(CONFIG, causal=True),
            encodings.get("rope"),
            HeadConfig(),
            rngs=nnx.Rngs(0),
        )
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"model.pool must be one of \['first', 'mean'\]"):
        HeadConfig(pool="max")
