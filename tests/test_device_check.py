"""experiments/device_check.py (posenc.benchmark.device), loaded by path: its dry run writes every
section, a missing package or device stops it in one line after saving, and the time guards
stop what overruns."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from posenc.benchmark import device

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADINGS = (
    "## Preflight",
    "## GPU-only tests",
    "## Training",
    "## Evaluation",
    "## Peer",
    "## Attention paths",
)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _saved(out: pathlib.Path) -> tuple[dict, str]:
    return (
        json.loads((out / "device_check.json").read_text()),
        (out / "device_check.md").read_text(),
    )


def test_a_missing_package_stops_the_check_in_one_line_after_saving(tmp_path, monkeypatch, capsys):
    script = _load("device_check")
    monkeypatch.setattr(device, "REQUIRED", (*device.REQUIRED, "posenc_fake_missing_module"))
    out = tmp_path / "out"
    assert script.main([str(out), "--dry-run", "--wheels", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "missing package(s) posenc_fake_missing_module" in err
    data, text = _saved(out)
    assert data["sections"]["preflight"]["status"] == "failed"
    assert data["sections"]["preflight"]["missing"] == ["posenc_fake_missing_module"]
    for name in ("tests", "peer", "train", "eval"):  # nothing else started
        assert data["sections"][name]["status"] == "not run"
    for heading in HEADINGS:
        assert heading in text
    assert "posenc_fake_missing_module" in text


def test_no_gpu_stops_the_check_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(device, "REQUIRED_GPU", ())  # past the packages, to the device
    with pytest.raises(device.Missing, match=r"^device_check: no GPU: JAX sees .*\(cpu\)"):
        device.run(device.Check(str(tmp_path)))
    data, _ = _saved(tmp_path)
    assert data["sections"]["preflight"]["status"] == "failed"
    assert data["meta"]["platform"] == "cpu"


def test_past_its_deadline_the_child_skips_every_measurement(capsys):
    spec = {
        "size": "dry",
        "encoders": ["nope", "alibi"],
        "steps": 1,
        "warmup": 0,
        "eval_lengths": [64, 128],
        "eval_repeats": 1,
        "deadlines": {"train": time.time() - 1, "eval": time.time() - 1},
    }
    device.child(spec)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["section"], r["encoder"], r.get("length")) for r in rows] == [
        ("train", "nope", None),
        ("train", "alibi", None),
        ("eval", "nope", 64),
        ("eval", "nope", 128),
        ("eval", "alibi", 64),
        ("eval", "alibi", 128),
    ]
    assert all(r["skipped"] == "time guard" for r in rows)


def test_a_child_past_its_guard_is_killed_keeping_what_it_printed(monkeypatch):
    monkeypatch.setattr(device, "GRACE_S", 0.0)
    seen = []
    code = "import time; print('{\"row\": 1}', flush=True); time.sleep(60)"
    start = time.time()
    status = device._stream([sys.executable, "-c", code], {}, time.time() + 2, seen.append)
    assert status == "stopped by the time guard"
    assert seen == [{"row": 1}]
    assert time.time() - start < 30


def test_the_wheel_list_names_files_as_pip_names_them(tmp_path):
    wheels = _load("device_wheels")
    for name in (
        "ml_collections-1.1.0-py3-none-any.whl",
        "PyYAML-6.0.2-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    ):
        (tmp_path / name).write_bytes(b"x" * 10)
    assert wheels.wheel_for("ml-collections==1.1.0", tmp_path).name.startswith("ml_collections")
    assert wheels.wheel_for("PyYAML==6.0.2", tmp_path).name.startswith("PyYAML")
    assert wheels.wheel_for("PyYAML==6.0.1", tmp_path) is None
    assert wheels.total_bytes(tmp_path) == 20
    # Every module the device check requires beyond the machine's packages has a wheel.
    machine = {"jax", "flax", "optax", "orbax.checkpoint", "numpy", "torch"}
    assert set(device.REQUIRED + device.REQUIRED_GPU) - machine <= set(wheels.WHEELS)


@pytest.mark.slow
def test_the_dry_run_writes_every_section(tmp_path):
    from posenc import testing

    out = tmp_path / "dry"
    script = _load("device_check")
    assert script.main([str(out), "--dry-run", "--encoders", "nope,alibi,alibi@pallas"]) == 0
    data, text = _saved(out)
    for heading in HEADINGS:
        assert heading in text
    s = data["sections"]
    assert s["preflight"]["status"] == "done" and s["train"]["status"] == "done"
    assert s["eval"]["status"] == "done"
    # The GPU-only selection: the battery's cudnn cases and the cuDNN rounding test.
    cudnn = [n for n, check in testing.cases() if check == "cudnn"]
    assert s["tests"]["collected"] == len(cudnn) + 1
    train = {r["encoder"]: r for r in data["train"]}
    assert set(train) == {"nope", "alibi", "alibi@pallas"}
    # An encoder@path entry forces the path (the kernel in interpret mode off a GPU) and trains
    # the same model on the same data: the same losses as `auto`'s path, to float32 rounding.
    assert train["alibi@pallas"]["path"] == "pallas" and train["alibi"]["path"] == "xla"
    assert abs(train["alibi@pallas"]["loss"] - train["alibi"]["loss"]) < 1e-4
    for row in train.values():
        assert row["tokens_per_step"] == 2 * 32  # the dry size: batch 2 x 32 tokens
        assert row["tokens_per_s"] > 0 and row["paths"]["cpu"] == row["path"]
    assert [(r["encoder"], r["length"]) for r in data["eval"]] == [
        ("nope", 64),
        ("alibi", 64),
        ("alibi@pallas", 64),
    ]
    assert all(r["seconds"] > 0 for r in data["eval"])
    peer_importable = not device.missing_modules(("torch", "x_transformers"))
    if peer_importable:  # run tiny on the CPU
        assert s["peer"]["status"] == "done"
        assert [r["encoder"] for r in data["peer"]["train"]] == ["nope", "alibi"]
    else:
        assert s["peer"]["status"].startswith("skipped")
    ratio = train["alibi"]["tokens_per_s"] / train["nope"]["tokens_per_s"]
    assert f"| alibi | xla | {train['alibi']['tokens_per_s']:,.0f} | {ratio:.2f} |" in text


def test_the_tables_give_ratios_to_nope_and_to_the_peer(tmp_path):
    report = device.Report(device.Check(str(tmp_path)))
    report.data["meta"].update(peak_tflops_per_device=1000.0, device_kind="NVIDIA H100 80GB HBM3")

    def train(encoder, tokens_per_s, tflops):
        return {
            "encoder": encoder,
            "path": "cudnn",
            "tokens_per_s": tokens_per_s,
            "step_time_s": 0.1,
            "model_tflops_per_s": tflops,
            "compile_s": 1.0,
            "loss": 5.0,
            "compiled_bytes": 2**30,
            "mfu": tflops / 1000.0,
        }

    report.data["train"] = [train("nope", 400_000.0, 420.0), train("alibi", 300_000.0, 315.0)]
    report.data["eval"] = [
        {
            "encoder": e,
            "length": 32768,
            "path": "blocked",
            "seconds": s,
            "compiled_bytes": b,
            "compile_s": 2.0,
        }
        for e, s, b in (("nope", 0.5, 2**30), ("alibi", 0.6, 3 * 2**29))
    ]
    report.data["peer"]["train"] = [
        {
            "encoder": "nope",
            "path": "sdpa (flash)",
            "tokens_per_s": 250_000.0,
            "model_tflops_per_s": 262.5,
            "compile_s": 30.0,
            "memory_bytes": 2**31,
        }
    ]
    report.data["train"].append({"encoder": "shaw", "skipped": "time guard"})
    report.save()
    text = (tmp_path / "device_check.md").read_text()
    assert "| alibi | cudnn | 300,000 | 0.75 | 100.0 | 31.5% | 315 | 1.00 GiB |" in text
    assert "| alibi | 32768 | blocked | 0.600 | 1.20 | 1.50 GiB | 1.50 |" in text
    # posenc's NoPE over the peer's: 400k / 250k; the peer's MFU 262.5 / 1000.
    assert "| nope | sdpa (flash) | 250,000 | 1.60 | 26.2% | 2.00 GiB | 30.0 |" in text
    assert "| shaw | skipped: time guard |" in text
    assert "not results until measured" in text


@pytest.mark.slow
def test_the_tests_section_runs_its_shards_and_reads_each_outcome(tmp_path):
    """Off a GPU every selected test skips: the shards ran and each outcome was read."""
    from posenc import testing

    check = device.Check(str(tmp_path), test_shards=2)
    report = device.Report(check)
    env = device._child_env(None)
    device.run_tests(check, report, time.time() + 600, env)
    section = report.data["sections"]["tests"]
    assert section["status"] == "done"
    cudnn = [n for n, c in testing.cases() if c == "cudnn"]
    assert section["counts"] == {"skipped": len(cudnn) + 1}
    assert section["not_run"] == 0
    assert {r["id"] for r in report.data["tests"]} >= {f"test_contract[{n}-cudnn]" for n in cudnn}


# What the lent machine lacks and the carried wheels do not bring (docs/devices.md).
ABSENT_ON_DEVICE = ("tensorflow_datasets", "array_record", "tensorflow", "matplotlib")
_WITHOUT = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ImportError(f"no module named {{name!r}} (absent on the device)")

sys.meta_path.insert(0, Absent())
try:
    import matplotlib
    raise SystemExit("the blocker let matplotlib through")
except ImportError:
    pass
import posenc.benchmark.device, posenc.benchmark.torch_peer
import posenc.testing, posenc.testing.checks, posenc.attention.blocked, posenc.attention.linear
from posenc.benchmark.settings import Settings, make_config, train_windows
config = make_config(Settings(size="dry", isolate="never"), "nope")
assert train_windows(config).batch(0)["inputs"].shape == (2, 32)
print(sorted(set({absent!r}) & {{m.split(".")[0] for m in sys.modules}}))
"""


