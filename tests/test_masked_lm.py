"""The masked-LM objective end to end (train.objective=masked_lm on a bidirectional model): the
logged loss is the cross entropy over the chosen tokens only and falls; evaluation equals a
direct computation over the same windows and masks; eval.json records the objective and
``posenc report --metric accuracy`` shows it; randomized positions keep working.

The objective's masking itself (the 15/80/10/10 rule, determinism) is tested in
tests/data/test_data_masking.py; its refusals with the config in tests/test_train.py.
"""

from __future__ import annotations

import csv
import math

import _train_helpers as helpers
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from posenc import data as data_lib
from posenc import report
from posenc.kinds.common import masked_lm
from posenc.kinds.masked_lm import MaskedWindows
from posenc.kinds.stream import evaluate
from posenc.runs.evaluate import evaluate_workdir
from posenc.runs.train import Trainer, train

MAX_POSITION = 64
MASKED_LM = ("train.objective=masked_lm", "model.causal=False", "model.vocab_size=258")


@pytest.fixture(scope="module")
def run(data_dir, tmp_path_factory):
    """A masked-LM RoPE model, 60 steps at length 16 with randomized positions."""
    config = helpers.tiny_config(
        data_dir,
        *MASKED_LM,
        "train.positions=randomized",
        f"train.max_position={MAX_POSITION}",
        "train.steps=60",
        "train.checkpoint_every=60",
        "optim.warmup_steps=5",
    )
    workdir = str(tmp_path_factory.mktemp("mlm") / "run")
    return config, workdir, train(config, workdir)


def _forward(model):
    """``(tokens [B, T], positions [B|1, T]) -> logits``: the model's own forward pass, jitted."""
    graphdef, state = nnx.split(model)
    apply = jax.jit(lambda state, tokens, pos: nnx.merge(graphdef, state)(tokens, pos))
    return lambda tokens, pos: np.asarray(
        apply(state, jnp.asarray(tokens, jnp.int32), jnp.asarray(pos, jnp.int32))
    )


def test_training_loss_is_over_the_chosen_tokens_and_falls(run, data_dir):
    config, _, result = run
    losses = [line["loss"] for line in result.history]  # one line per step
    # Step 1 logs the initial parameters' loss on step 0's batch: recompute it outside training,
    # float64 cross entropy against the windows themselves, averaged over the chosen tokens.
    t = config.train
    windows = data_lib.TrainWindows(
        helpers.stream(data_dir, "train"), t.seq_len, t.batch_size, config.seed
    ).batch(0)["inputs"]
    batch = data_lib.MaskedLM(config.seed).train_batch(windows, 0)
    positions = data_lib.batch_positions(config.seed, 0, len(windows), t.seq_len, MAX_POSITION)
    logits = _forward(helpers.initial_model(config))(batch["inputs"], positions)
    losses_0 = helpers.cross_entropy(logits, windows)  # [B, L] float64
    chosen = batch["weights"] == 1.0
    assert 0 < chosen.sum() < chosen.size
    assert losses[0] == pytest.approx(losses_0[chosen].mean(), rel=1e-5)
    assert abs(losses_0.mean() - losses_0[chosen].mean()) > 1e-3  # all tokens would differ
    # It learns: ln(258) ~ 5.55 at first; the bytes' unigram entropy (~3.3) after 60 steps.
    assert np.mean(losses[-10:]) < 0.75 * losses[0], losses


def _direct(model, stream, length, lm) -> dict:
    """Masked-LM scores of windows ``stream[k L : (k + 1) L]`` one at a time, float64."""
    forward = _forward(model)
    n = (len(stream) - 1) // length
    loss_sum, count, correct = np.zeros(length), np.zeros(length), 0
    for k in range(n):
        window = np.asarray(stream[k * length : (k + 1) * length], np.int32)
        one = {"inputs": window[None], "mask": np.ones((1, length), np.float32)}
        batch = lm.eval_batch({**one, "starts": np.array([k * length])}, length)
        logits = forward(batch["inputs"], np.arange(length)[None])[0]  # [L, V]
        mask = batch["mask"][0] == 1.0
        loss_sum[mask] += helpers.cross_entropy(logits, window)[mask]
        count[mask] += 1
        correct += int((logits.argmax(-1) == window)[mask].sum())
    return {"windows": n, "loss_sum": loss_sum, "count": count, "correct": correct}


def test_evaluation_equals_direct_computation(run, data_dir):
    config, _, result = run
    stream = helpers.stream(data_dir, "validation")[:241]  # 15 windows of 16, 6 of 40
    lm = data_lib.MaskedLM(config.seed)
    # 64 tokens per batch: 4 windows of 16 (the last batch has a padding row), 1 window of 40.
    results = evaluate(result.model, stream, [16, 40], batch_tokens=64, masked_lm=lm)
    for r in results:
        d = _direct(result.model, stream, r["length"], lm)
        tokens = int(d["count"].sum())
        assert r["windows"] == d["windows"] and r["window_tokens"] == 240
        assert r["tokens"] == tokens and 0.05 * 240 < tokens < 0.3 * 240
        loss = d["loss_sum"].sum() / tokens
        assert r["loss"] == pytest.approx(loss, rel=1e-6)
        assert r["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
        assert r["correct"] == d["correct"] and r["accuracy"] == d["correct"] / tokens
        by_position = np.where(d["count"] > 0, d["loss_sum"] / np.maximum(d["count"], 1), None)
        for got, want in zip(r["loss_by_position"], by_position, strict=True):
            assert (got is None) == (want is None)
            assert want is None or got == pytest.approx(want, abs=2e-5)
        assert "bits_per_byte" not in r  # a masked loss is not a code length


def test_trainer_corrupts_each_processs_rows_as_one_process_would(run, data_dir):
    config, _, _ = run
    trainer, stream, t = Trainer(config), helpers.stream(data_dir, "train"), config.train

    def local(index, count):
        windows = data_lib.TrainWindows(
            stream, t.seq_len, t.batch_size, config.seed, process_index=index, process_count=count
        )
        return trainer.local_batch(MaskedWindows(windows, masked_lm(config)), 3)

    whole, parts = local(0, 1), [local(i, 2) for i in range(2)]
    assert sorted(whole) == ["inputs", "positions", "targets", "weights"]
    for key in whole:
        np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])


def test_eval_json_records_the_objective_and_the_report_shows_accuracy(run):
    _, workdir, _ = run
    saved = evaluate_workdir(workdir, progress=False)  # eval.json, positions as trained
    assert saved["objective"] == "masked_lm" and saved["positions"] == "randomized"
    for r in saved["results"]:
        assert r["tokens"] > 0 and math.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1
    paths = report.write_report(workdir, metric="accuracy")
    text = open(paths[0]).read()
    assert "masked-LM accuracy" in text and "- Objective: masked LM (BERT's" in text
    with open(paths[1]) as f:
        rows = list(csv.DictReader(f))
    got = {int(row["L_valid"]): float(row["rope"]) for row in rows}
    assert got == {r["length"]: r["accuracy"] for r in saved["results"]}
