"""``posenc plan``: a run's memory per device, compiled for a mesh before anything runs.

The slow test plans a small config for 8 devices (2 data x 4 fsdp) through the command line
(which compiles in a child process with 8 virtual CPU devices) and compares its figures with
the same run stepped for real on 8 devices (``tests/_sharding_devices.py``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import _train_helpers as helpers
import pytest

from posenc.runs.plan import parse_bytes

SCRIPT = Path(__file__).resolve().parent / "_sharding_devices.py"


def test_device_memory_sizes_parse_and_bad_ones_are_refused():
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("1.5 gib") == int(1.5 * 2**30)
    assert parse_bytes("512") == 512
    for bad in ("lots", "-3GB", "80XB", "0"):
        with pytest.raises(ValueError, match=r"--device-memory must be a size such as 80GB"):
            parse_bytes(bad)


def test_plan_refuses_a_mesh_that_does_not_fit_the_devices_in_one_line():
    code, _, err = helpers.run_cli(
        "plan", "--config", helpers.TINY_SPEC, "--config.mesh.fsdp=3", "--config.mesh.data=1"
    )
    assert code == 2
    line = helpers.one_line_error(err, "plan")
    assert "mesh.fsdp=3 = 3 devices does not equal the 1 devices" in line


@pytest.mark.slow
def test_plan_matches_the_compiled_run_on_8_devices(tmp_path):
    """The plan's parameters and optimizer state per device equal the bytes of the real
    arrays' shards on that mesh, and its training-step peak is within 10 % of the program the
    real run compiled and ran (XLA's buffer assignment on CPU; there is no allocator peak to
    read on a CPU). Both use the device script's config."""
    from _sharding_devices import OVERRIDES

    mesh = {"data": 2, "fsdp": 4}
    out = tmp_path / "run.json"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    args = [sys.executable, str(SCRIPT), "--devices", "8", "--encodings", "rope"]
    args += ["--meshes", json.dumps([mesh]), "--steps", "2", "--out", str(out)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(out.read_text())["rope"]["data2xfsdp4"]

    flags = [f"--config.{o}" for o in OVERRIDES] + ["--config.encoding.name=rope"]
    flags += [f"--config.mesh.{a}={n}" for a, n in mesh.items()]
    code, text, err = helpers.run_cli(
        "plan", "--config", helpers.TINY_SPEC, "--devices", "8", "--device-memory", "1GB", *flags
    )
    assert code == 0, err
    figures = {
        name: float(value) * 2**30
        for name, value in re.findall(r"(parameters|optimizer state)\s+([0-9.e+-]+) GiB", text)
    }
    measured = run["bytes"]["per_device"]
    assert figures["parameters"] + figures["optimizer state"] == pytest.approx(measured, rel=1e-2)
    peak = float(re.search(r"train step .* peak ([0-9.e+-]+) GiB", text).group(1)) * 2**30
    assert peak == pytest.approx(run["compiled_bytes"], rel=0.10)
    assert "fits" in text.splitlines()[-1]


def _plan_figures(*flags: str) -> dict[str, float]:
    """Parameters, train step and evaluation temporaries per device (GiB) from ``posenc plan``."""
    code, text, err = helpers.run_cli("plan", "--config", helpers.TINY_SPEC, *flags)
    assert code == 0, err
    patterns = {
        "params": r"parameters\s+([0-9.e+-]+) GiB",
        "train": r"train step .* temporaries ([0-9.e+-]+) GiB",
        "eval": r"evaluation .* temporaries ([0-9.e+-]+) GiB",
    }
    return {k: float(re.search(p, text).group(1)) for k, p in patterns.items()}


@pytest.mark.slow
def test_fsdp_gathers_weights_not_activations():
    """With the same rows per device, FSDP over 8 devices needs the temporaries of data
    parallelism plus at most the gathered weights (the residual stream stays split by rows and
    XLA gathers each layer's weights). Without the constraint on the residual stream XLA's
    propagation gathered the activations instead: 2.2x the training and 8x the evaluation
    temporaries of data parallelism here, over the bound (checked by removing it)."""
    shape = [
        "--devices",
        "8",
        "--config.model.model_dim=256",
        "--config.model.num_heads=4",
        "--config.model.mlp_dim=1024",
        "--config.model.vocab_size=264",
        "--config.train.seq_len=256",
        "--config.train.batch_size=8",
        "--config.eval.lengths=256,",
        "--config.eval.batch_tokens=2048",
    ]
    data = _plan_figures(*shape, "--config.mesh.data=8")
    fsdp = _plan_figures(*shape, "--config.mesh.data=1", "--config.mesh.fsdp=8")
    weights = data["params"]  # replicated: all of them
    for what in ("train", "eval"):
        assert fsdp[what] <= 1.1 * (data[what] + 2 * weights), (what, data, fsdp)


TRANSLATION = str(helpers.REPO / "configs" / "translation.py") + ":tiny"


@pytest.mark.slow
def test_translation_plan_matches_the_run_at_its_longest_bucket(tmp_path):
    """A translation run is planned at its longest bucket of pairs (read from its data as
    training reads them): the plan's parameters and optimizer state equal the bytes of the
    real arrays, and its training-step peak is within 10 % of the program the run compiled and
    ran on a batch of that bucket."""
    from posenc.data.pair_batching import encode_pairs
    from posenc.devices import sharding
    from posenc.devices.fits import required_bytes
    from posenc.kinds import translation
    from posenc.runs.config import apply_overrides, load_config
    from posenc.runs.plan import plan
    from posenc.runs.train import Trainer

    config = apply_overrides(
        load_config(TRANSLATION),
        [f"data.data_dir={tmp_path}", "model.num_layers=1", "train.tokens_per_batch=1024"],
    )
    planned = plan(config)
    t = planned.train
    assert planned.eval is None and t["source"] > 100

    trainer = Trainer(config)
    source, vocab = translation.open_data(config)
    batches = translation.train_batches(config, encode_pairs(source.pairs("train"), vocab), 1)
    step = next(
        i
        for i in range(10_000)
        if batches.batch(i)["src"].shape == (t["rows"], t["source"])
        and batches.batch(i)["tgt_in"].shape[1] == t["length"]
    )
    batch = trainer.global_batch(trainer.local_batch(batches, step))
    state, _ = trainer.step(trainer.init_state(), batch)
    measured = sharding.shard_bytes({"p": state["params"], "o": state["opt_state"]})
    assert planned.params + planned.optimizer == pytest.approx(measured, rel=1e-2)
    ran = required_bytes(trainer._step.compile(state, batch))
    assert t["peak"] == pytest.approx(ran, rel=0.10)


def test_plan_only_eval_plans_the_evaluation_without_an_optimizer():
    """``--only eval``: the evaluation of the longest length alone (no training step, no
    optimizer state), with the parameters per device; a translation run's evaluation is not
    planned and says so in one line."""
    code, text, err = helpers.run_cli(
        "plan",
        "--config",
        helpers.TINY_SPEC,
        "--only",
        "eval",
        *[f"--config.{o}" for o in helpers.TINY_OVERRIDES],
    )
    assert code == 0, err
    assert "optimizer" not in text and "train step" not in text
    assert re.search(r"evaluation \(4 x 32 tokens\): temporaries", text), text
    code, _, err = helpers.run_cli("plan", "--config", TRANSLATION, "--only", "eval")
    assert code == 2
    assert "a translation run's evaluation (beam search on one device) is not planned" in (
        helpers.one_line_error(err, "plan")
    )


def _no_child(*args, **kwargs):
    raise AssertionError("a child process was started for a device count no mesh can use")


@pytest.mark.parametrize(
    "flags, reason",
    [
        # The default mesh puts every device on data: 1000000 rows a batch of 16 cannot split.
        ((), r"train\.batch_size=16 must be divisible by the number of devices \(1000000\)"),
        # Everything on tensor: an axis of 1000000 divides no head count, MLP or vocabulary.
        (
            ("--config.mesh.data=1", "--config.mesh.tensor=-1"),
            r"mesh\.tensor=1000000 splits none of model\.num_heads=",
        ),
        (
            ("--config.mesh.data=1", "--config.mesh.context=-1"),
            r"mesh\.context=1000000 splits none of the planned lengths",
        ),
    ],
)
def test_plan_refuses_a_device_count_no_mesh_can_use_before_starting_a_child(
    monkeypatch, flags, reason
):
    """``--devices 1000000`` ran 452 s and took 15 GB (a child with a million virtual devices)
    before failing: a count the config's mesh cannot use is refused in the parent, in one
    line, and no child process is started."""
    import subprocess as subprocess_module

    monkeypatch.setattr(subprocess_module, "run", _no_child)
    monkeypatch.setattr(subprocess_module, "Popen", _no_child)
    code, _, err = helpers.run_cli(
        "plan", "--config", helpers.TINY_SPEC, "--devices", "1000000", *flags
    )
    assert code == 2, err
    assert re.search(reason, helpers.one_line_error(err, "plan")), err


@pytest.mark.parametrize(
    "script, reason",
    [
        (
            "import sys\nsys.stderr.write('Traceback (most recent call last):\\n  x\\n"
            "MemoryError: host memory exhausted\\n')\nsys.exit(1)\n",
            r"failed \(exit status 1\): MemoryError: host memory exhausted",
        ),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
            r"was killed by SIGKILL.*out of memory",
        ),
    ],
)
def test_a_failed_planning_child_is_reported_in_one_line(monkeypatch, tmp_path, script, reason):
    """Any failure of the planning child (a crash, the kernel's out-of-memory kill with no
    message at all) is one line naming the reason, not an uncaught ``RuntimeError`` whose
    reason is empty. The child is replaced by a script that fails as the real one did."""
    fake = tmp_path / "fake_python.py"
    fake.write_text(script)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake}\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    code, _, err = helpers.run_cli("plan", "--config", helpers.TINY_SPEC, "--devices", "2")
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("posenc plan: error: planning on 2 virtual CPU devices"), err
    assert re.search(reason, lines[0]), err


