"""Context-parallel evaluation of pattern models with a sliding window; used by
test_eval_windows.py.

Started in a fresh interpreter whose ``XLA_FLAGS`` force 8 host devices. For each encoder it
builds the battery's two-layer ``beside_itself`` pattern (the encoder with full attention, then
with a sliding window of ``--window`` keys) on the ``blocked`` path in tiles of 8 and scores the
same random stream in 32-token windows with :func:`posenc.kinds.stream.evaluate`, on one device
and on meshes whose ``context`` axis splits every window over 2 and 4 devices; it writes
``<out>``: per encoder and context size the loss and the loss by position, and whether the
scoring step's windows really were split over the context devices.
"""

from __future__ import annotations

import argparse
import json

import jax
import ml_collections
import numpy as np

from posenc import encodings, testing
from posenc.devices import sharding
from posenc.kinds.stream import evaluate
from posenc.testing import context, patterns

LENGTH, BLOCK = 32, 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--encodings", default="rope")
    parser.add_argument("--window", type=int, default=11)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    settings = testing.Settings(block_size=BLOCK)
    rng = np.random.default_rng(5)
    stream = rng.integers(0, settings.vocab_size, 4 * LENGTH + 1).astype(np.int32)
    report = {}
    for name in args.encodings.split(","):
        enc = testing.resolve(name)
        window = f"sliding:{args.window}"
        model = patterns.build_pattern(enc, settings, "beside_itself", "blocked", window)
        assert model.blocks[1].options.window == window  # the local layer has the window
        report[name] = {}
        for size in (1, 2, 4):
            fields = ml_collections.ConfigDict({"mesh": {"data": 1, "context": size}})
            mesh = sharding.make_mesh(fields, jax.devices()[:size])
            with context._window_shardings() as seen:
                (result,) = evaluate(model, stream, [LENGTH], batch_tokens=2 * LENGTH, mesh=mesh)
            report[name][str(size)] = {
                "loss": result["loss"],
                "loss_by_position": list(result["loss_by_position"]),
                "tokens": result["tokens"],
                "split": bool(seen) and all(context._split(s, w, size) for s, w in seen),
            }
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    assert encodings.names()
    main()
