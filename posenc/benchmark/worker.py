"""One measurement in a fresh Python process, so that the process's peak is that measurement's.

The allocator's ``memory_stats()['peak_bytes_in_use']`` cannot be reset inside a process, so on
devices that report it each measurement runs in its own worker. The parent calls
:func:`run_in_worker`; the worker is ``python -m posenc.benchmark`` (this module's :func:`main`),
which receives the :class:`~posenc.benchmark.settings.Settings` as JSON and writes its result
as JSON to a file the parent reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from posenc.benchmark.measure import measure_eval, measure_train, peak_bytes_in_use, probe
from posenc.benchmark.settings import Settings

TASKS = ("probe", "train", "eval")


def run_task(
    settings: Settings, task: str, encoder: str | None = None, length: int | None = None
) -> dict[str, Any]:
    """One measurement in this process; run isolated, the process peak is this measurement's."""
    if task == "probe":
        return probe()
    if task == "train":
        out, _ = measure_train(settings, encoder)
    else:
        out = measure_eval(settings, encoder, [length])[0]
    out["peak_bytes_in_use"] = peak_bytes_in_use()
    return out


def run_in_worker(
    settings: Settings, task: str, encoder: str | None = None, length: int | None = None
) -> dict[str, Any]:
    """:func:`run_task` in a fresh Python process; failures come back as ``{"error": ...}``."""
    out = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"posenc_throughput_{os.getpid()}.json"
    cmd = [sys.executable, "-m", "posenc.benchmark", "--task", task, "--out", str(out)]
    cmd += ["--settings", json.dumps(dataclasses.asdict(settings))]
    if encoder:
        cmd += ["--encoder", encoder]
    if length:
        cmd += ["--length", str(length)]
    timeout = settings.timeout
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if proc.returncode < 0:
        return {"error": f"worker killed by signal {-proc.returncode} (out of host memory?)"}
    if proc.returncode != 0 or not out.exists():
        return {"error": f"worker exited with {proc.returncode}: {_stderr_summary(proc)}"}
    result = json.loads(out.read_text())
    out.unlink()
    return result


def _stderr_summary(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    # The most informative line of a JAX failure names the error (e.g. RESOURCE_EXHAUSTED).
    named = [ln for ln in lines if "Error" in ln or "RESOURCE_EXHAUSTED" in ln]
    detail = (named or lines or [f"exit status {proc.returncode}"])[-1]
    return detail.strip()[:300]


def main(argv: Sequence[str] | None = None) -> None:
    """The worker's side: runs the task the parent names and writes its result to ``--out``."""
    parser = argparse.ArgumentParser(description="posenc.benchmark worker (run by the parent)")
    parser.add_argument("--settings", required=True, help="Settings as JSON")
    parser.add_argument("--task", choices=TASKS, required=True)
    parser.add_argument("--out", required=True, help="JSON file for the result")
    parser.add_argument("--encoder", default=None)
    parser.add_argument("--length", type=int, default=None)
    args = parser.parse_args(argv)
    settings = Settings(**json.loads(args.settings))
    result = run_task(settings, args.task, args.encoder, args.length)
    pathlib.Path(args.out).write_text(json.dumps(result))
