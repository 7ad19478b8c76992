"""The training loop: it learns, resumes exactly, splits batches over devices exactly, refuses
bad input before compiling, and never leaves a corrupted checkpoint behind.

Runs use a 1-layer, width-32, float32 model on ``pystdlib`` (see ``_train_helpers.py``).
"""

from __future__ import annotations

import json
import math
import os
import re

import _train_helpers as helpers
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from posenc import data as data_lib
from posenc import encodings
from posenc.kinds.stream import evaluate
from posenc.models.restore import load_model
from posenc.runs.config import apply_overrides
from posenc.runs.train import NonFiniteLossError, Trainer, make_optimizer, train
from posenc.workdir import RunDir
from posenc.workdir.metrics import read_metrics


@pytest.fixture
def no_compile(monkeypatch):
    """Makes building the jitted trainer fail, to prove that an error came before it."""

    def refuse(self, *args, **kwargs):
        raise AssertionError(
            "the trainer was built (and would compile) before the input was refused"
        )

    monkeypatch.setattr(Trainer, "__init__", refuse)


def _checkpoint_steps(workdir) -> list[int]:
    folder = os.path.join(workdir, "checkpoints")
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def _all_finite(leaves: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(v).all() for v in leaves.values())


def _initial_batch_loss(config, data_dir, step: int = 0) -> float:
    """Mean cross entropy of the initial parameters on the training batch of ``step``, computed
    outside the training step (the model's forward pass, then float64 numpy)."""
    model = helpers.initial_model(config)
    windows = data_lib.TrainWindows(
        helpers.stream(data_dir, "train"),
        seq_len=config.train.seq_len,
        global_batch=config.train.batch_size,
        seed=config.seed,
    )
    batch = windows.batch(step)
    return float(
        helpers.cross_entropy(helpers.jit_forward(model)(batch["inputs"]), batch["targets"]).mean()
    )


# --- bad input is refused before anything compiles ---------------------------------------------

_MASKED_LM = ("train.objective=masked_lm", "model.vocab_size=258", "model.causal=False")

BAD_RUNS = [
    (["encoding.name=fancy"], ValueError, r"unknown encoding.name 'fancy'"),
    (["eval.lengths=0,16"], ValueError, r"eval.lengths"),
    (["eval.mode=strided"], ValueError, r"eval.mode"),
    (["eval.mode=sliding", "eval.stride=64"], ValueError, r"eval.stride=64"),
    (["model.head_dim=15"], ValueError, r"RoPE.*head dimension of 15"),
    (
        ["encoding.name=learned", "encoding.hparams.max_len=8"],
        ValueError,
        r"encoding.hparams.max_len=8",
    ),
    (["train.batch_size=0"], ValueError, r"train.batch_size"),
    (["data.source=nowhere"], ValueError, r"data.source='nowhere'"),
    (
        ["data.source=tfds:posenc_never_prepared_xyz"],
        data_lib.DataNotFoundError,
        r"data.source='tfds:posenc_never_prepared_xyz'(.|\n)*posenc data prepare tfds:",
    ),
    (["data.source=textdir:/nonexistent/posenc"], data_lib.DataNotFoundError, r"data.source"),
    # The validation split of pystdlib has well under 10^8 tokens.
    (["eval.lengths=16,100000000"], ValueError, r"eval.lengths \[100000000\].*validation"),
    # Masked LM and bidirectional attention: each bad combination in one line naming the field.
    (["train.objective=bert"], ValueError, r"^train.objective must be one of[^\n]*$"),
    (["train.objective=masked_lm"], ValueError, r"^train.objective='masked_lm' needs[^\n]*$"),
    (
        ["train.objective=masked_lm", "model.causal=False", "model.vocab_size=257"],
        ValueError,
        r"^model.vocab_size=257 has no id for the mask token[^\n]*>= 258$",
    ),
    (["model.causal=False"], ValueError, r"^model.causal=False with train.objective=[^\n]*$"),
    (
        [*_MASKED_LM, "encoding.name=cope"],
        ValueError,
        r"^model.causal=False: encoding 'cope' is causal only[^\n]*$",
    ),
    (
        [*_MASKED_LM, "encoding.name=t5"],
        ValueError,
        r"^model.causal=False needs encoding.hparams.bidirectional=True for t5[^\n]*$",
    ),
]


@pytest.mark.parametrize("overrides, error, match", BAD_RUNS, ids=[b[0][-1] for b in BAD_RUNS])
def test_bad_input_is_refused_before_compiling(
    data_dir, tmp_path, no_compile, overrides, error, match
):
    config = helpers.tiny_config(data_dir, *overrides)
    workdir = tmp_path / "run"
    with pytest.raises(error, match=match):
        train(config, str(workdir))
    assert not workdir.exists(), "a refused run leaves no work directory behind"


