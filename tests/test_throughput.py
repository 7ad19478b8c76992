"""posenc.benchmark (experiments/throughput.py): a CPU smoke run whose numbers must agree."""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import pathlib

import jax
import pytest

from posenc import benchmark, encodings
from posenc.benchmark import Settings

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "throughput.py"
ENCODERS = ("rope", "shaw")
LENGTHS = (64, 256)
STEPS = 3


def _run(out: pathlib.Path, **settings) -> dict:
    """What the script does: run, then write both files to ``out``."""
    report = benchmark.run(Settings(size="cpu", **settings))
    benchmark.write_report(report, out)
    return report


def _smoke_run(out: pathlib.Path):
    _run(
        out,
        encoders=ENCODERS,
        eval_lengths=LENGTHS,
        steps=STEPS,
        warmup=1,
        eval_repeats=1,
        peak_tflops=0.5,
        isolate="never",
    )
    report = json.loads((out / "throughput_cpu.json").read_text())
    return report, (out / "throughput_cpu.md").read_text()


@pytest.mark.slow
def test_smoke_run_numbers_agree(tmp_path):
    """One test for one run (about 20 s on two cores), so that xdist workers do not repeat it."""
    smoke = _smoke_run(tmp_path)
    _check_header(smoke)
    _check_training(smoke)
    _check_evaluation(smoke)
    _check_markdown(smoke)


def _check_header(smoke):
    report, text = smoke
    meta = report["meta"]
    assert meta["device_kind"] == jax.devices()[0].device_kind
    assert meta["jax_version"] == jax.__version__
    datetime.datetime.fromisoformat(meta["date"])
    assert meta["size"] == "cpu" and meta["steps"] == STEPS
    assert meta["eval_lengths"] == list(LENGTHS)
    assert meta["model"]["num_layers"] == 2 and meta["model"]["model_dim"] == 64
    for fragment in (meta["device_kind"], f"jax {jax.__version__}", meta["date"], "6 N + 12 L T D"):
        assert fragment in text
    # No allocator statistics on CPU: the compiled analysis is the memory figure, and says so.
    assert "compiled memory analysis" in meta["memory_source"]


def _check_training(smoke):
    report, _ = smoke
    rows = {row["encoder"]: row for row in report["train"]}
    assert set(rows) == set(ENCODERS)
    for name, row in rows.items():
        assert "error" not in row, row
        assert row["tokens_per_step"] == 8 * 128  # --size cpu: batch 8 x length 128
        assert row["tokens_per_s"] > 0 and row["step_time_s"] > 0
        # Step time and throughput are one measurement: tokens/s x step time = tokens per step.
        assert math.isclose(row["tokens_per_s"] * row["step_time_s"], row["tokens_per_step"])
        assert math.isclose(row["step_time_s"] * STEPS, row["seconds"])
        expected = 6 * row["matmul_params"] + 12 * 2 * 128 * 64
        assert row["flops_per_token"] == expected
        tflops = row["flops_per_token"] * row["tokens_per_s"] / 1e12
        assert math.isclose(row["model_tflops_per_s"], tflops)
        assert math.isclose(row["mfu"], tflops / 0.5)
        assert row["memory_source"] == "compiled"
        # The state (params + two Adam moments) alone is 3 x 4 bytes per parameter.
        assert row["memory_bytes"] > 12 * row["num_params"]
        assert 0 < row["loss"] < 10, name
    # Shaw's tables are positional parameters (excluded from N); RoPE has none.
    assert rows["rope"]["matmul_params"] == rows["rope"]["num_params"]
    assert rows["shaw"]["matmul_params"] < rows["shaw"]["num_params"]
    assert rows["rope"]["path"] == "xla" and rows["shaw"]["path"] == "einsum"
    # The path on each backend (float32 here: no cuDNN on a GPU either).
    assert rows["rope"]["paths"] == {"cpu": "xla", "gpu": "xla", "tpu": "xla"}
    assert rows["shaw"]["paths"] == dict.fromkeys(("cpu", "gpu", "tpu"), "einsum")


