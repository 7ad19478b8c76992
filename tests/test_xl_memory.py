"""Transformer-XL segment recurrence (Dai et al. 2019, Sec. 3.2): the model with memory.

The equivalence: with ``mem_len`` covering every earlier segment, the memory the model carries
holds exactly the states a single pass over all the segments computes for them (each cached
state was computed with the whole of its own past), so scoring segment after segment with
memory must give the logits of one full pass. With a shorter memory the segments see less and
the logits differ (checked too, so the equality is not vacuous).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.model import ModelConfig, Transformer, token_loss

T = 4  # segment length
SEGMENTS = 3


def _model(name: str, mem_len: int, **config) -> Transformer:
    hparams = {"max_len": 64} if name == "learned" else {}
    cfg = ModelConfig(
        vocab_size=32,
        num_layers=2,
        model_dim=16,
        num_heads=2,
        mlp_dim=32,
        dtype="float32",
        attention_impl="einsum",
        mem_len=mem_len,
        **config,
    )
    return Transformer(cfg, encodings.get(name, **hparams), rngs=nnx.Rngs(0))


def _tokens(batch: int = 2, length: int = SEGMENTS * T) -> jax.Array:
    return jax.random.randint(jax.random.key(1), (batch, length), 0, 32)


def _by_segments(model: Transformer, tokens: jax.Array, mem_len: int | None = None):
    memory = model.empty_memory(tokens.shape[0])
    logits = []
    for start in range(0, tokens.shape[1], T):
        out, memory = model(tokens[:, start : start + T], memory=memory, mem_len=mem_len)
        logits.append(out)
    return jnp.concatenate(logits, axis=1), memory


# One encoder per hook (content logits, rotate, bias, embed, log decay, contextual logits) in
# the default suite; every registered encoder in the slow one.
HOOK_EXAMPLES = ("xl", "rope", "alibi", "sinusoidal", "forgetting", "cope")
EVERY_OTHER = tuple(n for n in encodings.names() if n not in HOOK_EXAMPLES)


@pytest.mark.parametrize(
    "name", [*HOOK_EXAMPLES, *(pytest.param(n, marks=pytest.mark.slow) for n in EVERY_OTHER)]
)
def test_memory_covering_the_past_equals_one_full_pass(name):
    model = _model(name, mem_len=(SEGMENTS - 1) * T)
    tokens = _tokens()
    full = model(tokens)
    segmented, memory = _by_segments(model, tokens)
    np.testing.assert_allclose(segmented, full, rtol=2e-5, atol=2e-5, err_msg=name)
    assert memory.shape == (2, 2, (SEGMENTS - 1) * T, 16)


def test_short_memory_differs_from_the_full_pass_and_keeps_the_last_states():
    model = _model("xl", mem_len=T // 2)
    tokens = _tokens()
    full = model(tokens)
    segmented, memory = _by_segments(model, tokens)
    np.testing.assert_allclose(segmented[:, :T], full[:, :T], rtol=2e-5, atol=2e-5)
    assert np.abs(segmented[:, T:] - full[:, T:]).max() > 1e-3
    assert memory.shape == (2, 2, T // 2, 16)
    # The memory of layer 0 is the embedded last tokens (the residual stream entering it).
    embedded = model.embed(tokens[:, -T // 2 :]) * jnp.sqrt(16.0)
    np.testing.assert_allclose(memory[0], embedded, rtol=1e-6)


def test_without_memory_the_call_is_unchanged():
    """The memory argument leaves the memoryless call alone: a zero-length memory gives the
    same logits as no memory, and a model with mem_len > 0 the same logits as mem_len = 0."""
    tokens = _tokens(length=T)
    plain = _model("rope", mem_len=0)(tokens)
    with_len = _model("rope", mem_len=8)(tokens)
    np.testing.assert_array_equal(plain, with_len)
    logits, memory = _model("rope", mem_len=8)(tokens, memory=jnp.zeros((2, 2, 0, 16)))
    np.testing.assert_allclose(logits, plain, rtol=1e-6, atol=1e-6)
    assert memory.shape == (2, 2, T, 16)


def test_no_gradient_flows_into_memory():
    model = _model("xl", mem_len=T)
    tokens = _tokens(length=2 * T)
    _, memory = model(tokens[:, :T], memory=model.empty_memory(2))
    graphdef, state = nnx.split(model)

    def loss(memory, state):
        logits, _ = nnx.merge(graphdef, state)(tokens[:, T:-1], memory=memory)
        return token_loss(logits, tokens[:, T + 1 :]).mean()

    grad_memory, grad_params = jax.grad(loss, argnums=(0, 1))(memory, state)
    assert not np.asarray(grad_memory).any()
    assert any(np.abs(g).max() > 0 for g in jax.tree.leaves(grad_params))
    # The memory matters to the loss (so the zero gradient is the stop-gradient's doing).
    assert abs(loss(memory, state) - loss(memory[:, ::-1], state)) > 1e-4


def test_bad_memory_and_mem_len_are_refused():
    with pytest.raises(ValueError, match=r"^model\.mem_len must be an integer >= 0"):
        _model("xl", mem_len=-1)
    model = _model("xl", mem_len=T)
    with pytest.raises(ValueError, match="memory must be"):
        model(_tokens(length=T), memory=jnp.zeros((1, 2, 3, 16)))
