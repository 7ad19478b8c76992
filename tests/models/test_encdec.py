"""The encoder-decoder's own properties: cross-attention without positions, one encoder in each
direction's form with its own parameters, separate or shared embeddings. What every registered
encoder must do inside it (padding removed exactly, a causal decoder over the whole source,
cached decoding equal to teacher forcing, causal-only encoders refused) is the contract
battery's ``encoder_decoder`` check (posenc.testing, tests/test_testing.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc import encodings
from posenc.layers.cache import CrossCache
from posenc.layers.config import ModelConfig
from posenc.models.encdec import EncoderDecoder

V, S, T = 40, 9, 7
HPARAMS = {"learned": {"max_len": 32}, "shaw": {"max_distance": 4}, "cope": {"max_pos": 8}}


def _model(name, seed=0, **kw) -> EncoderDecoder:
    base = dict(
        vocab_size=V,
        num_layers=2,
        model_dim=32,
        num_heads=2,
        mlp_dim=48,
        dtype="float32",
        num_encoder_layers=2,
    )
    config = ModelConfig(**{**base, **kw})
    return EncoderDecoder(config, encodings.get(name, **HPARAMS.get(name, {})), rngs=nnx.Rngs(seed))


def _ids(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).integers(2, V, shape), jnp.int32)


@functools.cache
def _apply(graphdef):
    @jax.jit
    def run(state, src, tgt, mask):
        return nnx.merge(graphdef, state)(src, tgt, src_mask=mask)

    return run


def _logits(model, src, tgt, mask=None):
    graphdef, state = nnx.split(model)
    mask = jnp.ones(src.shape, bool) if mask is None else mask
    return _apply(graphdef)(state, src, tgt, mask)


def test_cross_attention_has_no_positional_term():
    """Permuting the encoder output's tokens (keys, values and mask alike) leaves
    cross-attention unchanged: queries and keys meet only through their contents."""
    model = _model("rope")
    block = model.decoder.blocks[0]
    encoded = jax.random.normal(jax.random.key(0), (2, S, 32))
    valid = jnp.arange(S)[None, :] < jnp.array([[6], [S]])
    h = jax.random.normal(jax.random.key(1), (2, T, 32))
    perm = np.random.default_rng(0).permutation(S)
    out = block.cross_attn(
        h, block.cross_attn.kv(encoded, valid), implementation="auto", block_size=4
    )
    cache = block.cross_attn.kv(encoded[:, perm], valid[:, perm])
    permuted = block.cross_attn(h, CrossCache(*cache), implementation="auto", block_size=4)
    np.testing.assert_allclose(permuted, out, rtol=1e-5, atol=1e-5)


def test_each_stack_has_its_own_encoder_parameters_in_its_direction():
    """T5 keeps one bidirectional table in the encoder and one causal table in the decoder."""
    model = _model("t5")
    assert model.encoder.encoding.bidirectional and not model.decoder.encoding.bidirectional
    enc_table = model.encoder.shared_pos_params["table"][...]
    dec_table = model.decoder.shared_pos_params["table"][...]
    assert enc_table.shape == dec_table.shape and not np.array_equal(enc_table, dec_table)
    shaw = _model("shaw")
    assert shaw.encoder.blocks[0].pos_params is not None
    assert shaw.decoder.blocks[0].pos_params is not None


def test_separate_embeddings_and_untied_output():
    shared = _model("sinusoidal")
    separate = _model("sinusoidal", share_embeddings=False, tie_embeddings=False)
    assert shared.src_embed is None and shared.unembed is None
    assert separate.src_embed is not None and separate.unembed is not None
    src, tgt = _ids(6, (1, S)), _ids(7, (1, T))
    # The source table alone feeds the encoder: changing it changes the logits.
    before = _logits(separate, src, tgt)
    separate.src_embed.embedding[...] = separate.src_embed.embedding[...] * 2
    assert np.abs(_logits(separate, src, tgt) - before).max() > 1e-4
