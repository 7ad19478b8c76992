"""Rematerialisation (``model.remat``): the same gradients as without it, and less memory in the
compiled training step (XLA's buffer assignment, as ``posenc plan`` reads it).

Compiling gradients costs seconds even for one tiny block, so both are in the slow step.
"""

from __future__ import annotations

import dataclasses

import _train_helpers as helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.layers.block import REMAT_POLICIES
from posenc.layers.config import REMATS, ModelConfig
from posenc.models.encdec import EncoderDecoder
from posenc.models.lm import Transformer
from posenc.runs import plan
from posenc.runs.config import apply_overrides, load_config

TINY = ModelConfig(num_layers=2, model_dim=32, num_heads=4, mlp_dim=64, dtype="float32")


def test_every_remat_choice_has_a_policy_and_a_bad_one_is_refused():
    assert set(REMATS) == {"none", *REMAT_POLICIES}
    with pytest.raises(ValueError, match=r"model\.remat must be one of \['none', 'full', 'dots'\]"):
        ModelConfig(remat="some")


def _grads(model, loss) -> list[np.ndarray]:
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    grad = jax.jit(jax.grad(lambda p: loss(nnx.merge(graphdef, p, rest))))(params)
    return [np.asarray(g) for g in jax.tree.leaves(grad)]


@pytest.mark.slow
def test_remat_gives_the_gradients_of_no_remat():
    """Every block under ``jax.checkpoint`` ("full": recompute all; "dots": keep the weight
    matmuls) gives the plain model's gradients: the decoder-only LM with dropout (the
    recomputation draws the same masks) and XL's per-layer parameters, and an encoder-decoder
    (T5's shared tables, cross-attention)."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 257, (2, 12)), jnp.int32)
    source = jnp.asarray(rng.integers(0, 257, (2, 10)), jnp.int32)
    cases = {
        "xl": (Transformer, lambda m: m(tokens, rng=jax.random.key(1)).mean()),
        "t5": (EncoderDecoder, lambda m: m(source, tokens, rng=jax.random.key(1)).mean()),
    }
    for name, (cls, loss) in cases.items():
        config = dataclasses.replace(TINY, dropout=0.1)
        plain = _grads(cls(config, encodings.get(name), rngs=nnx.Rngs(0)), loss)
        assert max(np.abs(g).max() for g in plain) > 0
        for remat in REMAT_POLICIES:
            config = dataclasses.replace(config, remat=remat)
            model = cls(config, encodings.get(name), rngs=nnx.Rngs(0))
            for a, b in zip(plain, _grads(model, loss), strict=True):
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=f"{name} {remat}")


@pytest.mark.slow
def test_remat_shrinks_the_planned_training_step():
    """``posenc plan``'s compiled training step of a 4-layer model keeps a block's activations
    instead of four: with "full" its temporaries are under half of no remat's (1.5 MB
    against 5.0 MB), "dots" in between (1.9 MB). On a CPU this needs fits.compiler_options():
    without it XLA:CPU merged the recomputation back into the forward pass, and the three were
    equal."""
    temporaries = {}
    for remat in REMATS:
        config = apply_overrides(
            load_config(helpers.TINY_SPEC),
            [
                "model.num_layers=4",
                "model.model_dim=32",
                "model.num_heads=2",
                "model.mlp_dim=128",
                "train.seq_len=64",
                "train.batch_size=4",
                f"model.remat={remat}",
            ],
        )
        temporaries[remat] = plan.plan(config, parts=("train",)).train["temporaries"]
    assert temporaries["full"] < 0.5 * temporaries["none"], temporaries
    assert temporaries["full"] <= temporaries["dots"] < temporaries["none"], temporaries