def test_missing_data_error_prints_a_command_the_cli_accepts(data_dir):
    from posenc.cli import build_parser

    config = helpers.tiny_config(data_dir, "data.source=tfds:posenc_never_prepared_xyz")
    with pytest.raises(data_lib.DataNotFoundError) as info:
        train(config, "/nonexistent/never-created")
    command = next(
        line.strip() for line in str(info.value).splitlines() if "posenc data prepare" in line
    )
    args = build_parser().parse_args(command.split()[1:])
    assert (args.command, args.data_command) == ("data", "prepare")
    assert args.spec == "tfds:posenc_never_prepared_xyz"
    assert os.path.abspath(args.data_dir) == os.path.abspath(data_dir)


def test_resuming_with_a_different_config_is_refused(data_dir, tmp_path, monkeypatch):
    config = helpers.tiny_config(data_dir, "train.steps=4")
    workdir = str(tmp_path / "run")
    assert train(config, workdir, stop_at=2).step == 2
    assert RunDir(workdir).read_config().to_dict() == config.to_dict(), "config.json round-trips"

    changed = apply_overrides(config, ["model.model_dim=64", "optim.learning_rate=0.5"])
    with monkeypatch.context() as m:
        m.setattr(Trainer, "__init__", lambda *a, **k: pytest.fail("compiled before refusing"))
        with pytest.raises(
            ValueError, match=r"different config.*model.model_dim.*optim.learning_rate"
        ):
            train(changed, workdir)
    assert _checkpoint_steps(workdir) == [2]

    # Logging, evaluation and progress are not part of what a run computes: those may change.
    relaxed = apply_overrides(
        config, ["train.log_every=2", "eval.lengths=16", "train.progress=True"]
    )
    result = train(relaxed, workdir)
    assert (result.resumed_from, result.step) == (2, 4)
    assert [line["step"] for line in read_metrics(workdir)] == [1, 2, 4]


# --- learning -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", encodings.names())
def test_every_encoder_learns_and_evaluates_at_4x(data_dir, tmp_path, name):
    """300 steps take every encoder's train loss to ~0.75-0.81 of the unigram entropy."""
    seq_len = 32
    extra = [f"encoding.hparams.max_len={4 * seq_len}"] if name == "learned" else []
    config = helpers.tiny_config(
        data_dir,
        f"encoding.name={name}",
        *extra,
        f"train.seq_len={seq_len}",
        "train.steps=300",
        "train.log_every=50",
        "train.checkpoint_every=300",
        "optim.warmup_steps=10",
    )
    result = train(config, str(tmp_path / name))
    entropy = helpers.unigram_entropy(helpers.stream(data_dir, "train"))
    assert 2.5 < entropy < 5.5, "pystdlib bytes: well above 0, well below log(257)"
    losses = [line["loss"] for line in result.history]
    assert losses[0] > entropy, "an untrained model is worse than unigram frequencies"
    assert losses[-1] < 0.85 * entropy, f"{name}: final loss {losses[-1]:.3f}, H={entropy:.3f}"

    lengths = [seq_len, 4 * seq_len] + ([8 * seq_len] if name == "learned" else [])
    results = evaluate(
        result.model,
        helpers.stream(data_dir, "validation"),
        lengths,
        batch_tokens=1024,
        max_tokens=4096,
    )
    at_train, at_4x = results[0], results[1]
    assert at_train["loss"] < 0.9 * entropy, "the model generalises to held-out files"
    for r in (at_train, at_4x):
        assert r["tokens"] == 4096 and math.isfinite(r["loss"]), r
        assert len(r["loss_by_position"]) == r["length"]
    if name == "learned":
        assert results[2] == {"length": 8 * seq_len, "error": results[2]["error"]}
        assert "encoding.hparams.max_len=128" in results[2]["error"]