def test_the_device_checks_imports_need_none_of_what_the_device_lacks():
    """The check's path (its modules, the battery's, the embedded data) imports no TFDS,
    array-record, TensorFlow or matplotlib: run where importing them fails."""
    code = _WITHOUT.format(absent=ABSENT_ON_DEVICE)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_package_found_but_broken_stops_the_check_in_one_line(tmp_path, monkeypatch):
    broken = tmp_path / "site"
    (broken / "posenc_broken_pkg").mkdir(parents=True)
    (broken / "posenc_broken_pkg" / "__init__.py").write_text("import posenc_absent_dependency\n")
    monkeypatch.syspath_prepend(str(broken))
    monkeypatch.setattr(device, "REQUIRED", (*device.REQUIRED, "posenc_broken_pkg"))
    check = device.Check(str(tmp_path / "out"), dry_run=True, site=str(broken))
    with pytest.raises(
        device.Missing,
        match=r"^device_check: package posenc_broken_pkg does not "
        r"import: ModuleNotFoundError: .*posenc_absent_dependency",
    ):
        device.run(check)
    data, _ = _saved(tmp_path / "out")
    assert data["sections"]["preflight"]["status"] == "failed"


def test_a_killed_shards_outcomes_come_from_its_verbose_lines():
    text = "\n".join(
        [
            "tests/test_testing.py::test_contract[alibi-cudnn] PASSED                 [ 50%]",
            "tests/test_testing.py::test_contract[rope-cudnn] FAILED                  [100%]",
            "tests/test_testing.py::test_contract[t5-cudnn] SKIPPED (cudnn needs a GPU) [ 7%]",
            "collected 3 items",
        ]
    )
    rows = device._verbose(text)
    assert [(r["id"], r["outcome"]) for r in rows] == [
        ("test_contract[alibi-cudnn]", "passed"),
        ("test_contract[rope-cudnn]", "failed"),
        ("test_contract[t5-cudnn]", "skipped"),
    ]


def test_unknown_encoders_or_sections_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"^unknown encoders \['foo'\]; known: alibi, "):
        device.Check(str(tmp_path / "a"), encoders=("nope", "foo"))
    with pytest.raises(ValueError, match=r"^unknown attention paths \['fast'\] \(encoder@path\)"):
        device.Check(str(tmp_path / "c"), encoders=("nope", "alibi@fast"))
    with pytest.raises(ValueError, match=r"^unknown encoders \['foo'\]"):
        device.Check(str(tmp_path / "d"), encoders=("foo@pallas",))
    assert device.split_entry("alibi@pallas") == ("alibi", "pallas")
    assert device.split_entry("alibi") == ("alibi", "auto")
    with pytest.raises(ValueError, match=r"^unknown sections \['bar'\]; known: preflight, "):
        device.Check(str(tmp_path / "b"), sections=("preflight", "bar"))
    assert not list(tmp_path.iterdir())