def _check_evaluation(smoke):
    report, _ = smoke
    entries = {(row["encoder"], row["length"]): row for row in report["eval"]}
    assert set(entries) == {(e, n) for e in ENCODERS for n in LENGTHS}
    for (_, length), row in entries.items():
        assert "error" not in row, row
        assert row["seconds"] > 0
        assert math.isclose(row["tokens_per_s"] * row["seconds"], length)
        assert 0 < row["loss"] < 10
    for name in ENCODERS:
        short, long = entries[(name, LENGTHS[0])], entries[(name, LENGTHS[1])]
        assert long["memory_bytes"] > short["memory_bytes"] > 0
    assert entries[("shaw", 64)]["path"] == "einsum"  # one block: explicit probabilities
    assert entries[("shaw", 256)]["path"] == "einsum"


def _check_markdown(smoke):
    report, text = smoke
    for row in report["train"]:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {row['encoder']} | "))
        assert f"{row['tokens_per_s']:,.0f}" in line
        assert f"{1e3 * row['step_time_s']:.1f}" in line
        assert f"{100 * row['mfu']:.1f}%" in line
    for row in report["eval"]:
        prefix = f"| {row['encoder']} | {row['length']} | {row['path']} | {row['seconds']:.3f} |"
        assert prefix in text
        assert (
            f"| {row['encoder']} | {row['length']} | " + " | ".join(row["paths"].values()) in text
        )


def test_failures_are_reported_not_raised(tmp_path):
    # Shaw's value term needs the probabilities, so forcing XLA's fused attention must fail;
    # the run goes on and the table shows the error.
    report = _run(
        tmp_path,
        encoders=["shaw"],
        eval_lengths=[64],
        steps=1,
        warmup=0,
        attention_impl="xla",
        isolate="never",
    )
    assert "value term" in report["train"][0]["error"]
    assert "value term" in report["eval"][0]["error"]
    assert "mfu" not in report["train"][0]
    text = (tmp_path / "throughput_cpu.md").read_text()
    assert "| shaw | error: ValueError" in text
    assert "| shaw | 64 | error: ValueError" in text


def test_peak_table():
    assert benchmark.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert benchmark.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert benchmark.peak_tflops("NVIDIA H200") == 989.0
    assert benchmark.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert benchmark.peak_tflops("cpu") is None