def test_learning_rate_schedule_and_weight_decay_mask(data_dir):
    peak, warmup, steps, ratio = 0.01, 5, 20, 0.1
    config = helpers.tiny_config(
        data_dir,
        "encoding.name=learned",
        "encoding.hparams.max_len=16",
        f"optim.learning_rate={peak}",
        f"optim.warmup_steps={warmup}",
        f"train.steps={steps}",
        f"optim.final_lr_ratio={ratio}",
        "optim.weight_decay=0.5",
    )
    optimizer, schedule = make_optimizer(config)
    for s in range(steps + 1):
        if s < warmup:
            expected = peak * s / warmup
        else:
            cosine = 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))
            expected = peak * ratio + (peak - peak * ratio) * cosine
        assert float(schedule(s)) == pytest.approx(expected, rel=1e-5, abs=1e-9), s

    # With zero gradients AdamW's update is -lr * weight_decay * param where decay applies.
    trainer = Trainer(config)
    initial = trainer.init_state()
    params, state = initial["params"], initial["opt_state"]
    zeros = jax.tree.map(jnp.zeros_like, params)
    update = jax.jit(optimizer.update)  # one compilation instead of one per primitive
    _, state = update(zeros, state, params)  # step 0: learning rate 0
    updates, _ = update(zeros, state, params)
    lr = float(schedule(1))
    updates, values = helpers.param_leaves(updates), helpers.param_leaves(params)
    decayed = {k for k in values if re.search(r"\['(kernel|embedding|q|k|v|o)'\]", k)}
    assert any("table" in k for k in values) and len(decayed) >= 5
    for key, update in updates.items():
        if key in decayed:
            np.testing.assert_allclose(update, -lr * 0.5 * values[key], rtol=1e-5, err_msg=key)
        else:  # norms, biases and the position table
            assert not update.any(), key


# --- resume -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dropout", [0.0, pytest.param(0.2, marks=pytest.mark.slow)])
def test_resume_is_exact(data_dir, tmp_path, dropout):
    n = 5
    config = helpers.tiny_config(
        data_dir, f"train.steps={2 * n}", "train.checkpoint_every=100", f"model.dropout={dropout}"
    )
    full = train(config, str(tmp_path / "full"))

    cut = str(tmp_path / "cut")
    first = train(config, cut, stop_at=n)
    assert (first.step, first.resumed_from) == (n, None)
    assert _checkpoint_steps(cut) == [n], "stopping saves a checkpoint"
    second = train(config, cut)
    assert (second.step, second.resumed_from) == (2 * n, n)

    helpers.assert_same_leaves(helpers.param_leaves(full.model), helpers.param_leaves(second.model))
    helpers.assert_same_leaves(
        helpers.param_leaves(load_model(str(tmp_path / "full"))),
        helpers.param_leaves(load_model(cut)),
    )
    full_lines = helpers.strip_timing(read_metrics(str(tmp_path / "full")))
    assert [line["step"] for line in full_lines] == list(range(1, 2 * n + 1))
    assert helpers.strip_timing(read_metrics(cut)) == full_lines
    assert helpers.strip_timing(second.history) == full_lines[n:]

    # Dropout really is on in training (else the dropout case would prove nothing).
    deterministic = _initial_batch_loss(config, data_dir)
    assert (abs(full_lines[0]["loss"] - deterministic) > 1e-3) == (dropout > 0)


