"""The 2024-2026 positional encodings past the training length (issue 33): every new encoder
beside RoPE, NoPE, ALiBi and FIRE, two seeds, with RoPE under YaRN (and STRING, where
registered) at evaluation and DroPE (RoPE continued without positions) as rows of the same
table; then passkey retrieval of the same encoders at the same multiples of their length.

1. Perplexity at 1-16 x the training length: the sweep ``configs/sweeps/recent_encoders.py``,
   the RoPE runs scored under YaRN (``eval-<settings>.json`` beside their ``eval.json``), each
   RoPE run continued with DroPE (``posenc.studies.drope``, in
   ``<workdir>/drope-<n>steps-s<seed>``), and the table of all of them,
   ``<workdir>/table/report.md`` (``<workdir>/report.md`` is the sweep's own report, with RoPE
   under YaRN but without the DroPE column).
2. Passkey retrieval at 1-16 x: the sweep ``configs/sweeps/recent_encoders_passkey.py`` (each
   encoder trained on ``synthetic:passkey``), ``posenc retrieval`` on each run, on its RoPE runs
   under YaRN and on their DroPE continuations, and the report of ``<workdir>/passkey``.

::

    python experiments/recent_encoders.py --variant tiny     # 2-core CPU
    python experiments/recent_encoders.py --variant gpu      # one GPU

An encoder of the issue that this installation does not register is left out with a note.
Running it again skips what is finished. Extra ``--config.<field>=<value>`` arguments apply to
every point of both sweeps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from posenc import encodings
from posenc.cli import _split_overrides
from posenc.report import Column, find_runs, group_runs, write_report
from posenc.retrieval.rundir import retrieval_workdir
from posenc.runs.config import apply_overrides, load_module
from posenc.runs.sweep import run_sweep
from posenc.studies import drope
from posenc.studies.rope_extension import evaluated, scaling_overrides
from posenc.workdir import RunDir

CONFIGS = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "sweeps")
)
RECENT = load_module(os.path.join(CONFIGS, "recent_encoders.py"))
PASSKEY = load_module(os.path.join(CONFIGS, "recent_encoders_passkey.py"))


# STRING (An et al. 2024) is an evaluation setting of RoPE (posenc.encodings.rope's string_shift
# S and string_window W): the paper shifts by S ~ L/3 of the training length L with a window of
# W = 128 at L = 128k; at these lengths W = L/8 keeps W < S (a window of 128 would exceed S).
def string_overrides(seq_len: int) -> tuple[str, ...]:
    """The overrides that turn STRING on for a run trained at ``seq_len`` tokens."""
    return (
        f"encoding.hparams.string_shift={seq_len // 3}",
        f"encoding.hparams.string_window={seq_len // 8}",
    )


def rope_points(points: list[dict], workdir: str) -> list[str]:
    """The directories of the finished plain-RoPE points of a sweep, in seed order."""
    return [
        os.path.join(workdir, p["dir"])
        for p in points
        if p["overrides"].get("encoding.name") == "rope" and p["status"] in ("done", "skipped")
    ]


def string_settings(seq_len: int) -> list[str] | None:
    """:func:`string_overrides` if RoPE takes every field they set, else None (noted)."""
    settings = string_overrides(seq_len)
    fields = [o.partition("=")[0].removeprefix("encoding.hparams.") for o in settings]
    missing = [f for f in fields if f not in encodings.hparam_names("rope")]
    if missing:
        print(f"note: STRING left out: rope has no hyperparameter {missing} in this installation")
        return None
    return list(settings)


def perplexity(variant: str, workdir: str, overrides, jobs: int, cache: str | None, plan):
    """Step 1 (module docstring); returns the paths written."""
    spec = os.path.join(CONFIGS, "recent_encoders.py")
    points = run_sweep(
        f"{spec}:{variant}", workdir, overrides=overrides, jobs=jobs, compile_cache=cache
    )
    drope_runs, factor = [], None
    for rope_dir in rope_points(points, workdir):
        scaled = drope.yarn_evaluated(rope_dir, plan.yarn_factor)
        factor = scaled["changes"]["encoding.hparams.factor"]
        source = RunDir(rope_dir).read_config()
        string = string_settings(source.train.seq_len)
        if string is not None:
            evaluated(rope_dir, apply_overrides(source, string), True)
        name = drope.drope_dir_name(plan, source.train.steps, source.seed)
        drope_dir = os.path.join(workdir, name)
        drope.recalibrate(rope_dir, drope_dir, plan)
        drope_runs += find_runs(drope_dir)
    paths = write_report(workdir)  # the sweep's own report, then the table with DroPE beside it
    ((train_len, columns),) = group_runs(find_runs(workdir)).items()
    if drope_runs:
        steps = drope_runs[0].eval.get("train_steps")
        columns.append(Column(f"DroPE ({steps} steps from rope)", drope_runs))
    notes = []
    if drope_runs:
        rope_steps = RunDir(rope_points(points, workdir)[0]).read_config().train.steps
        notes.append(drope.recipe_note(plan, rope_steps, factor))
    title = "The 2024-2026 encoders, RoPE under YaRN and DroPE"
    table = os.path.join(workdir, "table")
    os.makedirs(table, exist_ok=True)
    return drope.write_report(table, columns, train_len, title, notes) + paths


def passkey(variant: str, workdir: str, overrides, jobs: int, cache: str | None, plan):
    """Step 2 (module docstring); returns the report's paths."""
    spec = os.path.join(CONFIGS, "recent_encoders_passkey.py")
    scoring = PASSKEY.SCORING[variant]
    points = run_sweep(
        f"{spec}:{variant}", workdir, overrides=overrides, jobs=jobs, compile_cache=cache
    )
    dirs = [os.path.join(workdir, p["dir"]) for p in points if p["status"] in ("done", "skipped")]
    for rope_dir in rope_points(points, workdir):
        source = RunDir(rope_dir).read_config()
        name = drope.drope_dir_name(plan, source.train.steps, source.seed)
        drope_dir = os.path.join(workdir, name)
        drope.recalibrate(rope_dir, drope_dir, plan)
        dirs.append(drope_dir)
    factor = plan.yarn_factor or max(RECENT.MULTIPLES)
    for run_dir in dirs:
        config = RunDir(run_dir).read_config()
        settings = [()]
        if config.encoding.name == "rope" and not config.train.get("drop_positions"):
            settings.append(tuple(scaling_overrides("yarn", factor, config.train.seq_len)))
        for extra in settings:
            start = time.perf_counter()
            record = retrieval_workdir(
                run_dir,
                tasks=("passkey",),
                lengths=PASSKEY.LENGTHS,
                overrides=extra,
                progress=True,
                **scoring,
            )
            took = time.perf_counter() - start
            name = os.path.basename(run_dir) + (" (yarn)" if extra else "")
            print(f"{name}: effective length {record['effective_length']} ({took:.0f}s)")
    return write_report(workdir, metric="exact_match")


