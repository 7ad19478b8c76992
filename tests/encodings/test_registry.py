"""The encoder registry and the hook contract (posenc.encodings.__init__ and base)."""

from __future__ import annotations

import dataclasses

import pytest

from posenc import encodings
from posenc.encodings import Dims

ALL = ("alibi", "learned", "nope", "rope", "shaw", "sinusoidal", "t5", "xl")

# Which hooks each founding encoder provides, and where its parameters live (DESIGN.md).
EXPECTED_HOOKS = {
    "sinusoidal": ("embed",),
    "learned": ("embed",),
    "shaw": ("content_logits", "value_term"),
    "xl": ("content_logits",),
    "t5": ("bias",),
    "rope": ("rotate",),
    "alibi": ("bias",),
    "nope": (),
}
SHARED = {"sinusoidal", "learned", "t5"}


def test_names_are_the_eight_founding_encoders():
    assert encodings.names() == ALL


@pytest.mark.parametrize("name", ALL)
def test_each_encoder_declares_its_hooks_scope_and_paper(name):
    enc = encodings.get(name)
    assert enc.name == name and enc.paper
    assert enc.hooks == EXPECTED_HOOKS[name]
    assert enc.param_scope == ("shared" if name in SHARED else "layer")
    assert "dims" not in enc.hparams()
    assert set(enc.hparams()) == set(encodings.hparam_names(name))


def test_unknown_encoder_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown encoding.name 'ropee'") as info:
        encodings.get("ropee")
    for name in ALL:
        assert name in str(info.value)


def test_unknown_hyperparameter_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match="theta") as info:
        encodings.get("rope", theta=1e4)
    for field in ("base", "layout", "fraction"):
        assert field in str(info.value)
    with pytest.raises(ValueError, match=r"accepts: \(none\)"):
        encodings.get("nope", base=1.0)
    # dims is set by bind, not a hyperparameter.
    with pytest.raises(ValueError, match="dims"):
        encodings.get("alibi", dims=Dims(1, 1, 1))


def test_bind_fills_dims_and_rejects_bad_shapes():
    enc = encodings.get("rope")
    with pytest.raises(RuntimeError, match="not bound"):
        _ = enc.bound_dims
    dims = Dims(num_heads=2, head_dim=8, model_dim=16)
    bound = enc.bind(dims)
    assert bound.dims == dims and enc.dims is None  # bind returns a copy
    with pytest.raises(ValueError, match="model.num_heads"):
        enc.bind(Dims(num_heads=0, head_dim=8, model_dim=16))


def test_encoders_are_frozen_and_hashable():
    enc = encodings.get("shaw", max_distance=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        enc.max_distance = 5
    assert hash(enc) == hash(encodings.get("shaw", max_distance=4))


def test_register_refuses_a_second_class_under_a_taken_name():
    @dataclasses.dataclass(frozen=True)
    class Impostor(encodings.Encoding):
        name = "rope"

    with pytest.raises(ValueError, match="already registered"):
        encodings.register(Impostor)
    assert encodings.get_class("rope") is encodings.RoPE
