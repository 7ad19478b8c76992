"""The device check: one prepared run on a lent GPU that tests and measures everything.

``experiments/device_check.py OUT`` (docs/devices.md) runs, within a wall-time budget (default
450 s, for an 8-minute slot), five sections, each in child processes so that a section that
overruns its time guard is stopped without losing what the others measured:

- ``preflight``: the packages (:data:`REQUIRED`) and the device (a GPU, unless ``dry_run``);
  a missing one stops the run in one line before anything else starts.
- ``tests``: every test that skips without a GPU (:data:`GPU_TESTS`: the cuDNN cases of the
  encoder battery and the cuDNN rounding check), collected by pytest and run in parallel shards
  (``XLA_PYTHON_CLIENT_PREALLOCATE=false`` so that the shards share the GPU); outcomes per test
  from JUnit XML.
- ``peer``: the same network in x-transformers (:mod:`posenc.benchmark.torch_peer`): training
  for the encoders it has, and one window of each evaluation length for NoPE and RoPE.
- ``train``: each of :data:`ENCODERS`, then the :data:`PALLAS` entries (``encoder@path``: the
  bias encoders forced onto the Pallas kernel), trained for ``steps`` steps at the size's shape
  with :func:`posenc.benchmark.measure.measure_train` (GPT-2 small at 2k tokens, bf16, on a
  GPU).
- ``eval``: one window at each evaluation length (8k and 32k on a GPU) per encoder with
  :func:`posenc.benchmark.measure.measure_eval`.

``train`` and ``eval`` run in one JAX child (``python -m posenc.benchmark.device SPEC``) that
prints one JSON line per measurement; the parent saves ``device_check.json`` and
``device_check.md`` after every line. Memory: XLA's compiled memory analysis of each program
(arguments + outputs - aliased + temporaries), exact for that program, and the process's peak
so far (an upper bound, as the measurements share the process). MFU and FLOPs as in
:mod:`posenc.benchmark`.

Each section's time guard is its share of the budget (:data:`SHARES`) plus what the sections
before it left unused; inside a child, a measurement past the guard is a ``skipped`` row, and a
child still running past it (a compilation cannot be interrupted) is killed after a grace of
:data:`GRACE_S` seconds.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from typing import Any

from posenc.benchmark.device_report import markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
SECTIONS = ("preflight", "tests", "peer", "train", "eval")
# The founding eight encoders, then FIRE and KERPLE; in order of priority under the time guard.
ENCODERS = (
    "nope",
    "rope",
    "alibi",
    "t5",
    "fire",
    "kerple_log",
    "xl",
    "shaw",
    "sinusoidal",
    "learned",
)
# Entries ``encoder@path`` force model.attention_impl (any other entry runs what `auto` picks):
# the bias encoders on the Pallas kernel, measured beside their `auto` rows, since `auto` may
# choose the kernel only once a GPU has measured it faster (issue 35).
PALLAS = ("alibi@pallas", "t5@pallas", "kerple_log@pallas")


def split_entry(entry: str) -> tuple[str, str]:
    """``"alibi@pallas"`` -> ``("alibi", "pallas")``; ``"alibi"`` -> ``("alibi", "auto")``."""
    name, _, impl = entry.partition("@")
    return name, impl or "auto"


# Modules the check imports: posenc's (needed by every run), the tests' and the peer's.
REQUIRED = ("jax", "flax", "optax", "orbax.checkpoint", "ml_collections", "numpy", "yaml", "absl")
REQUIRED_GPU = ("pytest", "torch", "x_transformers")
# The tests that skip without a GPU: (file, pytest -k expression).
GPU_TESTS = (("tests/test_testing.py", "cudnn"),)
# Shares of the budget left after the preflight.
SHARES = {"tests": 0.15, "peer": 0.2, "train": 0.4, "eval": 0.25}
GRACE_S = 20.0
TARGETS = (
    "NoPE and RoPE training: at least 1.25x x-transformers' tokens/s in the same run, MFU >= 40 %",
    "bias encoders within 15 % of NoPE in training and at 32k evaluation; memory linear in length",
)


class Missing(SystemExit):
    """A package or the device is missing: the run stops in one line (its message)."""


@dataclasses.dataclass
class Check:
    """One device check. ``dry_run``: tiny shapes on any device (the CI test)."""

    out: str
    dry_run: bool = False
    budget_s: float = 450.0
    encoders: tuple[str, ...] = ENCODERS + PALLAS
    steps: int | None = None
    warmup: int | None = None
    eval_lengths: tuple[int, ...] | None = None
    eval_repeats: int = 2
    test_shards: int = 4
    # Processes that compile ahead of the measuring one into a shared persistent compilation
    # cache (default 3 on a device, 1 in a dry run); 0: the measuring process compiles alone.
    compile_helpers: int | None = None
    sections: tuple[str, ...] = SECTIONS
    # Extra entries of PYTHONPATH for the children (the installed wheels' folder).
    site: str | None = None

    def __post_init__(self):
        self.size = "dry" if self.dry_run else "gpt2_2k"
        if self.compile_helpers is None:
            self.compile_helpers = 1 if self.dry_run else 3
        self.steps = self.steps or (2 if self.dry_run else 10)
        self.warmup = self.warmup if self.warmup is not None else (1 if self.dry_run else 2)
        self.eval_lengths = tuple(self.eval_lengths or ((64,) if self.dry_run else (8192, 32768)))
        from posenc import encodings
        from posenc.attention.core import IMPLEMENTATIONS

        bad = sorted({split_entry(e)[0] for e in self.encoders} - set(encodings.names()))
        if bad or not self.encoders:
            raise ValueError(f"unknown encoders {bad}; known: {', '.join(encodings.names())}")
        paths = sorted({split_entry(e)[1] for e in self.encoders} - set(IMPLEMENTATIONS))
        if paths:
            raise ValueError(
                f"unknown attention paths {paths} (encoder@path); known: "
                f"{', '.join(IMPLEMENTATIONS)}"
            )
        unknown = sorted(set(self.sections) - set(SECTIONS) - {"preflight"})
        if unknown:
            raise ValueError(f"unknown sections {unknown}; known: {', '.join(SECTIONS)}")


# -- the report -------------------------------------------------------------------------------


class Report:
    """The check's results, saved as ``device_check.json`` and ``.md`` after every change."""

    def __init__(self, check: Check):
        self.out = pathlib.Path(check.out)
        self.data: dict[str, Any] = {
            "meta": {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "host": platform.node(),
                "python": platform.python_version(),
                "dry_run": check.dry_run,
                "budget_s": check.budget_s,
                "size": check.size,
                "steps": check.steps,
                "warmup": check.warmup,
                "eval_lengths": list(check.eval_lengths),
                "eval_repeats": check.eval_repeats,
                "flops_per_token": "6 N + 12 L T D (N: matmul parameters, L: layers, "
                "T: train length, D: heads x head dim; PaLM App. B)",
                "targets": list(TARGETS),
            },
            "sections": {s: {"status": "not run"} for s in SECTIONS},
            "tests": [],
            "peer": {"train": [], "eval": []},
            "train": [],
            "eval": [],
        }

    def section(self, name: str, **fields) -> None:
        self.data["sections"][name].update(fields)
        self.save()

    def save(self) -> None:
        from posenc.workdir import write_json

        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / "device_check.json", self.data)
        (self.out / "device_check.md").write_text(markdown(self.data))