def main(argv: list[str] | None = None) -> int:
    rest, overrides = _split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=RECENT.VARIANTS, default="tiny")
    parser.add_argument("--workdir", help="output directory (default runs/recent_encoders_<v>)")
    parser.add_argument("--jobs", type=int, help="points at a time (default 2 tiny, 1 gpu)")
    parser.add_argument(
        "--skip-passkey", action="store_true", help="the perplexity table only (step 1)"
    )
    parser.add_argument(
        "--drope-fraction",
        type=float,
        default=drope.Plan.fraction,
        help="DroPE's recalibration steps as a fraction of the RoPE run's (default 0.02)",
    )
    args = parser.parse_args(rest)
    _, missing = RECENT.available()
    if missing:
        print(f"note: not registered here, left out: {', '.join(missing)}")
    workdir = args.workdir or os.path.join("runs", f"recent_encoders_{args.variant}")
    jobs = args.jobs or (2 if args.variant == "tiny" else 1)
    cache = os.path.join(workdir, "compile_cache")
    plan = drope.Plan(fraction=args.drope_fraction)
    start = time.perf_counter()
    paths = perplexity(args.variant, workdir, overrides, jobs, cache, plan)
    print(f"perplexity table: {time.perf_counter() - start:.0f}s")
    if not args.skip_passkey:
        passkey_dir = os.path.join(workdir, "passkey")
        paths += passkey(args.variant, passkey_dir, overrides, jobs, cache, plan)
    for path in paths:
        if path.endswith("report.md"):
            with open(path) as f:
                print(f.read())
            break
    print("\n".join(f"wrote {p}" for p in paths))
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
