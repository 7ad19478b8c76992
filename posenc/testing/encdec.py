"""The encoder-decoder check: every registered encoder inside posenc's encoder-decoder.

:func:`check_encoder_decoder` builds the battery's tiny model as an
:class:`~posenc.models.encdec.EncoderDecoder` (the encoder in its bidirectional form on the
source side, its causal form on the target side, :meth:`Encoding.for_direction`) and checks:

- a source padded after ``n`` real tokens gives the decoder the logits of the ``n``-token source
  alone (padding is removed exactly from the encoder's attention, its input terms and
  cross-attention);
- the decoder is causal (changing target token ``t`` leaves the logits before ``t`` alone and
  changes some at ``t`` and after) and reads the whole source (changing its last real token
  changes the first target's logits);
- decoding one token at a time through the key/value caches gives the teacher-forced logits
  (for a ``cacheable`` encoder);

or, for an encoder that cannot run bidirectionally (``causal_only``, or ``check_causal``
refusing its bidirectional form), that building the model is refused in one line naming the
encoder side.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.encodings.base import Encoding
from posenc.layers.config import ModelConfig
from posenc.models.encdec import EncoderDecoder, bind_sides
from posenc.testing._harness import Settings, jit, label, resolve


def _config(settings: Settings) -> ModelConfig:
    return ModelConfig(
        vocab_size=settings.vocab_size,
        num_layers=settings.num_layers,
        num_encoder_layers=settings.num_layers,
        model_dim=settings.model_dim,
        num_heads=settings.num_heads,
        mlp_dim=settings.mlp_dim,
        dtype="float32",
        attention_block_size=settings.block_size,
    )


def check_encoder_decoder(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """The encoder inside the encoder-decoder (module docstring)."""
    settings = settings or Settings()
    enc = resolve(encoder)
    who = label(enc)
    config = _config(settings)
    try:
        bind_sides(config, enc)
    except ValueError as e:
        message = str(e)
        assert "\n" not in message and "encoder side" in message, (
            f"{who}: refused in the encoder-decoder, but not in one line naming the encoder "
            f"side: {message!r}"
        )
        try:
            enc.check_causal(False)
        except ValueError:
            return  # causal only: the refusal is the contract
        raise AssertionError(
            f"{who}: runs bidirectionally, yet the encoder-decoder refuses it: {e}"
        ) from None
    model = EncoderDecoder(config, enc, rngs=nnx.Rngs(settings.seed))
    graphdef, state = nnx.split(model)
    run = jit(lambda state, s, t, m: nnx.merge(graphdef, state)(s, t, src_mask=m))
    rng = np.random.default_rng(settings.seed + 7)
    s_len, t_len, real = settings.length, settings.length - 4, settings.length - 5
    src = jnp.asarray(rng.integers(0, settings.vocab_size, (2, s_len)), jnp.int32)
    tgt = jnp.asarray(rng.integers(0, settings.vocab_size, (2, t_len)), jnp.int32)
    mask = jnp.arange(s_len)[None, :] < jnp.array([[real], [s_len]])
    base = np.asarray(run(state, src, tgt, mask))
    alone = np.asarray(run(state, src[:1, :real], tgt[:1], jnp.ones((1, real), bool)))
    tol = dict(rtol=settings.tolerance * 10, atol=settings.tolerance * 10)
    np.testing.assert_allclose(
        base[:1], alone, **tol, err_msg=f"{who}: a padded source differs from the unpadded one"
    )
    t = t_len // 2
    later = np.asarray(
        run(state, src, tgt.at[:, t].set((tgt[:, t] + 1) % settings.vocab_size), mask)
    )
    assert np.array_equal(later[:, :t], base[:, :t]), f"{who}: the decoder sees a later target"
    assert np.abs(later[:, t:] - base[:, t:]).max() > 1e-6, f"{who}: the target is not read"
    last = src.at[1, -1].set((src[1, -1] + 1) % settings.vocab_size)
    changed = np.asarray(run(state, last, tgt, mask))
    assert np.abs(changed[1, 0] - base[1, 0]).max() > 1e-6, (
        f"{who}: the first target does not read the last source token"
    )
    if not model.decoder.encoding.cacheable:
        return
    step = jit(_decode_steps, static_argnums=(0, 5))
    cached = np.asarray(step(graphdef, state, src, tgt, mask, t_len))
    np.testing.assert_allclose(
        cached, base, **tol, err_msg=f"{who}: cached decoding differs from teacher forcing"
    )


def _decode_steps(graphdef, state, src, tgt, mask, t_len):
    """Every target position's logits, decoded one token at a time through the caches."""
    model: EncoderDecoder = nnx.merge(graphdef, state)
    encoded, mask = model.encode(src, mask)
    cross = model.cross_caches(encoded, mask)
    caches = model.empty_caches(src.shape[0], t_len)
    positions = jnp.arange(t_len)[None]

    def body(slot, carry):
        caches, out = carry
        logits, caches = model.decode(tgt, slot, positions, caches, cross)
        return caches, jax.lax.dynamic_update_slice_in_dim(out, logits, slot, axis=1)

    out = jnp.zeros((src.shape[0], t_len, model.config.vocab_size), jnp.float32)
    return jax.lax.fori_loop(0, t_len, body, (caches, out))[1]
