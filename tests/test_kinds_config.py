"""The run-kind contract's config, plan and analysis answers (posenc.kinds): which kind a config
is, a kind refusing another's config, what ``posenc plan`` compiles and what ``posenc analyze``
reads, asked of every registered kind.

Nothing here compiles, trains or reads data.
"""

from __future__ import annotations

import _train_helpers as helpers
import jax.numpy as jnp
import pytest

from posenc import kinds
from posenc.runs.config import apply_overrides, load_config, validate

MASKED = ("train.objective=masked_lm", "model.causal=False")


def _configs():
    """One config of each built-in kind: {kind name: config}."""
    tiny = helpers.tiny_config("/nonexistent")
    return {
        "causal_lm": tiny,
        "masked_lm": apply_overrides(tiny, MASKED),
        "task": load_config("configs/tasks.py:tiny"),
        "translation": load_config("configs/translation.py:tiny"),
        "classification": load_config("configs/classify.py:tiny"),
    }


@pytest.fixture(scope="module")
def configs():
    return _configs()


def test_each_config_is_its_kind(configs):
    assert {name: kinds.kind_of(c).name for name, c in configs.items()} == {
        name: name for name in configs
    }


def test_unknown_assembly_named_as_build_names_it(configs):
    config = apply_overrides(configs["causal_lm"], [])
    with config.model.unlocked():
        config.model.assembly = "diffusion"
    with pytest.raises(ValueError, match=r"model.assembly must be one of \[.*\], got 'diffusion'"):
        kinds.kind_of(config)
    with pytest.raises(ValueError, match=r"model.assembly must be one of"):
        validate(config)


@pytest.mark.parametrize("name", kinds.names())
def test_check_kind_refuses_another_kinds_config(name, configs):
    kind = kinds.get(name)
    for other, config in configs.items():
        if other == name:
            kinds.require(config, name, "posenc frobnicate")
            assert kinds.require(config, name, "posenc frobnicate") is kind
            continue
        with pytest.raises(ValueError) as err:
            kinds.require(config, name, "posenc frobnicate")
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(f"posenc frobnicate needs a {name} run ({kind.chosen_by})")
        assert f"this is a {other} run ({kinds.get(other).chosen_by})" in message


def test_plan_answers(configs):
    causal, masked, task = (kinds.kind_of(configs[n]) for n in ("causal_lm", "masked_lm", "task"))
    t = configs["causal_lm"].train
    assert causal.plan_lengths(configs["causal_lm"], ("train",)) == {"train.seq_len": t.seq_len}
    longest = max(configs["causal_lm"].eval.lengths)
    assert causal.plan_lengths(configs["causal_lm"], ("eval",)) == {"eval.lengths": longest}
    by_multiples = apply_overrides(configs["causal_lm"], ["eval.lengths=()"])
    assert causal.plan_lengths(by_multiples, ("eval",)) == {
        "eval.multiples x train.seq_len": max(by_multiples.eval.multiples) * t.seq_len
    }
    assert task.plan_lengths(configs["task"], ("train", "eval")) == {
        "train.seq_len": configs["task"].train.seq_len
    }
    assert kinds.get("translation").plan_lengths(configs["translation"], ("train",)) is None
    batch, shape = causal.plan_step(configs["causal_lm"], None)
    assert batch == {k: ((t.batch_size, t.seq_len), jnp.int32) for k in ("inputs", "targets")}
    assert shape == {"rows": t.batch_size, "length": t.seq_len}
    assert "weights" in masked.plan_step(configs["masked_lm"], None)[0]
    assert "weights" in task.plan_step(configs["task"], None)[0]
    assert (causal.plan_eval, masked.plan_eval, task.plan_eval) == (True, True, False)
    for name in ("causal_lm", "masked_lm"):
        assert kinds.get(name).plan_refusal(configs[name], ("eval",)) is None
    classification = kinds.get("classification")
    assert classification.plan_refusal(configs["classification"], ("train",)) is None
    assert "evaluation is not planned" in classification.plan_refusal(
        configs["classification"], ("eval",)
    )


def test_analysis_answers(configs):
    readable = {n for n, c in configs.items() if kinds.kind_of(c).analysis_refusal(c) is None}
    assert readable == {"causal_lm", "masked_lm"}
    assert kinds.get("causal_lm").window_masking(configs["causal_lm"]) is None
    assert kinds.get("masked_lm").window_masking(configs["masked_lm"]) is not None
    assert kinds.get("masked_lm").objective == "masked_lm"