# -- running ----------------------------------------------------------------------------------


def run(check: Check, installed: Sequence[str] = ()) -> dict[str, Any]:
    """Runs the check's sections, saving after each measurement; returns the report's data.
    ``installed``: the carried wheels installed before (recorded in the header).

    Raises:
      Missing: a package of :data:`REQUIRED` (and, on a device, :data:`REQUIRED_GPU`) is not
        importable, or no GPU is visible (not in a dry run); the report says so first.
    """
    start = time.time()
    end = start + check.budget_s
    report = Report(check)
    report.data["meta"]["installed_wheels"] = list(installed)
    env = _child_env(check.site)
    report.section("preflight", status="running")
    preflight(check, report, env)
    # Cumulative deadlines: a section that finishes early leaves its time to the next ones.
    t0, left = time.time(), end - time.time()
    plan = [s for s in ("tests", "peer", "train", "eval") if s in check.sections]
    shares = [SHARES[s] for s in plan]
    deadlines = {s: t0 + left * sum(shares[: i + 1]) / sum(shares) for i, s in enumerate(plan)}
    for name in plan:
        started = time.time()
        if name == "tests":
            run_tests(check, report, deadlines[name], env)
        elif name == "peer":
            run_peer(check, report, deadlines[name], env)
        elif name == "train" or "train" not in plan:  # eval runs in train's JAX child
            jax_sections = [s for s in ("train", "eval") if s in plan]
            run_jax(check, report, deadlines, env, jax_sections)
        else:
            continue
        report.section(name, seconds=round(time.time() - started, 1))
    report.data["meta"]["wall_s"] = round(time.time() - start, 1)
    report.save()
    return report.data


