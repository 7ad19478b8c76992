"""Child process of ``tests/test_multiprocess.py``: trains and evaluates the tiny config.

Usage: ``python tests/_mp_train.py SPEC_JSON``, with SPEC_JSON holding ``workdir``, ``report``
(where to write what this process saw), ``overrides`` (dotted config overrides). The device
count comes from ``XLA_FLAGS`` and, with ``distributed.initialize=True``, the process id from
``POSENC_PROCESS_ID``, as a cluster launcher would set them.

The report lists the files this process opened for writing or renamed inside the work
directory (Python's audit events; orbax's own writes happen in C++ and are not seen), so the
test can check that only process 0 writes metrics, ``config.json`` and ``eval.json``.
"""

from __future__ import annotations

import json
import os
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND


def _watch_writes(root: str) -> list[str]:
    written: list[str] = []

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if mode else bool((flags or 0) & _WRITE_FLAGS)
        elif event in ("os.rename", "os.replace"):
            path, writes = args[1], True
        else:
            return
        if writes and isinstance(path, str | bytes | os.PathLike):
            path = os.path.abspath(os.fsdecode(path))
            if path.startswith(root + os.sep):
                written.append(os.path.relpath(path, root))

    sys.addaudithook(hook)
    return written


def main() -> None:
    spec = json.loads(sys.argv[1])
    workdir = os.path.abspath(spec["workdir"])
    written = _watch_writes(workdir)

    import jax

    from posenc.runs.config import apply_overrides, load_config
    from posenc.runs.evaluate import evaluate_workdir
    from posenc.runs.train import train

    config_path = os.path.join(os.path.dirname(__file__), "..", "configs", "base.py")
    config = apply_overrides(load_config(f"{config_path}:tiny"), spec["overrides"])
    result = train(config, workdir)
    evaluate_workdir(workdir, progress=False, model=result.model)
    report = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "step": result.step,
        "written": sorted(set(written)),
    }
    with open(spec["report"], "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
