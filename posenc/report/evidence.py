"""What each table entry rests on, and the flags a reader needs before trusting a comparison.

- **Runs per column**: a table's first row, ``n``, counts the runs (seeds) in each column; an
  entry with fewer (a seed not evaluated at that length) says ``(n=k)``.
- **Unconverged runs** (:func:`still_falling`): a run whose training loss was still falling at
  its last step, by a stated rule: the mean logged training loss over the last
  :data:`WINDOW` (10 %) of its steps (at least one logging interval, ``train.log_every``) is
  more than :data:`THRESHOLD` (1 %) below the mean over as many steps before. Its column's
  ``n`` gets ``‡`` and a note names the run and the drop: a longer run could change the
  comparison.
- **Few windows**: a length at which a run scored fewer than
  :data:`posenc.data.summary.MIN_WINDOWS` windows' worth of tokens (a few passages of text).
- **Tokens left unscored by** ``eval.max_tokens``: evaluation scores at most that many tokens per
  length; the rest of the split is counted (``unscored_by_max_tokens``), not hidden.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from posenc.data.summary import MIN_WINDOWS
from posenc.report.runs import Column, Run, cell, table_lengths
from posenc.workdir import METRICS_FILE, read_jsonl

# The rule for "still falling": compare the last WINDOW of the steps with the WINDOW before.
WINDOW = 0.10
THRESHOLD = 0.01
RULE = (
    f"mean training loss over the last {WINDOW:.0%} of the steps (at least one logging "
    f"interval) more than {THRESHOLD:.0%} below its mean over as many steps before"
)
ERROR_BARS = (
    "Error bars: ± one sample standard deviation over the runs (seeds) of each line, n in the "
    "legend; a line without bars is one run."
)
MARK = "‡"


def loss_drop(run_dir: str) -> float | None:
    """The relative fall of the logged training loss at the end of a run (see the module
    docstring): ``(before - last) / before``; None when the log cannot tell (no metrics, or no
    logged step in one of the two windows)."""
    lines = [x for x in read_jsonl(os.path.join(run_dir, METRICS_FILE)) if "loss" in x]
    if not lines:
        return None
    steps = sorted({int(x["step"]) for x in lines})
    last_step = steps[-1]
    # At least one logging interval, so that each window holds a logged step.
    interval = max((b - a for a, b in zip(steps, steps[1:], strict=False)), default=1)
    width = max(1, round(WINDOW * last_step), interval)
    last = [x["loss"] for x in lines if last_step - width < x["step"] <= last_step]
    before = [x["loss"] for x in lines if last_step - 2 * width < x["step"] <= last_step - width]
    if not last or not before:
        return None
    a, b = math.fsum(before) / len(before), math.fsum(last) / len(last)
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 0:
        return None
    return (a - b) / a


def still_falling(run: Run) -> float | None:
    """The run's end-of-training fall if it exceeds :data:`THRESHOLD` (a finished run only;
    an unfinished one is marked ``†`` already), else None."""
    if not run.finished:
        return None
    drop = loss_drop(os.path.abspath(run.dir))
    return drop if drop is not None and drop > THRESHOLD else None


def runs_row(columns: Sequence[Column]) -> list[str]:
    """The ``n`` row of a table: runs per column, ``‡`` where one was still falling."""
    return ["n"] + [
        f"{len(c.runs)}{MARK if any(still_falling(r) for r in c.runs) else ''}" for c in columns
    ]


def unconverged_notes(columns: Sequence[Column], sweep_dir: str) -> list[str]:
    """One line naming the runs (each once, whichever columns evaluate it) still learning at
    their last step, with the fall, and the rule."""
    falling: dict[str, float] = {}
    for column in columns:
        for run in column.runs:
            drop = still_falling(run)
            if drop is not None:
                falling[os.path.relpath(run.dir, sweep_dir)] = drop
    if not falling:
        return []
    which = ", ".join(f"`{d}` (-{100 * drop:.1f} %)" for d, drop in falling.items())
    return [
        f"{MARK} {len(falling)} run{'s' if len(falling) > 1 else ''} still learning at the last "
        f"step ({RULE}): {which}. Train longer before comparing."
    ]


def few_window_notes(columns: Sequence[Column]) -> list[str]:
    """A line naming the lengths at which some run scored fewer than ``MIN_WINDOWS`` windows'
    worth of tokens."""
    thin = {}
    for length in table_lengths(columns):
        counts = [
            r["tokens"] // length
            for c in columns
            for run in c.runs
            if (r := run.result(length)) is not None and "error" not in r and r.get("tokens")
        ]
        if counts and min(counts) < MIN_WINDOWS:
            thin[length] = min(counts)
    if not thin:
        return []
    where = ", ".join(f"{n} at L_valid = {length}" for length, n in thin.items())
    return [
        f"Few windows: the fewest windows' worth of tokens scored by a run were {where} (fewer "
        f"than {MIN_WINDOWS}): those rows rest on a few passages of text; evaluate on a larger "
        "split (or raise eval.max_tokens) before comparing there."
    ]


def entry_runs(column: Column, length: int, metric: str) -> str:
    """`` (n=k)`` when an entry rests on fewer runs than its column, else ``""``."""
    entry = cell(column, length, metric)
    if entry is None or entry.error or entry.n >= len(column.runs):
        return ""
    return f" (n={entry.n})"


def max_tokens_note(runs: Sequence[Run]) -> str | None:
    """What ``eval.max_tokens`` left unscored, if anything."""
    capped = [
        r.get("unscored_by_max_tokens", 0)
        for run in runs
        for r in run.eval["results"]
        if "error" not in r
    ]
    if not capped or max(capped) == 0:
        return None
    caps = sorted({run.identity.get("eval.max_tokens") for run in runs} - {None, 0})
    cap = " = " + "/".join(f"{c:,}" for c in caps) if caps else ""
    return (
        f"eval.max_tokens{cap} caps the tokens scored per length: up to {max(capped):,} "
        "tokens of the split are left unscored at a length (unscored_by_max_tokens in "
        "eval.json; eval.max_tokens=0 scores them all)"
    )