def _child_env(site: str | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in (site, str(ROOT), env.get("PYTHONPATH")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    # Measurements run as a user's would: JAX takes its default share of the GPU.
    env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    return env


def missing_modules(names: Sequence[str]) -> list[str]:
    """The names in ``names`` that cannot be imported here (found by spec, not imported)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def preflight(check: Check, report: Report, env: dict[str, str]) -> None:
    """Stops the run in one line (:class:`Missing`) on a missing package or device."""
    required = REQUIRED + (() if check.dry_run else REQUIRED_GPU)
    missing = missing_modules(required)
    optional = missing_modules(REQUIRED_GPU) if check.dry_run else []
    report.section("preflight", required=list(required), missing=missing, optional_missing=optional)
    if missing:
        message = (
            f"device_check: missing package(s) {', '.join(missing)}; run "
            "experiments/device_wheels.py where a registry is reachable and carry .device_wheels"
        )
        report.section("preflight", status="failed", error=message)
        raise Missing(message)
    probe = _probe(env, [m for m in required if m not in ("jax", "flax")])
    broken = probe.pop("import_errors", {})
    report.data["meta"].update(probe)
    if broken:
        name, error = next(iter(broken.items()))
        message = f"device_check: package {name} does not import: {error}"
        report.section("preflight", status="failed", error=message, broken=broken)
        raise Missing(message)
    if "error" in probe or (probe["platform"] != "gpu" and not check.dry_run):
        what = probe.get("error") or f"JAX sees {probe['device_kind']} ({probe['platform']})"
        message = f"device_check: no GPU: {what}; --dry-run runs the tiny check on a CPU"
        report.section("preflight", status="failed", error=message)
        raise Missing(message)
    from posenc.benchmark.measure import peak_tflops

    report.data["meta"]["peak_tflops_per_device"] = (
        None if probe["platform"] == "cpu" else peak_tflops(probe["device_kind"])
    )
    report.section("preflight", status="done")


# The device and versions, after importing every required module (a package found but broken,
# a dependency missing, fails here, early, rather than in its section).
_PROBE = """
import importlib, json, sys
errors = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception as e:
        errors[name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
import jax, flax
d = jax.devices()
print(json.dumps({"platform": d[0].platform, "device_kind": d[0].device_kind,
                  "device_count": len(d), "jax_version": jax.__version__,
                  "flax_version": flax.__version__, "import_errors": errors}))
"""


def _probe(env: dict[str, str], modules: Sequence[str] = ()) -> dict[str, Any]:
    env = {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    cmd = [sys.executable, "-c", _PROBE, json.dumps(list(modules))]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    except subprocess.TimeoutExpired:
        return {"error": "JAX did not start within 180 s"}
    if proc.returncode:
        return {"error": _last_line(proc.stderr)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln]
    return (named or lines or ["no output"])[-1][:300]


def _stream(
    cmd: list[str], env: dict[str, str], deadline: float, on_line: Callable[[dict], None]
) -> str:
    """Runs ``cmd``, passing each JSON line of its stdout to ``on_line`` as it arrives; kills
    it (its process group) at ``deadline + GRACE_S``. Returns ``"done"``, ``"exit N: <last
    stderr line>"`` or ``"stopped by the time guard"``."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        status = None
        while status is None:
            wait = deadline + GRACE_S - time.time()
            if wait <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                status = "stopped by the time guard"
                break
            if not sel.select(timeout=min(wait, 5.0)):
                continue
            line = proc.stdout.readline()
            if not line:  # end of output
                break
            if line.startswith("{"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # not one of ours
                    continue
                on_line(row)
        proc.wait()
        sel.close()
        if status:
            return status
        if proc.returncode:
            err.seek(0)
            return f"exit {proc.returncode}: {_last_line(err.read())}"
        return "done"


# -- the sections -----------------------------------------------------------------------------


def run_tests(check: Check, report: Report, deadline: float, env: dict[str, str]) -> None:
    """The GPU-only tests (collected, then run in ``check.test_shards`` parallel shards); in a
    dry run only collected (they skip without a GPU)."""
    report.section("tests", status="collecting")
    env = {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    ids: list[str] = []
    for path, expression in GPU_TESTS:
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        cmd += [path, "-k", expression]
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                timeout=max(10.0, deadline - time.time()),
            )
        except subprocess.TimeoutExpired:
            report.section("tests", status="stopped by the time guard while collecting")
            return
        # Node ids only (a warning's text may quote one after other words).
        ids += [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{path}::")]
    command = " ".join(f"{p} -k {e}" for p, e in GPU_TESTS)
    if not ids:
        report.section(
            "tests", status="failed", error="no GPU-only tests collected", command=command
        )
        return
    if check.dry_run:
        report.section(
            "tests",
            status="collected only (dry run: they skip without a GPU)",
            command=command,
            collected=len(ids),
        )
        return
    report.section("tests", status="running", command=command, collected=len(ids))
    shards = [ids[i :: check.test_shards] for i in range(check.test_shards)]
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, shard in enumerate(shards):
            if not shard:
                continue
            xml = pathlib.Path(tmp) / f"shard{i}.xml"
            log = pathlib.Path(tmp) / f"shard{i}.log"
            cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider"]
            cmd += [f"--junitxml={xml}", *shard]
            with open(log, "w") as out:  # -v: one line per finished test, kept if killed
                proc = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=ROOT,
                    start_new_session=True,
                )
            procs.append((proc, xml, log))
        stopped = False
        for proc, _, _ in procs:
            try:
                proc.wait(timeout=max(1.0, deadline + GRACE_S - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                stopped = True
        for _, xml, log in procs:
            report.data["tests"] += _junit(xml) if xml.exists() else _verbose(log.read_text())
    counts: dict[str, int] = {}
    for row in report.data["tests"]:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    ran = {row["id"] for row in report.data["tests"]}
    not_run = [i for i in ids if i.split("::")[-1] not in ran]
    status = "stopped by the time guard" if stopped else "done"
    report.section("tests", status=status, counts=counts, not_run=len(not_run))


_VERBOSE = re.compile(r"^\S+::(\S+) (PASSED|FAILED|SKIPPED|ERROR)\b")


def _verbose(text: str) -> list[dict[str, Any]]:
    """Outcomes from ``pytest -v`` lines, for a shard killed before its JUnit XML was written."""
    rows = []
    for line in text.splitlines():
        match = _VERBOSE.match(line)
        if match:
            outcome = {"FAILED": "failed", "ERROR": "error"}.get(match[2], match[2].lower())
            rows.append({"id": match[1], "outcome": outcome, "message": "", "seconds": 0.0})
    return rows


def _junit(path: pathlib.Path) -> list[dict[str, str]]:
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (
                    (node.get("message") or "").splitlines()[0][:300] if node.get("message") else ""
                )
        rows.append(
            {
                "id": case.get("name"),
                "outcome": outcome,
                "message": message,
                "seconds": float(case.get("time") or 0),
            }
        )
    return rows


def peer_spec(check: Check, deadline: float, device: str) -> dict[str, Any]:
    """The x-transformers run at the check's shape (:mod:`posenc.benchmark.torch_peer`)."""
    from posenc.benchmark.settings import SIZES
    from posenc.benchmark.torch_peer import ENCODERS as PEER

    size = SIZES[check.size]
    m = size["model"]
    return {
        "device": device,
        "dtype": m["dtype"],
        "compile": not check.dry_run,
        "vocab": 257,
        "dim": m["model_dim"],
        "layers": m["num_layers"],
        "heads": m["num_heads"],
        "mlp_dim": m["mlp_dim"],
        "seq_len": size["train"]["seq_len"],
        "batch": size["train"]["batch_size"],
        "steps": check.steps,
        "warmup": check.warmup,
        "repeats": check.eval_repeats,
        "encoders": [e for e in check.encoders if e in PEER],
        "eval_encoders": [e for e in ("nope", "rope") if e in check.encoders],
        "eval_lengths": list(check.eval_lengths),
        "deadline": deadline,
    }


def run_peer(check: Check, report: Report, deadline: float, env: dict[str, str]) -> None:
    """x-transformers in its own process; skipped in a dry run without torch or x-transformers."""
    absent = missing_modules(("torch", "x_transformers"))
    if absent:  # only in a dry run: the preflight requires them on a device
        report.section("peer", status=f"skipped: {', '.join(absent)} not importable (dry run)")
        return
    device = "cpu" if check.dry_run else "cuda"
    spec = peer_spec(check, deadline, device)
    report.section(
        "peer", status="running", spec={k: v for k, v in spec.items() if k != "deadline"}
    )

    def on_line(row: dict) -> None:
        if "versions" in row:
            report.data["meta"]["peer_versions"] = row["versions"]
        else:
            report.data["peer"][row.pop("section")].append(row)
        report.save()

    script = str(ROOT / "posenc" / "benchmark" / "torch_peer.py")
    status = _stream([sys.executable, script, json.dumps(spec)], env, deadline, on_line)
    report.section("peer", status=status)


def run_jax(
    check: Check,
    report: Report,
    deadlines: dict[str, float],
    env: dict[str, str],
    sections: Sequence[str] = ("train", "eval"),
) -> None:
    """posenc's training and evaluation rows from one JAX child (:func:`child`), each section
    under its own deadline."""
    spec = {
        "size": check.size,
        "encoders": list(check.encoders),
        "steps": check.steps,
        "warmup": check.warmup,
        "eval_lengths": list(check.eval_lengths),
        "eval_repeats": check.eval_repeats,
        "sections": list(sections),
        "deadlines": {s: deadlines[s] for s in sections},
    }
    for name in sections:
        report.section(name, status="running")
    peak = report.data["meta"].get("peak_tflops_per_device")

    def on_line(row: dict) -> None:
        section = row.pop("section")
        if section == "train" and peak and row.get("model_tflops_per_s"):
            row["mfu"] = row["model_tflops_per_s"] / (peak * row.get("devices", 1))
        report.data[section].append(row)
        if section == "eval" and "train" in sections:
            report.data["sections"]["train"]["status"] = "done"
        report.save()

    cmd = [sys.executable, "-m", "posenc.benchmark.device"]
    with tempfile.TemporaryDirectory() as cache:
        # Helpers compile the later encoders' programs while this child measures the first:
        # it then loads them from the cache (compile_s is then the load), and the compiling
        # of ten encoders is spread over 1 + compile_helpers processes.
        env = {**env, "JAX_COMPILATION_CACHE_DIR": cache}
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        helpers = _start_helpers(check, spec, env)
        report.data["meta"]["compile_helpers"] = len(helpers)
        try:
            status = _stream([*cmd, json.dumps(spec)], env, deadlines[sections[-1]], on_line)
        finally:
            for helper in helpers:
                if helper.poll() is None:
                    os.killpg(helper.pid, signal.SIGKILL)
                helper.wait()
    for name in sections:
        if status != "done" and report.data["sections"][name]["status"] == "running":
            report.data["sections"][name]["status"] = status
        elif status == "done":
            report.data["sections"][name]["status"] = "done"
    report.save()


def _start_helpers(check: Check, spec: dict[str, Any], env: dict[str, str]) -> list:
    """The compiling helpers (:func:`child` with ``warm``): helper ``k`` compiles the training
    steps of encoders ``1 + k``, ``1 + k + n``, ... (the measuring child compiles the first
    itself), then the scoring programs of encoders ``k``, ``k + n``, ...; they share the GPU
    without preallocating and run no step."""
    n = check.compile_helpers
    encoders = spec["encoders"]
    helpers = []
    for k in range(n):
        warm = {
            "train": encoders[1:][k::n] if "train" in spec["sections"] else [],
            "eval": encoders[k::n] if "eval" in spec["sections"] else [],
        }
        if not (warm["train"] or warm["eval"]):
            continue
        cmd = [sys.executable, "-m", "posenc.benchmark.device", json.dumps({**spec, "warm": warm})]
        helper_env = {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        helpers.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=helper_env,
                cwd=ROOT,
                start_new_session=True,
            )
        )
    return helpers


def _warm(settings, spec: dict[str, Any]) -> None:
    """A helper's work: compile, never run, until the deadline (failures are the measuring
    child's to report)."""
    from posenc.benchmark.measure import compile_eval, compile_train

    deadlines = spec["deadlines"]
    for entry in spec["warm"]["train"]:
        if time.time() < deadlines.get("train", 0):
            try:
                compile_train(*_entry_settings(settings, entry))
            except Exception:  # noqa: BLE001, S112
                continue
    for entry in spec["warm"]["eval"]:
        if time.time() < deadlines.get("eval", 0):
            try:
                compile_eval(*_entry_settings(settings, entry), settings.eval_lengths)
            except Exception:  # noqa: BLE001, S112
                continue


def _entry_settings(settings, entry: str):
    """``(settings with the entry's attention path, encoder name)`` for an ``encoder@path``."""
    name, impl = split_entry(entry)
    return dataclasses.replace(settings, attention_impl=impl, encoders=(name,)), name


def _labelled(row: dict[str, Any], entry: str) -> dict[str, Any]:
    return {**row, "encoder": entry}


def child(spec: dict[str, Any]) -> None:
    """The JAX child: one JSON line per training row, then per evaluation row."""
    from posenc.benchmark.measure import measure_eval, measure_train, peak_bytes_in_use, short_error
    from posenc.benchmark.settings import Settings

    settings = Settings(
        size=spec["size"],
        encoders=tuple(dict.fromkeys(split_entry(e)[0] for e in spec["encoders"])),
        steps=spec["steps"],
        warmup=spec["warmup"],
        eval_lengths=tuple(spec["eval_lengths"]),
        eval_repeats=spec["eval_repeats"],
        isolate="never",
    )

    if "warm" in spec:
        _warm(settings, spec)
        return

    def emit(section: str, row: dict[str, Any]) -> None:
        row["process_peak_bytes"] = peak_bytes_in_use()
        print(json.dumps({"section": section, **row}), flush=True)

    deadlines = spec["deadlines"]
    entries = spec["encoders"]
    for encoder in entries if "train" in deadlines else ():
        if time.time() > deadlines["train"]:
            emit("train", {"encoder": encoder, "skipped": "time guard"})
            continue
        try:
            row, _ = measure_train(*_entry_settings(settings, encoder))
        except Exception as e:  # noqa: BLE001 - a row of the table
            row = {"encoder": encoder, "error": short_error(e)}
        emit("train", _labelled(row, encoder))
    for encoder in entries if "eval" in deadlines else ():
        if time.time() > deadlines["eval"]:
            for length in settings.eval_lengths:
                emit("eval", {"encoder": encoder, "length": length, "skipped": "time guard"})
            continue
        try:
            rows = measure_eval(*_entry_settings(settings, encoder), settings.eval_lengths)
        except Exception as e:  # noqa: BLE001 - building the model or the data failed
            rows = [
                {"encoder": encoder, "length": n, "error": short_error(e)}
                for n in settings.eval_lengths
            ]
        for row in rows:
            emit("eval", _labelled(row, encoder))


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
