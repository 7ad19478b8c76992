"""Downloads the wheels the lent GPU machine lacks, for its Python (3.12, manylinux x86-64), into
an ignored folder that the device tool carries with the working tree (docs/devices.md).

    python experiments/device_wheels.py                 # -> .device_wheels/ (checks < 64 MiB)

The machine has CUDA, JAX with its CUDA plugin, flax, optax, orbax, PyTorch, transformers and
sacrebleu, and reaches no network. What the device check (experiments/device_check.py) needs
beyond them is :data:`WHEELS`: ml-collections for posenc's configs, pytest for the GPU-only
tests, x-transformers and its dependencies for the PyTorch peer, and the small pure-Python
packages those need, in case the machine lacks them. Every wheel is downloaded with
``--no-deps`` (the list is explicit and pinned) and ``--only-binary=:all:``; the device check
installs only those whose module the machine cannot import, into a folder of its own
(``pip install --no-index --no-deps --target``), so the machine's JAX, torch and numpy are
never replaced. posenc's other dependencies (tensorflow-datasets, array-record) are imported only
by the data sources that need them, not on the device check's path.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The folder the wheels go to (ignored by git; `carry` it to the device).
WHEEL_DIR = ROOT / ".device_wheels"
# What the device tool carries with the working tree, in all.
CARRY_LIMIT = 64 * 2**20
PYTHON_VERSION = "3.12"
PLATFORM = "manylinux2014_x86_64"

# module the device check imports -> the pinned distribution that provides it.
WHEELS: dict[str, str] = {
    "ml_collections": "ml-collections==1.1.0",
    "absl": "absl-py==2.3.1",
    "yaml": "PyYAML==6.0.2",
    "pytest": "pytest==9.2.0",
    "pluggy": "pluggy==1.7.0",
    "iniconfig": "iniconfig==2.3.1",
    "pygments": "pygments==2.19.2",
    "packaging": "packaging==25.0",
    "x_transformers": "x-transformers==2.31.10",
    "einops": "einops==0.8.2",
    "einx": "einx==0.4.3",
    "loguru": "loguru==0.7.3",
    "torch_einops_utils": "torch-einops-utils==0.2.0",
    "frozendict": "frozendict==2.5.1",
}


def canonical(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 503, then ``-`` -> ``_``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel_for(requirement: str, folder: pathlib.Path) -> pathlib.Path | None:
    """The wheel in ``folder`` of ``requirement`` (``name==version``), or None."""
    name, version = requirement.split("==")
    for path in sorted(folder.glob("*.whl")):
        dist, wheel_version = path.name.split("-")[:2]
        if canonical(dist) == canonical(name) and wheel_version == version:
            return path
    return None


def total_bytes(folder: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.whl"))


def download(folder: pathlib.Path = WHEEL_DIR) -> int:
    """Downloads :data:`WHEELS` into ``folder``; returns their total size in bytes.

    Raises:
      SystemExit: pip failed, or the wheels exceed :data:`CARRY_LIMIT` (one line).
    """
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    cmd += ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--platform", PLATFORM]
    cmd += ["--implementation", "cp", "-d", str(folder), *WHEELS.values()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"device_wheels: pip download failed: {tail}")
    missing = [r for r in WHEELS.values() if wheel_for(r, folder) is None]
    if missing:
        raise SystemExit(f"device_wheels: no wheel in {folder} for {', '.join(missing)}")
    total = total_bytes(folder)
    if total > CARRY_LIMIT:
        raise SystemExit(
            f"device_wheels: {total / 2**20:.1f} MiB in {folder}, over the {CARRY_LIMIT >> 20} "
            "MiB the device tool carries"
        )
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=str(WHEEL_DIR), help="the folder for the wheels")
    args = parser.parse_args(argv)
    folder = pathlib.Path(args.dest)
    total = download(folder)
    print(f"{len(WHEELS)} wheels, {total / 2**20:.2f} MiB in {folder} (limit 64 MiB)")
    for path in sorted(folder.glob("*.whl")):
        print(f"  {path.name}  {path.stat().st_size / 2**10:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
