"""posenc.runs.paths: the attention path of each backend, asked from a CPU. On the CPU it is
exactly what ``auto`` chooses here (the benchmark's ``chosen_path``); for a GPU and a TPU it
follows the rules of :func:`posenc.attention.core.choose_implementation`'s docstring, written
out below per kind of encoder."""

from __future__ import annotations

import jax
import pytest
from flax import nnx

from posenc import encodings
from posenc.benchmark.measure import chosen_path
from posenc.models import build
from posenc.runs.config import load_config
from posenc.runs.paths import BACKENDS, describe, layer_path, paths_by_backend

# Block of 64 queries: windows of 64 are "short", 256 "long".
SHORT, LONG, BLOCK = 64, 256, 64


def _model(encoder: str, dtype: str = "bfloat16", impl: str = "auto", **hparams):
    config = load_config("configs/base.py:tiny")
    config.model.update(dtype=dtype, attention_block_size=BLOCK, attention_impl=impl)
    config.encoding.name = encoder
    if hparams:
        with config.encoding.hparams.unlocked():
            config.encoding.hparams.update(hparams)
    return nnx.eval_shape(lambda: build(config))


def _expected_gpu(hooks: set[str], normalized: bool, long: bool) -> str:
    """The documented rules, for a bf16 model whose head width cuDNN takes."""
    if {"value_term", "contextual_logits", "householder"} & hooks or not normalized:
        return "blocked" if long else "einsum"
    if "content_logits" in hooks:
        return "blocked" if long else "xla"
    if ("bias" in hooks or "log_decay" in hooks) and long:
        return "blocked"
    return "cudnn"


@pytest.mark.parametrize(
    "encoder",
    ["nope", "rope", "sinusoidal", "learned", "alibi", "t5", "shaw", "xl", "fire", "kerple_log"],
)
def test_each_backend_follows_the_rules(encoder):
    model = _model(encoder)
    enc = model.blocks[0].encoding
    hooks = set(enc.hooks)
    assert jax.default_backend() == "cpu"
    for length in (SHORT, LONG):
        paths = paths_by_backend(model, length)
        assert tuple(paths) == BACKENDS
        # On this machine: what auto picks here.
        assert paths["cpu"] == chosen_path(model, length, "auto")
        assert paths["gpu"] == _expected_gpu(hooks, enc.normalized, length > BLOCK)
        # A TPU has no cuDNN: the CPU's answer.
        assert paths["tpu"] == paths["cpu"]
    if not ({"bias", "content_logits", "value_term", "contextual_logits"} & hooks):
        # Rotate/embed-only encoders take the fused kernel on a GPU at any length.
        assert paths_by_backend(model, LONG)["gpu"] == "cudnn"


def test_float32_or_an_explicit_path_never_takes_cudnn():
    assert layer_path(_model("rope", dtype="float32"), SHORT, "gpu") == "xla"
    explicit = _model("rope", impl="blocked")
    assert paths_by_backend(explicit, SHORT) == dict.fromkeys(BACKENDS, "blocked")
    assert describe({"cpu": "xla", "gpu": "cudnn"}) == "cpu xla, gpu cudnn"


def test_every_registered_encoder_has_an_answer_on_every_backend():
    from posenc import testing

    for name in encodings.names():
        hparams = testing.HPARAMS.get(name, {})
        model = _model(name, **hparams)
        for path in paths_by_backend(model, SHORT).values():
            assert path in ("cudnn", "xla", "einsum", "blocked"), (name, path)


def test_plan_states_the_path_of_each_backend_at_its_lengths():
    from posenc.runs.plan import Plan, _paths

    config = load_config("configs/base.py:tiny")
    config.model.update(dtype="bfloat16", attention_block_size=BLOCK)
    config.encoding.name = "alibi"
    config.train.seq_len = SHORT
    config.eval.lengths = (SHORT, LONG)
    paths = _paths(config, ("train", "eval"))
    # A bias: cuDNN within one block on a GPU, blocked past it; XLA, then blocked elsewhere.
    assert paths == {
        str(SHORT): {"cpu": "xla", "gpu": "cudnn", "tpu": "xla"},
        str(LONG): {"cpu": "blocked", "gpu": "blocked", "tpu": "blocked"},
    }
    assert list(_paths(config, ("eval",))) == [str(LONG)]
    e = {"peak": 2**20, "rows": 1, "length": LONG, "temporaries": 2**19}
    mesh = {"data": 1, "fsdp": 1, "context": 1, "tensor": 1}
    plan = Plan(1, mesh, 2**20, None, None, e, paths=paths)
    assert f"  attention at {LONG} tokens: cpu blocked, gpu blocked, tpu blocked" in plan.table()