class _Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing in the loop handles it."""


def test_a_killed_run_resumes_without_losing_or_repeating_steps(data_dir, tmp_path, monkeypatch):
    config = helpers.tiny_config(data_dir, "train.steps=8", "train.checkpoint_every=3")
    workdir = str(tmp_path / "run")
    real_save = ocp.CheckpointManager.save

    def dying_save(self, step, *args, **kwargs):
        if step == 6:
            raise _Killed
        return real_save(self, step, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(ocp.CheckpointManager, "save", dying_save)
        with pytest.raises(_Killed):
            train(config, workdir)
    before = read_metrics(workdir)
    assert [line["step"] for line in before] == [1, 2, 3, 4, 5, 6]
    # The logged loss of step 1 is the initial model's loss on batch 0, computed independently.
    np.testing.assert_allclose(before[0]["loss"], _initial_batch_loss(config, data_dir), rtol=1e-5)
    assert _checkpoint_steps(workdir) == [3]
    # A torn last line, as a kill in the middle of a write would leave.
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write('{"step": 7, "lo')

    result = train(config, workdir)
    assert (result.resumed_from, result.step) == (3, 8)
    after = read_metrics(workdir)
    assert [line["step"] for line in after] == list(range(1, 9)), "each step logged once"
    # Steps 4-6 were recomputed from the checkpoint and agree with what the killed run logged.
    assert helpers.strip_timing(after[:6]) == helpers.strip_timing(before)


# --- non-finite loss ----------------------------------------------------------------------------


def test_divergence_stops_the_run_and_keeps_a_good_checkpoint(data_dir, tmp_path):
    config = helpers.tiny_config(
        data_dir,
        "optim.learning_rate=1e6",
        "optim.warmup_steps=0",
        "train.steps=20",
        "train.checkpoint_every=2",
    )
    workdir = str(tmp_path / "run")
    with pytest.raises(NonFiniteLossError) as info:
        train(config, workdir)
    message = str(info.value)
    match = re.search(r"by step (\d+) .*last good checkpoint \(step (\d+)\)", message)
    assert match, message
    bad_step, kept = int(match[1]), int(match[2])
    assert "optim.learning_rate" in message
    assert bad_step < 20 and _checkpoint_steps(workdir)[-1] == kept < bad_step
    assert _all_finite(helpers.param_leaves(load_model(workdir)))
    lines = read_metrics(workdir)
    assert lines and all(math.isfinite(line["loss"]) for line in lines)
    assert lines[-1]["step"] == bad_step - 1, "the non-finite step is not logged"


def test_nonfinite_update_on_a_checkpoint_step_is_not_saved(data_dir, tmp_path, monkeypatch):
    """An update that breaks the parameters at a checkpoint step (its own loss, computed before
    the update, is still finite) must not become the checkpoint."""
    poisoned_step = 4
    real_step = Trainer._train_step

    def poisoned(self, state, batch):
        new_state, metrics = real_step(self, state, batch)
        bad = state["step"] + 1 == poisoned_step
        spoil = lambda x: jnp.where(bad, jnp.nan, x)  # noqa: E731
        new_state = {**new_state, "params": jax.tree.map(spoil, new_state["params"])}
        return new_state, {**metrics, "grad_norm": spoil(metrics["grad_norm"])}

    monkeypatch.setattr(Trainer, "_train_step", poisoned)
    config = helpers.tiny_config(
        data_dir, "train.steps=8", "train.checkpoint_every=2", "train.log_every=4"
    )
    workdir = str(tmp_path / "run")
    with pytest.raises(NonFiniteLossError, match=rf"step {poisoned_step} "):
        train(config, workdir)
    assert _checkpoint_steps(workdir) == [2]
    assert _all_finite(helpers.param_leaves(load_model(workdir)))


# --- data parallelism ---------------------------------------------------------------------------


@pytest.mark.slow
def test_data_parallel_equals_single_device(data_dir, tmp_path):
    """The same global batch on 8 CPU devices gives the 1-device loss curve, parameters and
    evaluation; a batch the devices cannot share is refused before compiling."""
    procs = {
        n: helpers.run_device_script(
            n,
            "--data-dir",
            str(data_dir),
            "--workdir",
            str(tmp_path / f"run{n}"),
            "--out",
            str(tmp_path / f"out{n}"),
        )
        for n in (1, 8)
    }
    for n, proc in procs.items():
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{n} devices:\n{output}"
    reports = {n: json.loads((tmp_path / f"out{n}.json").read_text()) for n in (1, 8)}
    assert reports[1]["mesh_size"] == 1 and reports[8]["mesh_size"] == 8
    assert reports[8]["device_count"] == 8

    assert "train.batch_size=12" in reports[8]["batch_error"]
    assert "number of devices (8)" in reports[8]["batch_error"]
    assert not reports[8]["batch_error_workdir_exists"]

    one, eight = (read_metrics(str(tmp_path / f"run{n}")) for n in (1, 8))
    assert [line["step"] for line in one] == list(range(1, 13))
    assert [line["step"] for line in eight] == list(range(1, 13))
    for a, b in zip(one, eight, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]
        assert a["learning_rate"] == b["learning_rate"]
    assert one[-1]["loss"] < one[0]["loss"] - 0.5, "the runs compared actually trained"

    params = {n: dict(np.load(tmp_path / f"out{n}.npz")) for n in (1, 8)}
    helpers.assert_same_leaves(params[1], params[8], rtol=1e-5, atol=1e-6)

    for a, b in zip(reports[1]["eval"], reports[8]["eval"], strict=True):
        assert a["tokens"] == b["tokens"] == 48 * 7
        assert a["windows"] == b["windows"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)


def test_the_progress_bar_moves_at_every_step_not_only_at_logged_ones(
    data_dir, tmp_path, monkeypatch
):
    """With ``log_every`` past the run's end, the bar still counts each step as it is taken
    (it sat at 0 while a translation run compiled its length buckets)."""
    import posenc.runs.train as train_module

    counts: list[int] = []

    class Recorder:
        n = 0

        def update(self, k: int) -> None:
            self.n += k
            counts.append(self.n)

        def set_postfix(self, **kwargs) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(train_module, "progress_bar", lambda **kwargs: Recorder())
    config = helpers.tiny_config(
        data_dir, "train.steps=4", "train.log_every=100", "train.checkpoint_every=100"
    )
    train(config, str(tmp_path / "run"))
    assert counts == [1, 2, 3, 4]
