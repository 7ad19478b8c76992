"""Evaluation is exact: every reported number equals a direct computation over the same windows.

The direct computation calls the model on one window at a time (no batching, no padding, no
masks) and takes the cross entropy in float64 numpy from the logits.
"""

from __future__ import annotations

import json
import math

import _train_helpers as helpers
import numpy as np
import pytest

from posenc.kinds.stream import evaluate
from posenc.models.restore import load_model
from posenc.runs.evaluate import evaluate_workdir, load_eval
from posenc.runs.train import train
from posenc.workdir import EVAL_FILE

SEQ_LEN = 16


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A RoPE model trained for 400 steps at length 16 (enough that context clearly helps)."""
    config = helpers.tiny_config(
        data_dir,
        f"train.seq_len={SEQ_LEN}",
        "train.steps=400",
        "train.log_every=100",
        "train.checkpoint_every=400",
        "optim.warmup_steps=10",
    )
    workdir = str(tmp_path_factory.mktemp("trained") / "run")
    result = train(config, workdir)
    return config, workdir, result.model


@pytest.fixture(scope="module")
def val(data_dir):
    return helpers.stream(data_dir, "validation")


def _direct(model, stream: np.ndarray, length: int, stride: int) -> dict:
    """Scores windows ``stream[k*stride : k*stride + length]`` one by one.

    Window 0 scores all its targets, later windows the last ``stride`` (the sliding-window
    protocol; stride == length is the non-overlapping one). Also counts how often each stream
    position is scored as a target.
    """
    forward = helpers.jit_forward(model)  # the model itself, one window per call
    n = (len(stream) - 1 - length) // stride + 1
    loss_sum = np.zeros(length)
    count = np.zeros(length)
    times_scored = np.zeros(len(stream), np.int64)
    for k in range(n):
        start = k * stride
        inputs = stream[start : start + length]
        targets = stream[start + 1 : start + length + 1]
        losses = helpers.cross_entropy(forward(inputs[None])[0], targets)  # [L] float64
        first = 0 if k == 0 else length - stride
        loss_sum[first:] += losses[first:]
        count[first:] += 1
        times_scored[start + 1 + first : start + 1 + length] += 1
    return {
        "windows": n,
        "tokens": int(count.sum()),
        "loss": loss_sum.sum() / count.sum(),
        "by_position": loss_sum / np.maximum(count, 1),
        "count": count,
        "times_scored": times_scored,
    }


def _without_timing(results):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results]


def test_nonoverlapping_equals_direct_computation(trained, val):
    _, _, model = trained
    lengths = [16, 40]  # the training length and a longer one
    stream = val[:241]  # 240 predictable tokens: 15 and 6 windows
    # 64 tokens per batch: 4 windows of 16 (the last batch has a padding row), 1 window of 40.
    results = evaluate(model, stream, lengths, batch_tokens=64)
    assert [r["length"] for r in results] == lengths
    for length, r in zip(lengths, results, strict=True):
        d = _direct(model, stream, length, length)
        assert r["windows"] == d["windows"] == 240 // length
        assert r["tokens"] == d["tokens"] == 240
        assert r["unscored_tokens"] == r["unscored_by_max_tokens"] == 0
        assert (d["times_scored"][1:] == 1).all() and d["times_scored"][0] == 0
        assert r["loss"] == pytest.approx(d["loss"], rel=1e-6)
        assert r["perplexity"] == pytest.approx(math.exp(d["loss"]), rel=1e-6)
        assert r["bits_per_byte"] == pytest.approx(d["loss"] / math.log(2), rel=1e-6)
        assert len(r["loss_by_position"]) == length
        np.testing.assert_allclose(r["loss_by_position"], d["by_position"], atol=2e-5)


def test_tokens_scored_and_dropped(trained, val):
    _, _, model = trained
    # 99 predictable tokens at L=16: 6 windows, 96 tokens, 3 left over.
    (r,) = evaluate(model, val[:100], [16], batch_tokens=64)
    assert (r["windows"], r["tokens"], r["unscored_tokens"], r["unscored_by_max_tokens"]) == (
        6,
        96,
        3,
        0,
    )
    # max_tokens caps the windows and reports the rest as unscored, most of it by the cap (all
    # but the tail after the last whole window of the split).
    (r,) = evaluate(model, val, [16], batch_tokens=64, max_tokens=100)
    assert (r["windows"], r["tokens"], r["unscored_tokens"]) == (6, 96, len(val) - 1 - 96)
    assert r["unscored_by_max_tokens"] == (len(val) - 1) // 16 * 16 - 96
    capped = r
    (r,) = evaluate(model, val[:97], [16], batch_tokens=64)  # exactly those 96 targets
    assert r["loss"] == pytest.approx(capped["loss"], rel=1e-12)
    # A max_tokens below one window still scores one window.
    (r,) = evaluate(model, val, [16], batch_tokens=64, max_tokens=5)
    assert (r["windows"], r["tokens"]) == (1, 16)


def test_padding_rows_do_not_change_the_result(trained, val):
    _, _, model = trained
    stream = val[: 16 * 11 + 1]  # 11 windows of 16: no batch size below 11 divides it
    reference = None
    for batch_tokens in (16, 48, 80, 4096):  # 1, 3, 5, 256 windows per batch
        (r,) = evaluate(model, stream, [16], batch_tokens=batch_tokens)
        assert r["tokens"] == 176 and r["windows"] == 11
        if reference is None:
            reference = r
            continue
        assert r["loss"] == pytest.approx(reference["loss"], rel=1e-6), batch_tokens
        np.testing.assert_allclose(r["loss_by_position"], reference["loss_by_position"], atol=2e-5)


def test_sliding_with_stride_equal_to_length_is_nonoverlapping(trained, val):
    _, _, model = trained
    stream = val[:200]
    kwargs = dict(batch_tokens=64, max_tokens=0)
    plain = evaluate(model, stream, [16, 32], **kwargs)
    sliding16 = evaluate(model, stream, [16], mode="sliding", stride=16, **kwargs)
    sliding32 = evaluate(model, stream, [32], mode="sliding", stride=32, **kwargs)
    assert _without_timing(sliding16 + sliding32) == _without_timing(plain)


def test_sliding_scores_each_token_once_with_more_context(trained, val):
    _, _, model = trained
    length, stride = SEQ_LEN, 4
    stream = val[:257]  # 256 predictable tokens
    (r,) = evaluate(model, stream, [length], mode="sliding", stride=stride, batch_tokens=160)
    d = _direct(model, stream, length, stride)
    assert d["windows"] == r["windows"] == 1 + (256 - length) // stride
    assert r["tokens"] == d["tokens"] == 256 and r["unscored_tokens"] == 0
    assert (d["times_scored"][1:] == 1).all(), "every target position scored exactly once"
    assert r["loss"] == pytest.approx(d["loss"], rel=1e-6)
    by_position = np.array([np.nan if x is None else x for x in r["loss_by_position"]])
    np.testing.assert_allclose(by_position, d["by_position"], atol=2e-5)
    # Positions before the scored tail are scored only in the first window.
    np.testing.assert_array_equal(d["count"][: length - stride], 1)

    # The same 256 targets without overlap: each sees less context on average.
    (plain,) = evaluate(model, stream, [length], batch_tokens=160)
    assert plain["tokens"] == 256
    assert r["loss"] < plain["loss"] - 0.02, (r["loss"], plain["loss"])
    # ... and the trained model does use its context: late positions beat early ones.
    assert np.mean(plain["loss_by_position"][-4:]) < plain["loss_by_position"][0]


def test_sliding_max_tokens_matches_a_truncated_stream(trained, val):
    _, _, model = trained
    capped = evaluate(model, val, [16], mode="sliding", stride=8, batch_tokens=256, max_tokens=96)
    whole = evaluate(model, val[:97], [16], mode="sliding", stride=8, batch_tokens=256)
    assert capped[0]["tokens"] == whole[0]["tokens"] == 96
    assert capped[0]["loss"] == pytest.approx(whole[0]["loss"], rel=1e-12)


def test_learned_beyond_its_table_is_an_error_entry(data_dir, val):
    config = helpers.tiny_config(data_dir, "encoding.name=learned", "encoding.hparams.max_len=32")
    model = helpers.initial_model(config)
    results = evaluate(model, val[:200], [16, 64, 32], batch_tokens=64)
    assert [r["length"] for r in results] == [16, 64, 32]
    assert set(results[1]) == {"length", "error"}
    assert "encoding.hparams.max_len=32" in results[1]["error"]
    assert "64" in results[1]["error"]
    for r in (results[0], results[2]):
        assert "error" not in r and math.isfinite(r["loss"])
    # An untrained model scores about log(vocab) nats per token.
    assert abs(results[0]["loss"] - math.log(257)) < 0.5


def test_length_longer_than_the_stream_is_refused(trained, val):
    _, _, model = trained
    with pytest.raises(ValueError, match=r"eval.lengths \[100\].*validation split has 80"):
        evaluate(model, val[:80], [16, 100])


def test_evaluate_workdir_writes_eval_json(trained, val):
    config, workdir, model = trained
    from posenc.runs.config import apply_overrides

    overrides = apply_overrides(config, ["eval.lengths=16,48", "eval.max_tokens=96"])
    report = evaluate_workdir(workdir, overrides=overrides, output="e.json", progress=False)
    with open(f"{workdir}/e.json") as f:
        assert json.load(f) == json.loads(json.dumps(report))
    assert load_eval(workdir, "e.json") == json.loads(json.dumps(report))
    assert load_eval(workdir) is None, f"train() alone writes no {EVAL_FILE}"
    assert [r["length"] for r in report["results"]] == [16, 48]
    assert report["encoding"] == "rope" and report["train_seq_len"] == SEQ_LEN
    assert report["train_steps"] == 400 and report["mode"] == "nonoverlapping"
    assert report["data"]["source"] == "pystdlib" and report["data"]["split"] == "validation"
    assert report["model"]["num_params"] == model.num_params()
    assert report["model"]["num_layers"] == 1
    # The checkpoint holds the trained model, and the report is what evaluate() gives for it.
    helpers.assert_same_leaves(
        helpers.param_leaves(load_model(workdir)), helpers.param_leaves(model)
    )
    expected = evaluate(model, val, [16, 48], batch_tokens=128, max_tokens=96)
    for a, b in zip(report["results"], expected, strict=True):
        assert a["tokens"] == b["tokens"] == 96
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)

    test_split = apply_overrides(overrides, ["eval.split=test", "eval.lengths=16"])
    other = evaluate_workdir(workdir, overrides=test_split, output="t.json", progress=False)
    assert other["data"]["split"] == "test"
    assert other["results"][0]["loss"] != report["results"][0]["loss"]


@pytest.mark.parametrize("alpha", [math.inf, math.nan, -math.inf])
def test_non_finite_beam_alpha_is_refused(alpha):
    """eval.alpha=inf was accepted and written into eval.json as ``Infinity`` (not JSON)."""
    from posenc.runs.config import apply_overrides, load_config, validate

    config = apply_overrides(load_config(str(helpers.REPO / "configs" / "translation.py:tiny")), [])
    config.eval.alpha = alpha
    with pytest.raises(ValueError, match=r"eval\.alpha must be a finite number >= 0"):
        validate(config)
