"""Convolutional position information (wav2vec 2.0, Baevski et al. 2020, Sec. 2) against an
explicit float64 transcription: x'_t = x_t + GELU(b + sum_m W_m x_{t-K+1+m}) with a block-diagonal
(grouped) W, causal (left padding) or centred (wav2vec's padding K // 2 and SamePad); and the
model's ``embed_tokens`` hook."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.encodings import Dims
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer

D = 8


def _naive(x, weight, bias, groups, causal):
    """float64 loops: out[b, t, o] = gelu(bias[o] + sum_m sum_c W[m, c, o] x[b, t + off + m,
    g(o) * D/G + c]), zero outside the window; off = -(K-1) (causal) or -K // 2 (centred)."""
    x, weight, bias = (np.asarray(a, np.float64) for a in (x, weight, bias))
    b, t, d = x.shape
    k, per_group, _ = weight.shape
    first = -(k - 1) if causal else -(k // 2)
    out = np.zeros((b, t, d))
    for bb in range(b):
        for tt in range(t):
            for o in range(d):
                g = o // per_group
                total = bias[o]
                for m in range(k):
                    src = tt + first + m
                    if 0 <= src < t:
                        for c in range(per_group):
                            total += weight[m, c, o] * x[bb, src, g * per_group + c]
                out[bb, tt, o] = total
    gelu = np.vectorize(lambda z: 0.5 * z * (1.0 + math.erf(z / math.sqrt(2.0))))
    return gelu(out)


@pytest.mark.parametrize("causal,kernel_size", [(True, 3), (False, 4), (False, 3)])
def test_embed_tokens_matches_the_grouped_convolution(causal, kernel_size):
    enc = encodings.get("conv", kernel_size=kernel_size, groups=2, causal=causal)
    enc = enc.bind(Dims(num_heads=2, head_dim=4, model_dim=D))
    params = enc.init(jax.random.key(0), enc.bound_dims)
    params["bias"] = jnp.linspace(-0.5, 0.5, D, dtype=jnp.float32)
    x = np.random.default_rng(0).standard_normal((2, 7, D)).astype(np.float32)
    got = np.asarray(enc.embed_tokens(params, jnp.asarray(x), jnp.arange(7)[None]), np.float64)
    expected = _naive(x, params["weight"], params["bias"], 2, causal)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_the_causal_convolution_reads_exactly_the_last_k_tokens():
    enc = encodings.get("conv", kernel_size=3, groups=1).bind(Dims(2, 4, D))
    params = enc.init(jax.random.key(0), enc.bound_dims)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 9, D)), jnp.float32)
    jac = jax.jacrev(lambda x: enc.embed_tokens(params, x, None)[0, 5].sum())(x)  # [1, 9, D]
    reads = np.abs(np.asarray(jac[0])).sum(-1) > 0
    assert reads.tolist() == [t in (3, 4, 5) for t in range(9)]


def _model(enc, causal=True):
    config = ModelConfig(vocab_size=32, num_layers=1, model_dim=D, num_heads=2, mlp_dim=16,
                         dtype="float32", causal=causal)  # fmt: skip
    return Transformer(config, enc, rngs=nnx.Rngs(0))


def test_the_model_adds_the_term_to_the_token_embeddings_and_ignores_positions():
    model = _model(encodings.get("conv", kernel_size=3, groups=2))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 32, (2, 6)), jnp.int32)
    shifted = model(tokens, jnp.arange(6) + 100)
    np.testing.assert_array_equal(np.asarray(model(tokens)), np.asarray(shifted))
    # The term is there: zeroing the convolution changes the logits.
    params = dict(model.shared_pos_params.items())
    params["weight"][...] = jnp.zeros_like(params["weight"][...])
    params["bias"][...] = jnp.zeros_like(params["bias"][...])
    assert np.abs(np.asarray(model(tokens)) - np.asarray(shifted)).max() > 1e-4


def test_centred_convolution_is_refused_by_a_causal_model_in_one_line():
    with pytest.raises(ValueError, match=r"model\.causal=True.*encoding\.hparams\.causal") as info:
        _model(encodings.get("conv", causal=False))
    assert "\n" not in str(info.value)
    _model(encodings.get("conv", causal=False), causal=False)  # bidirectional: fine
    _model(encodings.get("conv", causal=True), causal=False)  # a one-sided conv too


@pytest.mark.parametrize(
    "hparams,field",
    [({"kernel_size": 0}, "kernel_size"), ({"groups": 1.5}, "groups"), ({"causal": 1}, "causal")],
)
def test_bad_hyperparameters_name_the_field(hparams, field):
    with pytest.raises(ValueError, match=rf"encoding\.hparams\.{field}"):
        encodings.get("conv", **hparams)
    with pytest.raises(ValueError, match=r"encoding\.groups=3 must divide model\.model_dim=8"):
        encodings.get("conv", groups=3).bind(Dims(2, 4, D))
