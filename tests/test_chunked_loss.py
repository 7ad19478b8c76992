"""The chunked cross entropy (``posenc.models.losses.chunked_token_losses``, ``model.loss_chunk``)
against naive float64 formulas: the same per-token losses, label-smoothed losses, arg-max hits
and gradients as forming every logit at once, for chunks that divide the window and chunks that
do not; the models' heads (tied, untied with an output bias, BERT's head transform) through it;
and, from XLA's buffer assignment, that neither evaluation nor the gradient holds all logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.devices import fits
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer
from posenc.models.losses import chunk_positions, chunked_token_losses, token_loss


def _log_softmax64(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    shifted = z - z.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def _problem(seed=0, b=3, t=13, d=8, v=37):
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((b, t, d)).astype(np.float32)
    w = (rng.standard_normal((d, v)) / np.sqrt(d) * 3).astype(np.float32)
    bias = rng.standard_normal(v).astype(np.float32)
    targets = rng.integers(0, v, (b, t)).astype(np.int32)
    weights = rng.integers(0, 2, (b, t)).astype(np.float32)
    return hidden, w, bias, targets, weights


@pytest.mark.parametrize(
    "chunk",
    [
        0,  # all at once
        3 * 13,  # one chunk exactly
        3,  # one position per chunk (13 chunks)
        3 * 4,  # 4 positions: 4 chunks, the last padded (13 = 4 + 3 + 3 + 3 after evening out)
        7,  # fewer tokens than rows x 3: 2 positions per chunk, 7 chunks, padded
    ],
)
def test_chunked_losses_equal_the_float64_cross_entropy(chunk):
    hidden, w, bias, targets, _ = _problem()
    logits64 = hidden.astype(np.float64) @ w + bias  # [B, T, V]
    log_p = _log_softmax64(logits64)
    v = w.shape[1]
    want = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    smoothing = 0.1
    q = np.full(log_p.shape, smoothing / (v - 1))
    np.put_along_axis(q, targets[..., None], 1 - smoothing, -1)
    want_smoothed = -(q * log_p).sum(-1)
    want_correct = logits64.argmax(-1) == targets

    got = chunked_token_losses(
        jnp.asarray(hidden),
        jnp.asarray(targets),
        lambda x: x @ jnp.asarray(w) + jnp.asarray(bias),
        chunk=chunk,
        smoothing=smoothing,
        correct=True,
    )
    assert got.loss.shape == targets.shape and got.loss.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got.loss), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(got.smoothed), want_smoothed, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(got.correct), want_correct)


def test_chunk_positions_even_out_the_chunks():
    assert chunk_positions(3, 13, 0) == 13
    assert chunk_positions(3, 13, 39) == 13  # fits in one chunk
    assert chunk_positions(3, 13, 12) == 4  # ceil(13 / 4) = 4 chunks of 4 (3 padded)
    assert chunk_positions(2, 10, 8) == 4  # 3 chunks of 4 would pad 2: 4, 4, 2 -> 4
    assert chunk_positions(1, 10, 6) == 5  # 2 chunks: 5 + 5, not 6 + 4 padded to 12
    assert chunk_positions(8, 10, 3) == 1  # fewer tokens than rows: one position


@pytest.mark.parametrize("chunk", [0, 3 * 4, 5])
def test_chunked_gradients_equal_the_float64_gradient(chunk):
    # d/dz of sum_t w_t CE_t = w_t (softmax(z_t) - onehot(y_t)); chained to the head's weight,
    # bias and the hidden states.
    hidden, w, bias, targets, weights = _problem(seed=1)
    logits64 = hidden.astype(np.float64) @ w + bias
    dz = np.exp(_log_softmax64(logits64))
    on_target = np.take_along_axis(dz, targets[..., None], -1)
    np.put_along_axis(dz, targets[..., None], on_target - 1, -1)
    dz *= weights[..., None]
    want = {
        "w": np.einsum("btd,btv->dv", hidden.astype(np.float64), dz),
        "bias": dz.sum((0, 1)),
        "hidden": dz @ w.T.astype(np.float64),
    }

    def loss(params, h):
        head = lambda x: x @ params["w"] + params["bias"]  # noqa: E731
        losses = chunked_token_losses(h, jnp.asarray(targets), head, chunk=chunk).loss
        return (losses * weights).sum()

    params = {"w": jnp.asarray(w), "bias": jnp.asarray(bias)}
    grads, g_hidden = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, jnp.asarray(hidden))
    for name, value in {**grads, "hidden": g_hidden}.items():
        np.testing.assert_allclose(np.asarray(value), want[name], rtol=1e-4, atol=1e-5)


_HEADS = {
    "tied": {},
    # Every part of a head at once: BERT's transform, an untied projection, an output bias.
    "untied_transform_bias": {
        "tie_embeddings": False,
        "head_transform": "gelu",
        "output_bias": True,
        "causal": False,
    },
}


@pytest.mark.parametrize(
    "head", [pytest.param("tied", marks=pytest.mark.slow), "untied_transform_bias"]
)
def test_a_models_chunked_losses_and_gradients_equal_its_whole_logits(head):
    # The unchunked reference: the model's own logits (model(tokens)) through optax's cross
    # entropy; the chunked path goes through model.token_losses with 2 positions per chunk.
    shape = dict(vocab_size=61, num_layers=1, model_dim=16, num_heads=2, mlp_dim=32)
    config = ModelConfig(**shape, dtype="float32", **_HEADS[head], loss_chunk=4)
    model = Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 61, (2, 7)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, 61, (2, 7)), jnp.int32)
    graphdef, state = nnx.split(model)

    def chunked(state):
        m = nnx.merge(graphdef, state)
        return m.token_losses(m.hidden_states(tokens), targets).loss

    def whole(state):
        return token_loss(nnx.merge(graphdef, state)(tokens), targets)

    np.testing.assert_allclose(
        np.asarray(jax.jit(chunked)(state)), np.asarray(jax.jit(whole)(state)), rtol=1e-5
    )
    g_chunked = jax.jit(jax.grad(lambda s: chunked(s).sum()))(state)
    g_whole = jax.jit(jax.grad(lambda s: whole(s).sum()))(state)
    for a, b in zip(jax.tree.leaves(g_chunked), jax.tree.leaves(g_whole), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_neither_the_loss_nor_its_gradient_holds_every_logit():
    # XLA's buffer assignment of the compiled programs (nothing runs): the whole logits are
    # 4 x 256 x 4096 float32 = 16.8 MB; 16 chunks of 64 tokens must hold far less, in the
    # gradient too (jax.checkpoint recomputes each chunk's logits rather than keeping them;
    # compiled with the run's CPU options, fits.compiler_options).
    b, t, d, v = 4, 256, 32, 4096
    logits_bytes = b * t * v * 4
    h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    y = jax.ShapeDtypeStruct((b, t), jnp.int32)

    def temporaries(fn, chunk):
        def loss(w, h, y):
            return chunked_token_losses(h, y, lambda x: x @ w, chunk=chunk).loss.sum()

        compiled = jax.jit(fn(loss)).lower(w, h, y).compile(fits.compiler_options())
        return compiled.memory_analysis().temp_size_in_bytes

    for fn in (lambda f: f, lambda f: jax.grad(f, argnums=(0, 1))):
        assert temporaries(fn, 0) >= logits_bytes
        assert temporaries(fn, 64) < logits_bytes / 4


def test_the_training_loss_goes_through_the_chunks():
    # The causal-LM kind's training loss (what the step differentiates), with and without
    # Transformer-XL memory and with a batch's weights: the same with 2 positions a chunk as
    # with every logit at once, from identical parameters (model.loss_chunk draws none).
    import ml_collections

    from posenc import kinds
    from posenc.models import memory as memory_lib

    shape = dict(vocab_size=61, num_layers=1, model_dim=16, num_heads=2, mlp_dim=32)
    models = {
        chunk: Transformer(
            ModelConfig(**shape, dtype="float32", mem_len=4, loss_chunk=chunk),
            encodings.get("rope"),
            rngs=nnx.Rngs(0),
        )
        for chunk in (0, 4)
    }
    rng = np.random.default_rng(3)
    batch = {
        "inputs": jnp.asarray(rng.integers(0, 61, (2, 7)), jnp.int32),
        "targets": jnp.asarray(rng.integers(0, 61, (2, 7)), jnp.int32),
        "weights": jnp.asarray(rng.integers(0, 2, (2, 7)), jnp.float32),
    }
    kind = kinds.get("causal_lm")
    config = ml_collections.ConfigDict()
    for memory in (None, "memory"):
        got = {}
        for chunk, model in models.items():
            mem = None if memory is None else memory_lib.empty_memory(model, 2)
            got[chunk] = kind.loss(config, model, batch, None, mem)
        np.testing.assert_allclose(float(got[4].mean), float(got[0].mean), rtol=1e-6)
        np.testing.assert_allclose(float(got[4].loss_sum), float(got[0].loss_sum), rtol=1e-6)


def test_the_training_step_holds_one_chunk_of_logits():
    # The gradient of the causal-LM kind's loss, compiled (nothing run): with every logit at
    # once it holds the 4 x 128 x 16384 float32 logits (33.6 MB), with chunks of 32 tokens
    # (2 MB each; the backward pass holds a few) far less. Fails if the kind's loss formed the
    # whole logits whatever model.loss_chunk says.
    import ml_collections

    from posenc import kinds

    shape = dict(vocab_size=16384, num_layers=1, model_dim=16, num_heads=2, mlp_dim=32)
    batch = {k: jax.ShapeDtypeStruct((4, 128), jnp.int32) for k in ("inputs", "targets")}
    kind, config = kinds.get("causal_lm"), ml_collections.ConfigDict()
    logits_bytes = 4 * 128 * 16384 * 4

    def temporaries(chunk):
        model = Transformer(
            ModelConfig(**shape, dtype="float32", loss_chunk=chunk),
            encodings.get("rope"),
            rngs=nnx.Rngs(0),
        )
        graphdef, state = nnx.split(model)

        def mean(state, batch):
            return kind.loss(config, nnx.merge(graphdef, state), batch, None).mean

        compiled = jax.jit(jax.grad(mean)).lower(state, batch).compile(fits.compiler_options())
        return compiled.memory_analysis().temp_size_in_bytes

    assert temporaries(0) >= logits_bytes
    assert temporaries(32) < logits_bytes / 4
