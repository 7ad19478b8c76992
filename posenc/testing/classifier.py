"""The classifier check: every registered encoder inside posenc's sequence classifier.

:func:`check_classifier` builds the battery's tiny model as a
:class:`~posenc.models.classifier.Classifier` (bidirectional, a pair of segments, both poolings)
and checks:

- a row padded after ``n`` real tokens is classified exactly as the ``n``-token row alone
  (padding is removed from attention, input terms and mean pooling), for first-token and mean
  pooling;
- the first token's output reads the last real token (changing it changes the logits);

or, for an encoder that cannot run bidirectionally (``causal_only``, or ``check_causal``
refusing its bidirectional form), that building the classifier is refused in one line.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from posenc.encodings.base import Encoding
from posenc.layers.config import ModelConfig
from posenc.layers.pool import POOLS, HeadConfig
from posenc.models.classifier import Classifier
from posenc.testing._harness import Settings, jit, label, resolve


def check_classifier(encoder: str | Encoding, settings: Settings | None = None) -> None:
    """The encoder inside the classifier (module docstring)."""
    settings = settings or Settings()
    enc = resolve(encoder, bidirectional=True)
    who = label(enc)
    config = ModelConfig(
        vocab_size=settings.vocab_size,
        num_layers=settings.num_layers,
        model_dim=settings.model_dim,
        num_heads=settings.num_heads,
        mlp_dim=settings.mlp_dim,
        dtype="float32",
        attention_block_size=settings.block_size,
        causal=False,
    )
    for pool in POOLS:
        try:
            model = Classifier(config, enc, HeadConfig(3, pool), rngs=nnx.Rngs(settings.seed))
        except ValueError as e:
            assert "\n" not in str(e), f"{who}: refused by the classifier in several lines"
            try:
                enc.check_causal(False)
            except ValueError:
                return  # causal only: the refusal is the contract
            raise AssertionError(
                f"{who}: runs bidirectionally, yet the classifier refuses it: {e}"
            ) from None
        _check_padding(model, settings, f"{who}, pool={pool!r}")


def _check_padding(model: Classifier, settings: Settings, who: str) -> None:
    graphdef, state = nnx.split(model)
    run = jit(lambda state, x, s, m: nnx.merge(graphdef, state)(x, s, m))
    rng = np.random.default_rng(settings.seed + 11)
    length, real = settings.length, settings.length - 5
    tokens = jnp.asarray(rng.integers(0, settings.vocab_size, (2, length)), jnp.int32)
    segments = (jnp.arange(length)[None, :] >= 3).astype(jnp.int32).repeat(2, 0)
    mask = jnp.arange(length)[None, :] < jnp.array([[real], [length]])
    base = np.asarray(run(state, tokens, segments, mask))
    alone = np.asarray(run(state, tokens[:1, :real], segments[:1, :real], mask[:1, :real]))
    tol = settings.tolerance * 10
    np.testing.assert_allclose(
        base[:1], alone, rtol=tol, atol=tol, err_msg=f"{who}: a padded row differs from the row"
    )
    last = tokens.at[1, -1].set((tokens[1, -1] + 1) % settings.vocab_size)
    changed = np.asarray(run(state, last, segments, mask))
    assert np.abs(changed[1] - base[1]).max() > 1e-6, f"{who}: the last token is not read"
