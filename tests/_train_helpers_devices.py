"""Runs a tiny training + evaluation on ``--devices`` CPU devices; used by test_train.py.

Started by :func:`_train_helpers.run_device_script` in a fresh interpreter whose ``XLA_FLAGS``
force that many host devices (the flag only takes effect before JAX initialises). Writes
``<out>.json`` (device count, the batch-divisibility error, evaluation results) and
``<out>.npz`` (final parameters) for the test to compare across device counts.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import _train_helpers as helpers
import jax
import numpy as np

from posenc.devices.distributed import make_mesh
from posenc.kinds.stream import evaluate
from posenc.runs.train import train

# Global batch 16: two rows per device on 8 devices.
RUN_OVERRIDES = (
    "train.batch_size=16",
    "train.steps=12",
    "train.log_every=1",
    "train.checkpoint_every=6",
    "optim.warmup_steps=3",
)
EVAL_LENGTHS = (16, 48)
# 80 tokens per batch: 5 windows of 16 (rounded up to 8 on 8 devices: 3 padding rows) and
# 1 window of 48 (rounded up to 8: 7 padding rows).
EVAL_BATCH_TOKENS = 80
EVAL_MAX_TOKENS = 48 * 7


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    report: dict = {"device_count": jax.device_count(), "mesh_size": int(make_mesh().devices.size)}
    if jax.device_count() != args.devices:
        raise SystemExit(f"expected {args.devices} devices, JAX has {jax.device_count()}")

    if args.devices > 1:
        # A global batch the devices cannot share: refused before anything is compiled.
        bad_dir = os.path.join(args.workdir + "_bad")
        config = helpers.tiny_config(args.data_dir, f"train.batch_size={args.devices + 4}")
        start = time.perf_counter()
        try:
            train(config, bad_dir)
            report["batch_error"] = None
        except ValueError as e:
            report["batch_error"] = str(e)
        report["batch_error_seconds"] = time.perf_counter() - start
        report["batch_error_workdir_exists"] = os.path.exists(bad_dir)

    config = helpers.tiny_config(args.data_dir, *RUN_OVERRIDES)
    result = train(config, args.workdir)
    report["step"] = result.step
    np.savez(args.out + ".npz", **helpers.param_leaves(result.model))

    stream = helpers.stream(args.data_dir, "validation")
    report["eval"] = evaluate(
        result.model,
        stream,
        EVAL_LENGTHS,
        batch_tokens=EVAL_BATCH_TOKENS,
        max_tokens=EVAL_MAX_TOKENS,
    )
    with open(args.out + ".json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
