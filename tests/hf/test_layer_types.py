"""Per-layer types of a Hugging Face config (posenc/hf/layer_types.py) and a spec's layer
pattern through the run config and the model build."""

from __future__ import annotations

import dataclasses

import pytest

from posenc.hf.family import Spec
from posenc.hf.fields import HFConfig
from posenc.hf.layer_types import (
    expand,
    pattern_of,
    read_layer_types,
    read_rope_by_type,
    write_layer_types,
)
from posenc.layers.config import ModelConfig

S, F = "sliding_attention", "full_attention"


def _hf(**fields):
    return HFConfig(fields, "test", "cfg")


@pytest.mark.parametrize(
    "types, pattern",
    [
        ([F] * 4, (F,)),
        ([S, F] * 3, (S, F)),
        # Gemma 3 1B: 26 layers, five local then one global, cut short at the top.
        ([S] * 5 + [F] + [S] * 5 + [F] + [S] * 5 + [F] + [S] * 5 + [F] + [S, S], (S,) * 5 + (F,)),
        ([S, F, F], (S, F, F)),  # never repeats: its own pattern
        ([F, F, S], (F, F, S)),
    ],
)
def test_pattern_of_is_the_shortest_that_repeats_to_the_list(types, pattern):
    assert pattern_of(types) == pattern
    assert list(expand(pattern, len(types))) == types


def test_read_layer_types_default_and_refusals():
    assert read_layer_types(_hf(), 3) == (F, F, F)
    assert read_layer_types(_hf(), 2, default=[S, F]) == (S, F)
    assert read_layer_types(_hf(layer_types=[S, F]), 2) == (S, F)
    with pytest.raises(ValueError, match=r"lists 3 layers, but the model has num_hidden_layers=2"):
        read_layer_types(_hf(layer_types=[S, F, S]), 2)
    with pytest.raises(ValueError, match=r"entry 'linear_attention' is not supported.*full_att"):
        read_layer_types(_hf(layer_types=[S, "linear_attention"]), 2)
    with pytest.raises(ValueError, match=r"layer_types='full' must be a list of strings"):
        read_layer_types(_hf(layer_types="full"), 2)


def test_rope_by_type_flat_serves_every_type():
    got = read_rope_by_type(_hf(rope_theta=500.0), 8, 64, (S, F, S))
    assert set(got) == {S, F}
    assert got[S] == got[F] == ({"base": 500.0, "layout": "half"}, 64)


def test_rope_by_type_nested_gives_each_type_its_own():
    nested = {
        S: {"rope_type": "default", "rope_theta": 10000.0},
        F: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    }
    got = read_rope_by_type(_hf(rope_parameters=nested), 8, 64, (S, F))
    assert got[S] == ({"base": 10000.0, "layout": "half"}, 64)
    assert got[F] == ({"base": 1e6, "layout": "half", "scaling": "linear", "factor": 8.0}, 64)


def test_rope_by_type_nested_refusals():
    nested = {S: {"rope_type": "default"}, F: {"rope_type": "default"}}
    with pytest.raises(ValueError, match=r"entry for layer type 'sliding_attention', which no"):
        read_rope_by_type(_hf(rope_parameters=nested), 8, 64, (F, F))
    with pytest.raises(ValueError, match=r"has no entry for 'full_attention'"):
        read_rope_by_type(_hf(rope_parameters={S: {"rope_type": "default"}}), 8, 64, (S, F))


def test_write_layer_types_expands_and_refuses_other_names():
    assert write_layer_types((S, F), 3) == {"layer_types": [S, F, S]}
    with pytest.raises(ValueError, match=r"kind 'local' is not a transformers layer type"):
        write_layer_types(("local",), 2)


def _spec():
    model = ModelConfig(vocab_size=32, num_layers=3, model_dim=16, num_heads=2, mlp_dim=32)
    layers = {
        "pattern": (S, F),
        "kinds": {S: {"window": "sliding:4"}, F: {"encoding": "nope"}},
    }
    return Spec(model, "lm", "rope", {"base": 10000.0}, 32, layers=layers)


def test_spec_layers_reach_the_run_config_and_come_back():
    from posenc.hf.rundir import base_config, run_config, spec_of_run

    spec = _spec()
    config = run_config(spec, base_config(), source="pystdlib", tokenizer="bytes")
    assert tuple(config.layers.pattern) == (S, F)
    assert config.layers.kinds.to_dict() == spec.kinds
    back = spec_of_run(config)
    assert back.pattern == spec.pattern and back.kinds == spec.kinds
    assert dataclasses.replace(spec, layers={}).pattern == ()


def test_convert_build_makes_each_layer_of_its_kind():
    from flax import nnx

    from posenc.hf.convert import build

    graphdef, params, rest = build(_spec())
    model = nnx.merge(graphdef, params, rest)
    blocks = list(model.blocks)
    assert [block.kind for block in blocks] == [S, F, S]
    assert [block.options.window for block in blocks] == ["sliding:4", "full", "sliding:4"]
    assert blocks[1].encoding.name == "nope" and blocks[0].encoding.name == "rope"
