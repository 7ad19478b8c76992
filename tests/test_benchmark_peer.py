"""The benchmark's hand-written peer computes what posenc's NoPE model computes."""

import jax
import numpy as np
import pytest
from flax import nnx

from posenc.benchmark import Settings
from posenc.benchmark import peer as peer_lib
from posenc.benchmark.settings import make_config
from posenc.models import build


def _config(**model):
    config = make_config(Settings(size="cpu", encoders=("nope",)), "nope")
    for field, value in model.items():
        config.model[field] = value
    return config


def test_logits_equal_posenc_models_with_the_same_parameters():
    config = _config(num_layers=2, model_dim=32, num_heads=2, mlp_dim=64)
    model = build(config)
    tokens = jax.random.randint(jax.random.key(3), (2, 24), 0, config.model.vocab_size)
    want = np.asarray(nnx.jit(lambda m, t: m(t))(model, tokens))
    forward = jax.jit(peer_lib.forward, static_argnums=2)
    got = np.asarray(forward(peer_lib.params_of(model), tokens, config.model.norm_eps))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "field,value", [("mlp", "swiglu"), ("norm", "rmsnorm"), ("qkv_bias", True)]
)
def test_other_architectures_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"model.{field}="):
        peer_lib.check_supported(_config(**{field: value}).model)
