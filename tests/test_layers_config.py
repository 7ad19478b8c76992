"""The ``layers`` section of a run config (posenc/layers/pattern.py): bad input refused in one line
naming the field before anything is built, how a pattern repeats over the layers, a shared-scope
encoder's one table per kind, and a pattern run that trains, stops and resumes exactly."""

from __future__ import annotations

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.models.build import build, layer_kinds
from posenc.runs.config import load_config, validate
from posenc.runs.train import train


def _config(pattern=(), kinds=None, model=None, data_dir="unused"):
    """The shrunken tiny config (1 layer unless ``model`` says otherwise, train.seq_len 16) with
    ``config.layers`` and ``config.model`` fields set."""
    config = helpers.tiny_config(data_dir)
    with config.unlocked():
        config.model.update(model or {})
        config.layers.pattern = tuple(pattern)
        for name, fields in (kinds or {}).items():
            config.layers.kinds[name] = fields
    return config


def _refused(config, *needles: str) -> str:
    """``validate`` refuses ``config`` in one line holding every needle."""
    with pytest.raises(ValueError) as error:
        validate(config)
    message = str(error.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


# --- bad input ----------------------------------------------------------------------------------

_TWO = {"num_layers": 2}


def test_a_pattern_naming_an_undefined_kind():
    _refused(
        _config(("a", "b"), {"a": {}}, _TWO),
        "layers.pattern names kind 'b'",
        "does not define",
    )


def test_an_unused_kind():
    _refused(_config(("a",), {"a": {}, "b": {}}), "layers.kinds.b is not in layers.pattern")


def test_an_unknown_kind_field():
    _refused(
        _config(("a",), {"a": {"windw": "sliding:4"}}),
        "layers.kinds.a.windw is not a layer-kind field",
        "'window'",
    )


def test_a_kind_with_hparams_but_no_encoding():
    _refused(
        _config(("a",), {"a": {"hparams": {"base": 100.0}}}),
        "layers.kinds.a.hparams is set without layers.kinds.a.encoding",
    )


@pytest.mark.parametrize("name", ["learned", "sinusoidal"])
def test_a_kind_naming_an_input_embedding_encoder(name):
    config = _config(("a", "b"), {"a": {"encoding": name}, "b": {}}, _TWO)
    _refused(config, f"layers.kinds.a.encoding={name!r} adds an input embedding", "encoding.name")
    with pytest.raises(ValueError, match="belongs to the whole model"):
        build(config)


def test_a_window_larger_than_the_training_length():
    _refused(
        _config(model={"window": "sliding:32"}),
        "model.window='sliding:32' is larger than train.seq_len=16",
    )
    _refused(
        _config(("a",), {"a": {"window": "chunked:17"}}),
        "layers.kinds.a.window='chunked:17' is larger than train.seq_len=16",
    )
    validate(_config(("a",), {"a": {"window": "chunked:16"}}))  # the training length is allowed


@pytest.mark.parametrize("window", ["sliding:x", "slide:4", "sliding:0", "sliding", "banded:-2"])
def test_a_malformed_window(window):
    _refused(_config(model={"window": window}), "model.window must be 'full', 'sliding:W'")
    _refused(
        _config(("a",), {"a": {"window": window}}),
        "layers.kinds.a.window must be 'full', 'sliding:W'",
        repr(window),
    )


def test_sinks_on_the_fused_xla_path():
    _refused(
        _config(model={"sinks": True, "attention_impl": "xla"}),
        "model.attention_impl='xla' cannot take model.sinks",
    )
    _refused(
        _config(("a",), {"a": {"sinks": True}}, {"attention_impl": "xla"}),
        "model.attention_impl='xla' cannot take layers.kinds.a.sinks",
    )


def test_options_on_linear_attention():
    _refused(
        _config(("a",), {"a": {"window": "sliding:8"}}, {"attention_impl": "linear"}),
        "model.attention_impl='linear' takes no attention options",
        "layers.kinds.a.window='sliding:8'",
    )


def test_a_pattern_in_an_encoder_decoder():
    config = load_config(str(helpers.REPO / "configs" / "translation.py:tiny"))
    with config.unlocked():
        config.layers.pattern = ("a",)
        config.layers.kinds["a"] = {"window": "sliding:8"}
    for refuse in (layer_kinds, build, validate):
        with pytest.raises(ValueError, match="not to model.assembly='encoder_decoder'") as error:
            refuse(config)
        assert "\n" not in str(error.value)


# --- how the pattern is laid over the layers ----------------------------------------------------


def test_a_pattern_that_does_not_divide_the_layers_repeats_and_is_cut_short():
    config = _config(
        ("a", "b"),
        {"a": {"window": "sliding:8"}, "b": {"encoding": "nope"}},
        {"num_layers": 5},
    )
    validate(config)
    model = build(config)
    assert [block.kind for block in model.blocks] == ["a", "b", "a", "b", "a"]
    assert [block.encoding.name for block in model.blocks] == ["rope", "nope"] * 2 + ["rope"]
    assert [str(block.options.window) for block in model.blocks] == ["sliding:8", "full"] * 2 + [
        "sliding:8"
    ]


def _t5_tables(model) -> dict[str, np.ndarray]:
    """The model's T5 tables, keyed by their path in its parameter tree."""
    leaves = helpers.param_leaves(model).items()
    return {k.removesuffix(".value"): v for k, v in leaves if "table" in k}


@pytest.mark.slow  # trains (about 15 s)
def test_a_shared_scope_encoder_has_one_table_per_kind_and_both_train(data_dir, tmp_path):
    kinds = {"near": {"encoding": "t5", "window": "sliding:8"}, "far": {"encoding": "t5"}}
    config = _config(
        ("near", "far"),
        kinds,
        {"num_layers": 4},
        data_dir=data_dir,
    )
    with config.unlocked():
        config.train.steps = 3
    initial = helpers.initial_model(config)
    assert initial.shared_pos_params is None  # the model's own encoder, RoPE, has none
    tables = _t5_tables(initial)
    # Two tables in the whole tree, each its kind's, none in a block.
    near, far = (f"['kind_pos_params']['{k}']['table']" for k in ("near", "far"))
    assert sorted(tables) == sorted([far, near]), sorted(tables)
    assert tables[near].shape == tables[far].shape
    # Each block reads its kind's table.
    shared = initial.layer_shared()
    assert [set(s) for s in shared] == [{"table"}] * 4
    assert shared[0]["table"] is shared[2]["table"] and shared[1]["table"] is shared[3]["table"]

    trained = _t5_tables(train(config, str(tmp_path / "run")).model)
    for key, table in tables.items():
        assert np.isfinite(trained[key]).all()
        assert not np.allclose(trained[key], table), f"{key} did not train"
    assert not np.allclose(trained[near], trained[far])


@pytest.mark.slow  # about 35 s on a 2-core CPU: three short training runs
def test_a_pattern_run_stops_and_resumes_exactly(data_dir, tmp_path):
    config = _config(
        ("local", "global"),
        {"local": {"window": "sliding:4", "sinks": True}, "global": {"encoding": "nope"}},
        {"num_layers": 2},
        data_dir=data_dir,
    )
    with config.unlocked():
        config.train.steps = 4
        config.train.checkpoint_every = 100
    full = train(config, str(tmp_path / "full"))
    cut = str(tmp_path / "cut")
    first = train(config, cut, stop_at=2)
    assert (first.step, first.resumed_from) == (2, None)
    second = train(config, cut)
    assert (second.step, second.resumed_from) == (4, 2)
    helpers.assert_same_leaves(helpers.param_leaves(full.model), helpers.param_leaves(second.model))