@pytest.mark.parametrize("only", [(), ("--only", "eval")])
def test_plan_refuses_lengths_beyond_int32_positions_in_one_line(only):
    """``train.seq_len=100000000000`` gave an ``OverflowError`` traceback from inside the
    attention (positions are int32): a length past 2^31 - 1 is refused, naming the field."""
    code, _, err = helpers.run_cli(
        "plan", "--config", helpers.TINY_SPEC, "--config.train.seq_len=100000000000", *only
    )
    assert code == 2, err
    line = helpers.one_line_error(err, "plan")
    assert "2147483647" in line and ("train.seq_len" in line or "eval.multiples" in line), line


def _tiny(*overrides: str):
    from posenc.runs.config import apply_overrides, load_config

    return apply_overrides(load_config(helpers.TINY_SPEC), list(overrides))


def test_a_plan_that_does_not_fit_names_the_remedies_of_what_does_not_fit():
    """A plan's "does NOT fit" named no remedy. The training step over the memory gets
    ``model.remat=full`` (unless on), ``mesh.fsdp`` when the parameters and optimizer state are
    a real share, and a smaller batch; the evaluation gets a smaller ``eval.batch_tokens``,
    ``mesh.context`` and a smaller ``model.attention_block_size``; a part that fits gets none
    of its own. The figures are made up (no compilation): 8 devices on ``data``, 16 rows."""
    from posenc.runs.plan import Plan

    gib = 2**30
    train = {"peak": 30 * gib, "rows": 16, "length": 2048, "temporaries": 20 * gib}
    evaluation = {"peak": 12 * gib, "rows": 32, "length": 8192, "temporaries": 2 * gib}
    mesh = {"data": 8, "fsdp": 1, "context": 1, "tensor": 1}
    config = _tiny("model.attention_block_size=512", "eval.batch_tokens=262144")

    def fixes(device_memory, **changes):
        figures = dict(
            devices=8, mesh=mesh, params=2 * gib, optimizer=4 * gib, train=train, eval=evaluation
        )
        figures.update(changes)
        text = Plan(**figures, device_memory=device_memory, config=config).table()
        return [line for line in text.splitlines() if line.startswith("  to fit, try ")], text

    lines, text = fixes(16 * gib)  # the training step over, the evaluation within
    assert "does NOT fit" in text
    joined = "\n".join(lines)
    assert "model.remat=full (now 'none'" in joined
    assert "mesh.fsdp=8 with mesh.data=1" in joined
    assert "a smaller train.batch_size (now 16; 2 windows per device)" in joined
    assert "eval.batch_tokens" not in joined and "mesh.context" not in joined

    lines, _ = fixes(8 * gib, train=None, optimizer=None)  # an evaluation alone, over
    joined = "\n".join(lines)
    assert "a smaller eval.batch_tokens (now 262144; 4 windows of 8192 tokens" in joined
    assert "more mesh.context (now 1" in joined
    assert "a smaller model.attention_block_size (now 512" in joined
    assert "model.remat" not in joined and "train.batch_size" not in joined

    config.model.remat = "full"  # already on: not proposed; small state: no fsdp either
    lines, _ = fixes(16 * gib, params=gib // 100, optimizer=gib // 50)
    assert lines and not any("model.remat" in x or "mesh.fsdp" in x for x in lines), lines

    lines, text = fixes(64 * gib)  # everything fits: no remedy
    assert "fits" in text and not lines
    lines, text = fixes(None)  # no verdict: no remedy
    assert not lines


def test_plan_says_what_it_compiles_and_prints_the_remedies():
    """The plan's time grows with the layers: ``posenc plan`` says what it compiles (the part,
    its shape and the layers) and how long each took; and a memory too small gets remedies."""
    code, text, err = helpers.run_cli(
        "plan",
        "--config",
        helpers.TINY_SPEC,
        "--device-memory",
        "1KB",
        *[f"--config.{o}" for o in helpers.TINY_OVERRIDES],
    )
    assert code == 0, err
    assert "compiling the training step (8 x 16 tokens, 1 layer) ..." in text, text
    assert "compiling the evaluation (4 x 32 tokens, 1 layer) ..." in text, text
    assert len(re.findall(r"^  compiled in [0-9.]+ s$", text, flags=re.M)) == 2, text
    assert "does NOT fit" in text and "  to fit, try model.remat=full" in text, text