def test_command_line():
    """The script's flags become the library's Settings; defaults come from the size."""
    spec = importlib.util.spec_from_file_location("throughput", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    settings, args = script._parse_args(
        ["--size=cpu", "--encoders=rope,shaw", "--steps=2", "--isolate=never", "--out=x"]
    )
    assert args.out == "x" and settings.encoders == ("rope", "shaw")
    assert args.rounds == 0  # one encoder after the other, unless --rounds asks to interleave
    assert settings.steps == 2 and settings.warmup == 3 and settings.isolate == "never"
    assert settings.eval_lengths == benchmark.SIZES["cpu"]["eval_lengths"]
    settings, _ = script._parse_args(["--eval-lengths=64,256", "--peak-tflops=1.5"])
    assert settings.size == "small" and settings.eval_lengths == (64, 256)
    assert settings.peak_tflops == 1.5 and settings.encoders == encodings.names()
    with pytest.raises(SystemExit):
        script._parse_args(["--encoders=rope,nonsense"])
    _, args = script._parse_args(["--rounds=5", "--no-train"])
    assert args.rounds == 5 and args.no_train
    with pytest.raises(SystemExit):
        script._parse_args(["--rounds=-1"])
    _, args = script._parse_args(["--window=512", "--window-length=8192", "--pattern-length=2048"])
    assert (args.window, args.window_length, args.pattern_length) == (512, 8192, 2048)
    assert args.window_encoder == "rope"


def test_window_cases_are_the_configs_they_name():
    """--window's figures: the same tokens in full windows of W, one sliding window, and a
    local/global pattern beside its layers alone (configs only; nothing compiled)."""
    from posenc.models.build import layer_kinds, model_config

    cases = benchmark.windows.window_cases(Settings(size="cpu"), "rope", 64, 512, 256)
    assert list(cases) == [
        "full@64",
        "sliding@512",
        "full@512",
        "pattern",
        "all-local",
        "all-global",
    ]
    assert [(n, rows) for _, n, rows in cases.values()] == [
        (64, 8), (512, 1), (512, 1), (256, 1), (256, 1), (256, 1)
    ]  # fmt: skip
    windows = {
        name: model_config(c).attention_options().window for name, (c, _, _) in cases.items()
    }
    assert windows["sliding@512"] == windows["all-local"] == "sliding:64"
    assert windows["full@64"] == windows["full@512"] == windows["all-global"] == "full"
    pattern = cases["pattern"][0]
    kinds = [kind.options.window for kind in layer_kinds(pattern)]
    assert kinds == ["sliding:64"] * 3 + ["full"] and pattern.model.num_layers == 4
    assert layer_kinds(cases["all-local"][0]) == ()
    with pytest.raises(ValueError, match="multiple of --window"):
        benchmark.windows.window_cases(Settings(size="cpu"), "rope", 100, 512, 256)


@pytest.mark.slow
def test_window_rounds(tmp_path):
    """--window: every figure timed once per round, the ratios the per-round quotients."""
    settings = Settings(size="cpu", eval_repeats=1)
    report = benchmark.windows.run_window_rounds(
        settings, rounds=2, window=64, length=1024, pattern_length=256
    )
    rows = {row["figure"]: row for row in report["rows"]}
    assert rows["sliding@1024"]["path"] == "blocked" and rows["full@64"]["tokens"] == 1024
    per_token = {f: [s / row["tokens"] for s in row["seconds"]] for f, row in rows.items()}
    ratio = report["ratios"]["sliding@1024 / full@64 per token"]
    sliding, full = per_token["sliding@1024"], per_token["full@64"]
    quotients = [a / b for a, b in zip(sliding, full, strict=True)]
    assert ratio["per_round"] == quotients and ratio["min"] == min(quotients)
    text = benchmark.windows.write_report(report, tmp_path)
    assert (tmp_path / "windows_cpu.json").exists() and "| pattern | 4 |" in text


@pytest.mark.slow
def test_isolated_workers(tmp_path):
    """One process per measurement (the GPU mode), exercised on CPU, with a failing worker."""
    report = _run(
        tmp_path,
        encoders=["rope", "shaw"],
        eval_lengths=[64],
        steps=1,
        warmup=0,
        eval_repeats=1,
        attention_impl="einsum",
        isolate="always",
    )
    rope_train, shaw_train = report["train"]
    assert rope_train["tokens_per_s"] > 0 and rope_train["path"] == "einsum"
    assert shaw_train["tokens_per_s"] > 0
    assert all(row["seconds"] > 0 for row in report["eval"])
    # CPU devices have no allocator statistics: the workers fall back to the compiled figure.
    assert rope_train["peak_bytes_in_use"] is None
    assert rope_train["memory_source"] == "compiled"
    failed = _run(
        tmp_path,
        encoders=["shaw"],
        eval_lengths=[64],
        steps=1,
        attention_impl="xla",
        isolate="always",
    )
    assert "worker exited with 1" in failed["train"][0]["error"]
    assert "value term" in failed["train"][0]["error"]


@pytest.mark.slow
def test_interleaved_rounds(tmp_path):
    """--rounds: every encoder and figure timed once per round, NoPE's ratios exactly 1, the
    ratios the per-round quotients, a failure reported for its figure alone; --peer: the
    hand-written network's training row, timed in the same rounds."""
    settings = Settings(
        size="cpu", encoders=("rope", "learned"), steps=1, warmup=0, eval_lengths=(64, 4096)
    )
    report = benchmark.rounds.run_rounds(settings, rounds=2, peer=True)
    rows = {(row["encoder"], row["figure"]): row for row in report["rows"]}
    # NoPE is the baseline, measured though not asked for; learned's table stops at 2048.
    assert set(rows) == {
        (e, f) for e in ("nope", "rope", "learned") for f in ("train", 64, 4096)
    } - {("learned", 4096)} | {(benchmark.peer.NAME, "train")}
    assert "learned at 4096" in report["errors"]
    for (_, figure), row in rows.items():
        assert len(row["seconds"]) == 2 and row["min"] <= row["median"] <= row["max"]
        nope = rows["nope", figure]["seconds"]
        ratios = [a / b for a, b in zip(row["seconds"], nope, strict=True)]
        assert row["ratio_min"] == min(ratios) and row["ratio_max"] == max(ratios)
    assert rows["nope", 4096]["ratio_median"] == 1.0 and rows["rope", 4096]["path"] == "blocked"
    text = benchmark.rounds.write_report(report, tmp_path)
    assert (tmp_path / "rounds_cpu.json").exists() and "| rope |" in text
    assert f"| {benchmark.peer.NAME} | " in text  # its evaluation cells n/a
    assert "learned at 4096" in text and str(report["meta"]["load_average_1min"]) in text
