"""The Forgetting Transformer (Lin et al. 2025) against a float64 numpy transcription of its
forget gate:

    f_l = sigmoid(w_f . x_l + b_f)  (per token l and head),  D_ij = sum_{l=j+1..i} log f_l,
    a_ij = softmax_j(q_i . k_j / sqrt(d) + D_ij),  out_i = sum_j a_ij v_j

with the sum written as a loop over l (not the cumulative-sum difference the code uses), on every
attention path (`einsum`, `blocked` with small tiles, `xla`, `auto`) at the training length and
16 times it; the gate reads the layer input passed to attention. Through the model, that input
is the normed one (tests/test_model.py); contract and causality: the battery."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.attention.core import attend, choose_implementation
from posenc.encodings import Dims
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer

H, DH, D = 2, 8, 12  # the layer input's width D differs from H * DH, so no axis is mixed up
DIMS = Dims(num_heads=H, head_dim=DH, model_dim=D)
TRAIN_LENGTH = 12
EXTRA_KEYS = 3
OFFSETS = (0, 37)

_attend = jax.jit(
    attend,
    static_argnames=("encoding", "causal", "implementation", "block_size"),
    compiler_options={"xla_backend_optimization_level": 0},
)


def _naive(q, k, v, x, w, b):
    """FoX attention in float64, causal (queries the last T of S keys): ``[B, T, H, d]``."""
    q, k, v, x, w, b = (np.asarray(a, np.float64) for a in (q, k, v, x, w, b))
    t, s, d = q.shape[1], k.shape[1], q.shape[-1]
    log_f = -np.log1p(np.exp(-(x @ w + b)))  # log sigmoid, [B, S, H]
    decay = np.zeros((q.shape[0], H, t, s))
    for i in range(t):
        key_i = i + s - t  # query i is key number key_i
        for j in range(key_i + 1):
            decay[:, :, i, j] = log_f[:, j + 1 : key_i + 1].sum(axis=1)  # l = j+1 .. i
    scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d) + decay
    visible = np.arange(s)[None, :] <= np.arange(t)[:, None] + (s - t)
    scores = np.where(visible, scores, -np.inf)
    a = np.exp(scores - scores.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", a, v)


def _inputs(length, seed=0):
    """``q, k, v``, positions, the layer input ``x [B, S, D]`` and gate parameters."""
    rng = np.random.default_rng(seed)
    t, s = length, length + EXTRA_KEYS
    q, k, v = (jnp.asarray(rng.standard_normal((2, n, H, DH)), jnp.float32) for n in (t, s, s))
    k_pos = np.asarray(OFFSETS)[:, None] + np.arange(s)
    x = jnp.asarray(rng.standard_normal((2, s, D)), jnp.float32)
    # Gates spread over (0, 1) and one head forgetting faster, so the decay shapes attention.
    w = rng.standard_normal((D, H)).astype(np.float32) * 0.5
    b = np.array([2.0, -0.5], np.float32)
    return q, k, v, jnp.asarray(k_pos[:, s - t :]), jnp.asarray(k_pos), x, w, b


def _run(enc, impl, block, q, k, v, q_pos, k_pos, x, w, b):
    out = _attend(
        q,
        k,
        v,
        encoding=enc,
        params={"w": jnp.asarray(w), "b": jnp.asarray(b)},
        q_pos=q_pos,
        k_pos=k_pos,
        implementation=impl,
        block_size=block,
        inputs=x,
    )
    return np.asarray(out, np.float64)


PATHS = [("einsum", 512), ("blocked", 5), ("xla", 512), ("auto", 64)]


@pytest.mark.parametrize("impl,block", PATHS)
@pytest.mark.parametrize("factor", [1, 16])
def test_every_path_equals_the_papers_decay(impl, block, factor):
    length = factor * TRAIN_LENGTH
    block = 7 * block + 4 if impl == "blocked" and factor > 1 else block
    q, k, v, q_pos, k_pos, x, w, b = _inputs(length, seed=factor)
    enc = encodings.get("forgetting").bind(DIMS)
    got = _run(enc, impl, block, q, k, v, q_pos, k_pos, x, w, b)
    np.testing.assert_allclose(got, _naive(q, k, v, x, w, b), rtol=2e-4, atol=2e-4)


def test_log_decay_is_the_log_of_the_forget_gate():
    enc = encodings.get("forgetting").bind(DIMS)
    *_, x, w, b = _inputs(4)
    got = enc.log_decay({"w": jnp.asarray(w), "b": jnp.asarray(b)}, x.astype(jnp.bfloat16))
    assert got.shape == (2, 4 + EXTRA_KEYS, H) and got.dtype == jnp.float32
    x64 = np.asarray(x.astype(jnp.bfloat16), np.float64)  # bf16 inputs, float32 gate
    expected = np.log(1.0 / (1.0 + np.exp(-(x64 @ w + b))))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def test_attend_needs_the_layer_input():
    enc = encodings.get("forgetting").bind(DIMS)
    q, k, v, q_pos, k_pos, x, w, b = _inputs(4)
    params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
    kw = dict(encoding=enc, params=params, q_pos=q_pos, k_pos=k_pos)
    with pytest.raises(ValueError, match=r"'forgetting' reads the layer input.*inputs=\[B, S=7"):
        attend(q, k, v, **kw)
    with pytest.raises(ValueError, match="inputs="):
        attend(q, k, v, inputs=x[:, 1:], **kw)  # one key short


def test_declarations_parameters_and_path_choice():
    enc = encodings.get("forgetting")
    assert enc.hooks == ("log_decay",) and enc.relative and enc.param_scope == "layer"
    params = enc.bind(DIMS).init(jax.random.key(0), DIMS)
    assert {n: x.shape for n, x in params.items()} == {"w": (D, H), "b": (H,)}
    assert not np.asarray(params["b"]).any()  # the official code's zero bias
    assert 0.01 < float(np.std(np.asarray(params["w"]))) < 0.03  # and std 0.02
    later = encodings.get("forgetting", bias_init=5.0).bind(DIMS).init(jax.random.key(0), DIMS)
    np.testing.assert_array_equal(np.asarray(later["b"]), 5.0)
    for bad in ({"init_std": -0.1}, {"bias_init": "5"}):
        with pytest.raises(ValueError, match="encoding."):
            encodings.get("forgetting", **bad)
    # The decay enters as a dense bias: cuDNN only up to one block, as for ALiBi.
    bound = enc.bind(Dims(2, 64, 128))
    assert choose_implementation(bound, 64, jnp.bfloat16, 512, "gpu") == "cudnn"
    assert choose_implementation(bound, 4096, jnp.bfloat16, 512, "gpu") == "blocked"
    assert choose_implementation(bound, 64, jnp.float32, 512, "cpu") == "xla"
    for impl in ("einsum", "blocked", "xla", "cudnn"):  # every path takes it
        config = ModelConfig(num_layers=1, model_dim=16, num_heads=2, attention_impl=impl)
        Transformer(config, enc, rngs=nnx.Rngs(0))
