"""The prepared device check (issue 35): on one lent H100/H200, within 8 minutes, run every
GPU-only test, train the founding eight encoders plus FIRE and KERPLE at GPT-2 small's shape
(12 layers, width 768, 2k tokens, bf16), evaluate 8k and 32k windows, and run the same shapes in
x-transformers (PyTorch, compiled, flash) as the peer; what is measured and how:
:mod:`posenc.benchmark.device`; how a session runs it: docs/devices.md.

    python experiments/device_wheels.py                          # here, once: .device_wheels/
    python experiments/device_check.py $OUT/device_check         # on the device
    python experiments/device_check.py runs/dry --dry-run        # any CPU, tiny shapes

Writes ``device_check.json`` and ``device_check.md`` to the folder, after every measurement.
Wheels in ``.device_wheels/`` whose modules the machine cannot import are first installed into
``.device_site/`` (``pip install --no-index --no-deps --target``; nothing the machine has is
replaced). A missing package or no GPU stops it in one line (exit status 2), after saving.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
SITE = ROOT / ".device_site"


def _wheels_module():
    spec = importlib.util.spec_from_file_location(
        "_device_wheels", ROOT / "experiments" / "device_wheels.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_wheels(folder: pathlib.Path, site: pathlib.Path = SITE) -> list[str]:
    """Installs the wheels of ``folder`` whose modules are not importable into ``site`` and
    puts ``site`` on ``sys.path``; returns the wheel files installed."""
    wheels = _wheels_module()
    if site.is_dir():
        sys.path.insert(0, str(site))
    if not folder.is_dir():
        return []
    todo = []
    for module, requirement in wheels.WHEELS.items():
        if importlib.util.find_spec(module) is None:
            path = wheels.wheel_for(requirement, folder)
            if path is not None:
                todo.append(str(path))
    if todo and importlib.util.find_spec("pip") is not None:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        cmd += ["--find-links", str(folder), "--target", str(site), "--upgrade", *todo]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"device_check: installing the carried wheels failed: {tail}")
    elif todo:  # no pip: a wheel is a zip of its files, laid out as site-packages holds them
        for path in todo:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(site)
    if todo:
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    return [pathlib.Path(t).name for t in todo]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for device_check.json and device_check.md")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, any device")
    parser.add_argument("--budget", type=float, default=450.0, help="wall-time budget, seconds")
    parser.add_argument(
        "--encoders",
        default=None,
        help="comma-separated; encoder@path forces model.attention_impl (default: the ten, then "
        "alibi@pallas, t5@pallas, kerple_log@pallas)",
    )
    parser.add_argument(
        "--sections", default=None, help="comma-separated of tests,peer,train,eval (default: all)"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed training steps")
    parser.add_argument("--eval-lengths", default=None, help="comma-separated window lengths")
    parser.add_argument(
        "--wheels",
        default=str(ROOT / ".device_wheels"),
        help="the carried wheels (experiments/device_wheels.py)",
    )
    args = parser.parse_args(argv)
    installed = install_wheels(pathlib.Path(args.wheels))
    # This process only orchestrates: if anything it imports touches the GPU, it takes no share.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    sys.path.insert(0, str(ROOT))
    try:
        from posenc.benchmark import device
    except ImportError as e:
        raise SystemExit(
            f"device_check: missing package {e.name}: run "
            "experiments/device_wheels.py and carry .device_wheels"
        ) from None
    kwargs = {}
    if args.encoders:
        kwargs["encoders"] = tuple(e for e in args.encoders.split(",") if e)
    if args.sections:
        kwargs["sections"] = ("preflight", *(s for s in args.sections.split(",") if s))
    if args.eval_lengths:
        kwargs["eval_lengths"] = tuple(int(n) for n in args.eval_lengths.split(","))
    try:
        check = device.Check(
            args.out,
            dry_run=args.dry_run,
            budget_s=args.budget,
            steps=args.steps,
            site=str(SITE) if SITE.is_dir() else None,
            **kwargs,
        )
    except ValueError as e:
        parser.error(str(e))
    try:
        data = device.run(check, installed=installed)
    except device.Missing as e:
        print(e, file=sys.stderr)
        return 2
    print(device.markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
