"""Evaluation batches sized from a memory budget (``eval.batch_tokens`` None,
``eval.memory_budget``; :mod:`posenc.devices.budget`, :meth:`posenc.kinds.stream.Scorer.rows`).

Against the compiled programs' own figures (XLA's buffer assignment, nothing run): the rows
chosen fit the budget, a larger budget never gives fewer, the token cap and the windows bound
them; an evaluation sized so scores what one with explicit batches does; ``posenc plan --only
eval`` sizes the batch as the evaluation does; a budget that is not a size is refused in one
line naming the field.
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from posenc import encodings
from posenc.devices import budget, fits
from posenc.kinds.stream import BudgetWarning, Scorer, evaluate
from posenc.layers.config import ModelConfig
from posenc.models.lm import Transformer
from posenc.runs.config import load_config, validate
from posenc.runs.plan import plan

LENGTH = 32


@pytest.fixture(scope="module")
def model():
    # A vocabulary large against the width, as a pretrained model's: the logits matter.
    config = ModelConfig(
        vocab_size=1024, num_layers=1, model_dim=16, num_heads=2, mlp_dim=32, dtype="float32"
    )
    return Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0))


def test_parse_bytes_and_the_explicit_budget():
    assert budget.parse_bytes("8GB", "eval.memory_budget") == 8 * 10**9
    assert budget.parse_bytes("1.5 GiB", "eval.memory_budget") == int(1.5 * 2**30)
    assert budget.memory_budget("300MB") == 300 * 10**6
    assert budget.memory_budget(12345) == 12345
    with pytest.raises(ValueError, match=r"^eval.memory_budget must be a size such as 80GB"):
        budget.memory_budget("lots")


def test_the_default_budget_is_a_share_of_the_device():
    got = budget.memory_budget(None, params=0)
    memory = fits.device_memory()
    assert got is not None and 0 < got <= budget.DEFAULT_SHARE * memory + 1


def test_estimated_rows_grow_with_the_budget_within_the_caps(model):
    config, params = model.config, 10**6
    one = budget.estimate(config, params, 1, LENGTH)
    rows = [budget.eval_rows(config, params, LENGTH, one * k) for k in (1, 2, 4, 8, 10**4)]
    assert rows == sorted(rows) and rows[0] == 1
    assert rows[-1] == budget.MAX_BATCH_TOKENS // LENGTH  # the token cap
    for got, k in zip(rows, (1, 2, 4, 8), strict=False):
        assert budget.estimate(config, params, got, LENGTH) <= one * k
    assert budget.eval_rows(config, params, LENGTH, 1) == 1  # nothing fits: one window
    assert budget.eval_rows(config, params, LENGTH, one, devices=4) == 4  # one per device
    assert budget.eval_rows(config, params, LENGTH, None) == budget.MAX_BATCH_TOKENS // LENGTH


def test_the_work_of_a_batch_caps_its_windows(model):
    # 2 x parameters x tokens against BATCH_FLOPS: a 135M-parameter model's 2048-token window
    # is work enough (one window a batch); a tiny model's batches stop at the token cap.
    config = model.config
    big = budget.eval_rows(config, 10**6, 2048, None, param_count=135 * 10**6)
    assert big == 1
    assert budget.eval_rows(config, 10**6, 512, None, param_count=135 * 10**6) == 7
    tiny = budget.eval_rows(config, 10**6, LENGTH, None, param_count=10**5)
    assert tiny == budget.MAX_BATCH_TOKENS // LENGTH


def test_the_default_loss_chunk_holds_128_mib_of_logits():
    shape = dict(num_layers=1, model_dim=16, num_heads=2, mlp_dim=32)
    assert ModelConfig(vocab_size=49_152, **shape).loss_chunk_tokens == 682
    assert ModelConfig(vocab_size=257, **shape).loss_chunk_tokens == 130_561  # bytes: unchunked
    assert ModelConfig(vocab_size=257, loss_chunk=0, **shape).loss_chunk_tokens == 0
    with pytest.raises(ValueError, match=r"^model.loss_chunk must be an integer >= 0"):
        ModelConfig(vocab_size=257, loss_chunk=-1, **shape)


def test_the_compiled_program_has_the_last_word(model):
    scorer = Scorer(model)
    eight = fits.required_bytes(scorer.compiled(8, LENGTH))
    # A budget the 8-row program just fits: the rows chosen fit it (by the compiled figure).
    rows = scorer.rows(LENGTH, None, eight)
    assert 1 <= rows <= 8
    assert fits.required_bytes(scorer.compiled(rows, LENGTH)) <= eight
    # Plenty of memory: the windows to score bound the rows (no padding-only rows).
    assert scorer.rows(LENGTH, None, 100 * eight, windows=5) == 5
    # An explicit eval.batch_tokens is honoured whatever the budget.
    assert scorer.rows(LENGTH, 3 * LENGTH, 1) == 3


def test_sized_batches_score_what_explicit_ones_do(model):
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 1024, 7 * LENGTH + 1).astype(np.int32)
    scorer = Scorer(model)
    two = fits.required_bytes(scorer.compiled(2, LENGTH))
    (sized,) = evaluate(model, stream, [LENGTH], memory_budget=two)
    (fixed,) = evaluate(model, stream, [LENGTH], batch_tokens=LENGTH)
    assert sized["tokens"] == fixed["tokens"] == 7 * LENGTH
    np.testing.assert_allclose(sized["loss"], fixed["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        np.array(sized["loss_by_position"], float),
        np.array(fixed["loss_by_position"], float),
        rtol=1e-5,
    )


def test_one_window_over_the_budget_runs_and_says_so(model):
    # A budget below the parameters: one window a batch, a one-line warning naming the budget,
    # and the evaluation runs (the device has the memory).
    stream = np.arange(4 * LENGTH + 1, dtype=np.int32) % 1024
    with pytest.warns(BudgetWarning, match=r"more than the evaluation's memory budget") as caught:
        (result,) = evaluate(model, stream, [LENGTH], memory_budget=1000)
    assert "\n" not in str(caught[0].message)
    assert result["tokens"] == 4 * LENGTH


def _config(*overrides):
    config = load_config("configs/base.py:tiny")
    config.model.update(vocab_size=1024, num_layers=1)
    config.eval.update(lengths=(64,), batch_tokens=None)
    for key, value in overrides:
        setattr(config.eval, key, value)
    return config


def test_plan_sizes_the_evaluation_as_it_runs():
    config = _config()
    memory = 40 * 10**6  # --device-memory: the budget is half of it
    planned = plan(config, parts=("eval",), device_memory=memory)
    e = planned.eval
    assert e["budget"] == memory // 2
    assert e["rows"] == 1 or e["peak"] <= e["budget"]
    assert f"sized from a {fits.gib(memory // 2)} budget" in planned.table()


def test_a_budget_that_is_not_a_size_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^eval.memory_budget must be a size"):
        validate(_config(("memory_budget", "half")))
    with pytest.raises(ValueError, match=r"^eval.batch_tokens must be an integer >= 1"):
        validate(_config(("batch_tokens", 0)))


@pytest.mark.filterwarnings("ignore::posenc.kinds.stream.BudgetWarning")
def test_an_evaluation_that_cannot_fit_says_what_to_change_before_it_runs(monkeypatch):
    # A device of 200 kB: one window's logits (32 x 8192 float32 = 1 MB, formed at once with
    # model.loss_chunk=0) cannot fit; refused in one line naming the settings, nothing run.
    config = ModelConfig(
        vocab_size=8192,
        num_layers=1,
        model_dim=8,
        num_heads=2,
        mlp_dim=16,
        dtype="float32",
        loss_chunk=0,
    )
    small = Transformer(config, encodings.get("rope"), rngs=nnx.Rngs(0))
    monkeypatch.setattr(fits, "device_memory", lambda device=None: 200_000)
    stream = np.arange(8 * LENGTH + 1, dtype=np.int32) % 8192
    with pytest.raises(fits.DoesNotFitError) as error:
        evaluate(small, stream, [LENGTH])
    line = str(error.value)
    assert "\n" not in line and f"evaluating length {LENGTH} in batches of 1 window" in line
    assert "unset model.loss_chunk (now 0: every logit at once" in line, line
