"""The encoder-decoder: padding removed exactly, a causal decoder over a bidirectional encoder,
cross-attention without positions, one encoder in each direction's form, cached decoding equal
to teacher forcing."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


BIDIRECTIONAL = [n for n in encodings.names() if not encodings.get_class(n).causal_only]
CAUSAL_ONLY = [n for n in encodings.names() if encodings.get_class(n).causal_only]


@pytest.mark.parametrize("name", BIDIRECTIONAL)
def test_a_padded_source_gives_the_unpadded_outputs(name):
    """Row 0's source is 5 tokens followed by 4 of junk; masked, the decoder's logits are
    those of the 5-token source alone (every encoder, its attention hooks and input terms)."""
    model = _model(name)
    src, tgt = _ids(1, (2, S)), _ids(2, (2, T))
    mask = jnp.arange(S)[None, :] < jnp.array([[5], [S]])  # row 0: 5 real tokens
    padded = _logits(model, src, tgt, mask)
    alone = _logits(model, src[:1, :5], tgt[:1])
    np.testing.assert_allclose(padded[:1], alone, rtol=2e-5, atol=2e-5, err_msg=name)
    junk = src.at[0, 5:].set(_ids(3, (4,)))
    np.testing.assert_allclose(_logits(model, junk, tgt, mask), padded, rtol=2e-5, atol=2e-5)


def test_the_decoder_is_causal_and_the_encoder_bidirectional():
    model = _model("rope")
    src, tgt = _ids(4, (1, S)), _ids(5, (1, T))
    base = _logits(model, src, tgt)
    later_target = _logits(model, src, tgt.at[0, 4].set((tgt[0, 4] + 1) % V))
    np.testing.assert_array_equal(later_target[:, :4], base[:, :4])
    assert np.abs(later_target[:, 4:] - base[:, 4:]).max() > 1e-4
    last_source = _logits(model, src.at[0, -1].set((src[0, -1] + 1) % V), tgt)
    assert np.abs(last_source[:, 0] - base[:, 0]).max() > 1e-4  # the first target sees it


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


@pytest.mark.parametrize("name", CAUSAL_ONLY)
def test_causal_only_encoders_are_refused_for_the_encoder_side(name):
    with pytest.raises(ValueError, match=r"^model\.assembly='encoder_decoder', encoder side: "):
        _model(name)


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


@pytest.mark.parametrize("name", ["rope", "t5", "shaw", "xl", "sinusoidal", "conv"])
def test_cached_decoding_equals_teacher_forcing(name):
    model = _model(name)
    src, tgt = _ids(8, (2, S)), _ids(9, (2, T))
    mask = jnp.arange(S)[None, :] < jnp.array([[6], [S]])
    full = _logits(model, src, tgt, mask)
    encoded, mask = model.encode(src, mask)
    cross = model.cross_caches(encoded, mask)
    caches = [
        type(c)(*(jnp.full(x.shape, jnp.nan, x.dtype) for x in c))
        for c in model.decode_forward(tgt, cross)[1]
    ]
    positions = jnp.arange(T)[None]
    for slot in range(T):
        step, caches = model.decode(tgt, slot, positions, caches, cross)
        np.testing.assert_allclose(step[:, 0], full[:, slot], rtol=1e-4, atol=1e-4, err_msg=name)
