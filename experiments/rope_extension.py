"""Extending RoPE's context: zero-shot PI, NTK, dynamic NTK and YaRN, and PI and YaRN fine-tuned
(the shape of YaRN's and position interpolation's comparisons).

    python experiments/rope_extension.py --variant tiny      # 2-core CPU, a few minutes
    python experiments/rope_extension.py --variant gpu       # one GPU

Trains RoPE at L (``configs/rope_extension.py``), scores it at 1-16 x L under each scaling, fine-
tunes PI and YaRN at 4 x L, and writes ``report.md``, ``report.csv`` and a plot to ``--workdir``
(default ``runs/rope_extension_<variant>``). Run again to resume; finished steps are skipped.
``--config.<field>=<value>`` overrides apply to the base run.
"""

import argparse
import os
import sys
import time

from posenc.cli import _split_overrides
from posenc.runs.config import apply_overrides, load_module
from posenc.studies import rope_extension as extension

CONFIG = os.path.normpath(
    os.path.join(
        os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "rope_extension.py"
    )
)


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "gpu"), default="tiny")
    parser.add_argument("--workdir", help="experiment directory")
    args = parser.parse_args(rest)
    module = load_module(CONFIG)
    config = apply_overrides(module.get_config(args.variant), overrides)
    plan = extension.Plan(**module.get_plan(args.variant))
    workdir = args.workdir or os.path.join("runs", f"rope_extension_{args.variant}")
    start = time.perf_counter()
    paths = extension.run(config, workdir, plan)
    with open(paths[0]) as f:
        print(f.read())
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
