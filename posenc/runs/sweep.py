"""Sweeps: many runs of one config, each in its own work directory, resumable as a whole.

A sweep config is a Python file with two functions::

    def get_config(variant):  # the base run config (an ml_collections.ConfigDict)
    def get_sweep(variant):   # a list of points, each a dict of dotted overrides

for example ``product(**{"encoding.name": ["alibi", "rope"], "seed": [0, 1]})``. Every point
runs in ``<sweep dir>/<point name>/``, named from its overrides (:func:`point_name`), with the
resolved config saved there by :func:`posenc.runs.train.train` (``config.json``). Running the sweep
again:

- skips finished points (``eval.json`` present and ``status.json`` saying ``done`` for exactly
  this config; a changed evaluation setting re-evaluates without retraining),
- resumes interrupted ones (``train`` continues from the last checkpoint in the directory),
- records failures (any exception: ``status.json`` with the traceback; with ``jobs > 1`` also a
  child killed by a signal) without stopping the other points.

Before any point runs, every point's resolved config is validated: ``--config.*`` overrides that
make a point invalid, or that name a field the points set themselves (the point's value would
win), are refused in one line. ``only`` (``posenc sweep --only encoding.name=alibi,rope``)
narrows a sweep to the points whose config has one of the listed values; the other points stay
in ``sweep.json`` (``skipped`` if finished, else ``unselected``), so a narrowed run and a full
one share a directory and a report.

``<sweep dir>/sweep.json`` lists the points, their directories and statuses; ``posenc report``
reads it. Each point directory also holds ``point.json`` (its overrides and resolved config: all
a process needs to run it) and ``status.json``.

With ``jobs > 1`` points run in separate processes (``python -m posenc.runs.sweep <point dir>``),
each logging to ``<point dir>/log.txt``; with ``jobs == 1`` they run in this process, one after the
other.

``compile_cache`` (``posenc sweep --compile-cache DIR``) gives the points JAX's persistent
compilation cache in ``DIR``: a point whose computations another point already compiled (the same
model and shapes: another seed, or an evaluation setting changed) loads the executables instead
of compiling them again. The cache is keyed by the computation, the compiler options and the JAX
version, so a hit runs exactly what a fresh compilation would have produced.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections

from posenc.runs.config import (
    apply_overrides,
    call_config_file,
    load_config,
    load_module,
    set_field,
    validate,
)
from posenc.workdir import (
    EVAL_FILE,
    LOG_FILE,
    POINT_FILE,
    STATUS_FILE,
    SWEEP_FILE,
    WorkdirBusyError,
    config_from_dict,
    config_sha256,
    flatten,
    hold,
    parse_value,
    read_json,
    settings_hash,
    settings_name,
    write_json,
)

# Statuses a point can have in sweep.json / the returned summary (unselected: left out by
# ``only`` and not finished).
STATUSES = ("pending", "running", "done", "skipped", "failed", "interrupted", "unselected")


def product(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """The cartesian product of sweep axes, as a list of override dicts.

    Dotted field names are passed with ``**``::

        product(**{"encoding.name": ["alibi", "rope"], "seed": [0, 1]})
        # [{"encoding.name": "alibi", "seed": 0}, {"encoding.name": "alibi", "seed": 1},
        #  {"encoding.name": "rope", "seed": 0}, {"encoding.name": "rope", "seed": 1}]

    The first axis varies slowest. A scalar (or string) is an axis of one value.
    """
    keys = list(axes)
    values = [
        [v] if isinstance(v, str | bytes) or not isinstance(v, Sequence) else list(v)
        for v in axes.values()
    ]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def point_name(overrides: Mapping[str, Any]) -> str:
    """A readable, file-system-safe directory name for a point, stable and unique.

    Keys are sorted, so the name does not depend on the order the overrides were written in::

        {"seed": 0, "encoding.name": "alibi"} -> "encoding.name-alibi__seed-0"

    Characters outside ``[A-Za-z0-9._+-]`` become ``_``; where that (or shortening a very long
    name) could make two points collide, a hash of the exact overrides is appended
    (:func:`posenc.workdir.settings_name`).
    """
    return settings_name(overrides)


def point_hash(overrides: Mapping[str, Any]) -> str:
    """sha256 of a point's overrides (key order and int/float/str distinctions included)."""
    return settings_hash(overrides)


def config_hash(config: ml_collections.ConfigDict) -> str:
    """sha256 of a resolved config (what :func:`is_finished` compares)."""
    return config_sha256(config)


def load_sweep(
    spec: str, overrides: Sequence[str] = ()
) -> tuple[list[dict[str, Any]], list[ml_collections.ConfigDict]]:
    """The points of a sweep config file and their resolved run configs.

    Args:
      spec: ``path/to/sweep.py[:variant]``; the file defines ``get_config`` and ``get_sweep``.
      overrides: ``"field=value"`` strings applied to every point (before the point's own).

    Returns:
      ``(points, configs)``: the override dicts of ``get_sweep`` and one config per point.

    Raises:
      ValueError: no ``get_sweep``, an empty or duplicated point list, or an override naming a
        field the config does not have or one the points set themselves.
    """
    path, _, variant = spec.partition(":")
    base = apply_overrides(load_config(spec), overrides)
    module = load_module(path)
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"--config: {path} has no get_sweep() function; is it a sweep config?")
    points = call_config_file(path, module.get_sweep, *((variant,) if variant else ()))
    points = [dict(p) for p in points]
    if not points:
        raise ValueError(f"{path}: get_sweep() returned no points")
    names = [point_name(p) for p in points]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: get_sweep() lists the same point twice: {duplicates}")
    _check_shadowed(points, overrides)
    return points, [_point_config(base, point) for point in points]


def _point_config(base: ml_collections.ConfigDict, point: Mapping[str, Any]):
    config = apply_overrides(base, [])  # a copy
    for key, value in point.items():
        set_field(config, key, value)
    return config


def _check_shadowed(points: Sequence[Mapping[str, Any]], overrides: Sequence[str]) -> None:
    """Refuses a ``--config.<field>`` that points set themselves (the point's value would win)."""
    for item in overrides:
        field = item.partition("=")[0].strip().removeprefix("--config.").removeprefix("config.")
        setting = [p for p in points if field in p]
        if setting:
            values = ", ".join(sorted({repr(p[field]) for p in setting}))
            raise ValueError(
                f"--config.{field}: {len(setting)} of the sweep's {len(points)} points set "
                f"{field} themselves ({values}), which would replace the override; narrow the "
                f"sweep with --only {field}=VALUE[,VALUE...] instead"
            )


def check_overrides(
    spec: str,
    points: Sequence[Mapping[str, Any]],
    configs: Sequence[ml_collections.ConfigDict],
    overrides: Sequence[str],
    selected: Sequence[bool] | None = None,
) -> None:
    """Validates every (selected) point once, before any runs: overrides that make a point
    invalid are refused here rather than failing each point's run. (A point invalid on its own,
    without the overrides, is left to fail in its run and be recorded, as any failure is.)

    Raises:
      ValueError: naming how many points the overrides break and the first one's error.
    """
    if not overrides:
        return
    selected = [True] * len(points) if selected is None else selected
    broken = []
    plain = None
    for point, config, chosen in zip(points, configs, selected, strict=True):
        if not chosen:
            continue
        try:
            validate(config)
        except ValueError as e:
            plain = plain or load_config(spec)
            try:
                validate(_point_config(plain, point))
            except ValueError:
                continue  # invalid without the overrides too
            broken.append((point_name(point), str(e)))
    if broken:
        name, error = broken[0]
        raise ValueError(
            f"the --config overrides make {len(broken)} of {sum(selected)} points invalid, e.g. "
            f"point {name}: {error}; nothing was run"
        )


def select_points(
    points: Sequence[Mapping[str, Any]],
    configs: Sequence[ml_collections.ConfigDict],
    only: Sequence[str],
) -> list[bool]:
    """Which points ``only`` keeps: each item ``field=value[,value...]`` keeps the points whose
    resolved config has one of the values at ``field`` (``seed=0,1``; ``10000`` matches
    ``10000.0``); several items must all hold.

    Raises:
      ValueError: a malformed item, a field no point has, or no point left (naming the values
        the sweep has).
    """
    keep = [True] * len(points)
    flat = [flatten(c.to_dict()) for c in configs]
    for item in only:
        field, sep, text = item.partition("=")
        field = field.strip()
        if not sep or not field or not text:
            raise ValueError(f"--only {item!r} is not of the form field=value[,value...]")
        if not any(field in f for f in flat):
            raise ValueError(
                f"--only {field}: no point's config has this field; the points set "
                f"{', '.join(sorted({k for p in points for k in p}))}"
            )
        wanted = [parse_value(v.strip()) for v in text.split(",")]
        for i, f in enumerate(flat):
            keep[i] = keep[i] and field in f and any(_same(f[field], w) for w in wanted)
        if not any(keep):
            values = sorted({repr(f[field]) for f in flat if field in f})
            raise ValueError(
                f"--only {item}: no point of the sweep is left; {field} takes "
                f"{', '.join(values)} in this sweep"
            )
    return keep


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(value, bool) or isinstance(wanted, bool):
        return value is wanted or str(value) == str(wanted)
    return value == wanted or str(value) == str(wanted)


def is_finished(point_dir: str, config: ml_collections.ConfigDict) -> bool:
    """Whether ``point_dir`` holds this exact config's training and evaluation."""
    status = read_json(os.path.join(point_dir, STATUS_FILE)) or {}
    return (
        os.path.exists(os.path.join(point_dir, EVAL_FILE))
        and status.get("status") == "done"
        and status.get("config_sha256") == config_hash(config)
    )


def run_point(point_dir: str) -> dict[str, Any]:
    """Trains (or resumes) and evaluates the point saved in ``<point_dir>/point.json``.

    Writes ``status.json`` (``running``, then ``done`` or ``failed`` with the traceback) and
    returns it; never raises for a failure of the run itself (``KeyboardInterrupt`` excepted).
    A point whose directory another process is using fails with that process named.
    """
    from posenc.runs.evaluate import evaluate_workdir
    from posenc.runs.train import train

    point = read_json(os.path.join(point_dir, POINT_FILE))
    config = config_from_dict(point["config"])
    status_path = os.path.join(point_dir, STATUS_FILE)
    start = time.perf_counter()
    status = {"status": "running", "overrides": point["overrides"], "started": time.time()}
    try:
        with hold(point_dir):  # before status.json: a busy point's status belongs to its holder
            write_json(status_path, status)
            try:
                result = train(config, point_dir)
                if result.step != config.train.steps:
                    raise RuntimeError(
                        f"training stopped at step {result.step} of {config.train.steps}"
                    )
                evaluate_workdir(point_dir, overrides=config, model=result.model, step=result.step)
                status.update(status="done", config_sha256=config_hash(config))
            except KeyboardInterrupt:
                status.update(status="interrupted", seconds=time.perf_counter() - start)
                write_json(status_path, status)
                raise
            status["seconds"] = time.perf_counter() - start
            write_json(status_path, status)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - any failure of one point is recorded
        status.update(status="failed", error=f"{type(e).__name__}: {e}")
        status["traceback"] = traceback.format_exc()
        status["seconds"] = time.perf_counter() - start
        if not isinstance(e, WorkdirBusyError):
            write_json(status_path, status)
    return status


def summarize_point(point_dir: str) -> dict[str, Any]:
    """Final train loss, perplexity at the training length and at the longest length (None for
    runs scored otherwise), and the checkpoint step that was scored; for a translation run,
    its BLEU within the training length (``bleu_train_len``, the ``<=1x`` bucket) and in the
    longest source-length bucket (``bleu_longest``, labelled ``longest_label``)."""
    from posenc.workdir.metrics import read_metrics

    out: dict[str, Any] = {"train_loss": None, "ppl_train_len": None, "ppl_longest": None}
    metrics = read_metrics(point_dir)
    if metrics:
        out["train_loss"] = metrics[-1]["loss"]
    report = read_json(os.path.join(point_dir, EVAL_FILE))
    if report:
        ok = [r for r in report["results"] if "error" not in r]
        at_train = [r for r in ok if r["length"] == report["train_seq_len"]]
        longest = max(r["length"] for r in report["results"])
        at_longest = [r for r in ok if r["length"] == longest]
        out["ppl_train_len"] = at_train[0].get("perplexity") if at_train else None
        out["ppl_longest"] = at_longest[0].get("perplexity") if at_longest else None
        out["longest"] = longest
        out["checkpoint_step"] = report.get("checkpoint_step")
        buckets = sorted((r for r in ok if "bleu" in r), key=lambda r: r["length"])
        if buckets:  # scored by BLEU per source-length bucket
            within = [r for r in buckets if r.get("label") == "<=1x"]
            out["bleu_train_len"] = within[0]["bleu"] if within else None
            out["bleu_longest"] = buckets[-1]["bleu"]
            out["longest_label"] = buckets[-1].get("label")
    return out


# JAX's settings (and environment variables) for the persistent compilation cache.
_CACHE_DIR = "jax_compilation_cache_dir"
_CACHE_MIN_SECONDS = "jax_persistent_cache_min_compile_time_secs"


def _child_env(jobs: int, compile_cache: str | None = None) -> dict[str, str]:
    """Environment of a point process when ``jobs`` run at once.

    On CPU, XLA's multi-threaded Eigen would have every job start a thread per core; with one
    thread each, ``jobs`` processes share the cores without oversubscription. On a GPU the
    flag only touches the host backend, and each process may take 1/jobs of the GPU memory.
    ``compile_cache``: the persistent compilation cache's directory (JAX reads its settings
    from the environment), every compilation cached however short.
    """
    env = dict(os.environ)
    if compile_cache is not None:
        env[_CACHE_DIR.upper()] = os.path.abspath(compile_cache)
        env[_CACHE_MIN_SECONDS.upper()] = "0"
    if jobs > 1:
        flags = env.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            env["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / jobs:.3f}")
    # A progress line in log.txt every 30 s rather than a carriage-return stream.
    env.setdefault("TQDM_MININTERVAL", "30")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@contextlib.contextmanager
def compilation_cache(path: str | None):
    """JAX's persistent compilation cache in ``path`` (every compilation cached) while the block
    runs in this process, JAX's previous settings after it; None changes nothing."""
    if path is None:
        yield
        return
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cc

    previous = {name: getattr(jax.config, name) for name in (_CACHE_DIR, _CACHE_MIN_SECONDS)}
    # JAX opens its cache once, at the first compilation: reset it so the new directory counts.
    jax.config.update(_CACHE_DIR, os.path.abspath(path))
    jax.config.update(_CACHE_MIN_SECONDS, 0.0)
    cc.reset_cache()
    try:
        yield
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)
        cc.reset_cache()


def run_sweep(
    config_spec: str,
    workdir: str,
    *,
    overrides: Sequence[str] = (),
    jobs: int = 1,
    verbose: bool = True,
    only: Sequence[str] = (),
    compile_cache: str | None = None,
) -> list[dict[str, Any]]:
    """Runs every point of a sweep config under ``workdir``.

    The sweep directory is locked while this runs (a second ``posenc sweep`` on it fails with
    the holder's name), and each point's directory while it trains.

    Args:
      config_spec: ``path/to/sweep.py[:variant]``.
      workdir: the sweep directory: ``sweep.json`` and one folder per point.
      overrides: ``"field=value"`` strings applied to every point.
      jobs: points run at a time; ``1`` runs them in this process, more in child processes
        (which end when this process ends, however it ends).
      verbose: print a line when a point starts and ends, and the summary table.
      only: ``"field=value[,value...]"`` items narrowing the sweep (:func:`select_points`).
      compile_cache: a directory for JAX's persistent compilation cache, shared by the points
        (and by later runs of the sweep); None: JAX's own setting (off unless configured).

    Returns:
      One dict per point, in sweep order: ``name``, ``dir``, ``overrides``, ``status`` (``done``:
      ran now; ``skipped``: finished before; ``failed``; ``interrupted``), ``seconds``,
      ``train_loss``, ``ppl_train_len``, ``ppl_longest``, and ``error`` for failures;
      ``unselected`` for points ``only`` left out.

    Raises:
      ValueError: a malformed sweep config (nothing is run).
      posenc.workdir.WorkdirBusyError: another process runs a sweep in ``workdir``.
      KeyboardInterrupt: after recording the interrupted points; run again to resume.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"--jobs must be an integer >= 1, got {jobs!r}")
    points, configs = load_sweep(config_spec, overrides)
    selected = select_points(points, configs, only)
    check_overrides(config_spec, points, configs, overrides, selected)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"sweep directory {workdir} is a file, not a directory")
    os.makedirs(workdir, exist_ok=True)
    with hold(workdir):
        entries = _prepare_points(workdir, points, configs, selected)
        header = {"config": config_spec, "overrides": list(overrides), "jobs": jobs}
        if only:
            header["only"] = list(only)
        if compile_cache is not None:
            header["compile_cache"] = os.path.abspath(compile_cache)

        def save():
            write_json(
                os.path.join(workdir, SWEEP_FILE),
                {**header, "updated": time.time(), "points": entries},
            )

        save()
        start = time.perf_counter()
        _run_points(config_spec, workdir, entries, save, jobs, verbose, compile_cache)
    if verbose:
        print(format_summary(entries, time.perf_counter() - start), flush=True)
    return entries


def plan_sweep(
    config_spec: str,
    workdir: str,
    *,
    overrides: Sequence[str] = (),
    only: Sequence[str] = (),
) -> str:
    """What :func:`run_sweep` would do, checked the same way but running and writing nothing:
    one line per point, ``run`` / ``finished`` / ``left out``, its directory and overrides."""
    points, configs = load_sweep(config_spec, overrides)
    selected = select_points(points, configs, only)
    check_overrides(config_spec, points, configs, overrides, selected)
    lines = []
    for point, config, chosen in zip(points, configs, selected, strict=True):
        name = point_name(point)
        if is_finished(os.path.join(workdir, name), config):
            what = "finished"
        else:
            what = "run" if chosen else "left out"
        text = ", ".join(f"{k}={v!r}" for k, v in point.items())
        lines.append(f"{what:<9} {name}  ({text})")
    todo = sum(line.startswith("run ") for line in lines)
    lines.append(f"{len(points)} points, {todo} to run in {workdir}")
    return "\n".join(lines)


def _run_points(
    config_spec, workdir, entries, save: Callable[[], None], jobs, verbose, compile_cache
) -> None:
    """Runs the pending points (in this process or in children), then summarises every point;
    on Ctrl-C records the points left as ``interrupted`` before re-raising."""
    todo = [e for e in entries if e["status"] == "pending"]
    if verbose:
        unselected = sum(e["status"] == "unselected" for e in entries)
        finished = len(entries) - len(todo) - unselected
        left_out = f"{unselected} left out by --only, " if unselected else ""
        print(
            f"sweep {config_spec}: {len(entries)} points, {finished} finished before, "
            f"{left_out}{len(todo)} to run with jobs={jobs} in {workdir}",
            flush=True,
        )
    try:
        if jobs == 1:
            with compilation_cache(compile_cache):
                _run_in_process(workdir, todo, save, verbose)
        else:
            _run_in_children(workdir, todo, save, verbose, jobs, compile_cache)
    except KeyboardInterrupt:
        for e in entries:
            if e["status"] in ("pending", "running"):
                e["status"] = "interrupted"
        save()
        raise
    _summarize(workdir, entries)
    save()


def _prepare_points(workdir, points, configs, selected) -> list[dict[str, Any]]:
    """One entry per point: ``skipped`` if finished, ``unselected`` if left out, else
    ``pending`` with its ``point.json`` (all a child process needs to run it) written."""
    entries = []
    for point, config, chosen in zip(points, configs, selected, strict=True):
        name = point_name(point)
        point_dir = os.path.join(workdir, name)
        entry = {"name": name, "dir": name, "overrides": point, "status": "pending"}
        if is_finished(point_dir, config):
            entry["status"] = "skipped"
        elif not chosen:
            entry["status"] = "unselected"
        else:
            os.makedirs(point_dir, exist_ok=True)
            write_json(
                os.path.join(point_dir, POINT_FILE),
                {"overrides": point, "config": config.to_dict()},
            )
        entries.append(entry)
    return entries


def _summarize(workdir: str, entries: list[dict[str, Any]]) -> None:
    """Adds each point's seconds, error and results (:func:`summarize_point`) to its entry."""
    for e in entries:
        point_dir = os.path.join(workdir, e["dir"])
        status = read_json(os.path.join(point_dir, STATUS_FILE)) or {}
        e.setdefault("seconds", status.get("seconds"))
        if e["status"] == "failed":
            e.setdefault("error", status.get("error", "no status.json written"))
        e.update(summarize_point(point_dir))


def _run_in_process(workdir, todo, save, verbose) -> None:
    for i, e in enumerate(todo):
        e["status"] = "running"
        save()
        if verbose:
            print(f"[{i + 1}/{len(todo)}] {e['name']}", flush=True)
        status = run_point(os.path.join(workdir, e["dir"]))
        e["status"] = status["status"]
        e["seconds"] = status["seconds"]
        if status["status"] == "failed":
            e["error"] = status["error"]
            if verbose:
                print(f"  failed: {status['error']}", flush=True)
        save()


def _start_child(workdir: str, e: dict[str, Any], env: dict[str, str]):
    point_dir = os.path.join(workdir, e["dir"])
    log = open(os.path.join(point_dir, LOG_FILE), "a")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "posenc.runs.sweep", point_dir, "--parent", str(os.getpid())],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return proc, log


def _child_result(workdir: str, e: dict[str, Any], returncode: int) -> None:
    """Records how a child ended: its own status, or a failure if it died without one."""
    status = read_json(os.path.join(workdir, e["dir"], STATUS_FILE)) or {}
    if returncode == 0 and status.get("status") in ("done", "failed"):
        e["status"] = status["status"]
        if e["status"] == "failed":
            e["error"] = status.get("error")
    else:  # killed (signal, out of memory) before it could record anything
        e["status"] = "failed"
        e["error"] = f"process exited with code {returncode}"
        write_json(
            os.path.join(workdir, e["dir"], STATUS_FILE),
            {**status, "status": "failed", "error": e["error"]},
        )


def _run_in_children(workdir, todo, save, verbose, jobs, compile_cache) -> None:
    env = _child_env(jobs, compile_cache)
    queue, running = list(todo), {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                e = queue.pop(0)
                proc, log = _start_child(workdir, e, env)
                running[proc] = (e, log, time.perf_counter())
                e["status"] = "running"
                save()
                if verbose:
                    log_path = os.path.join(workdir, e["dir"], LOG_FILE)
                    print(f"started {e['name']} (log: {log_path})", flush=True)
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                e, log, started = running.pop(proc)
                log.close()
                e["seconds"] = time.perf_counter() - started
                _child_result(workdir, e, proc.returncode)
                save()
                if verbose:
                    print(f"{e['status']:>6} {e['name']} ({e['seconds']:.0f}s)", flush=True)
                    if e["status"] == "failed":
                        print(f"  {e['error']}", flush=True)
    finally:
        for proc, (_, log, _) in running.items():
            proc.terminate()
            proc.wait()
            log.close()


def _fmt(x: float | None, digits: int) -> str:
    """A number with ``digits`` decimals; ``inf``/``nan`` as such; ``—`` for none."""
    if x is None:
        return "—"
    return f"{x:.{digits}f}" if math.isfinite(x) else str(x)


def format_summary(entries: Sequence[Mapping[str, Any]], seconds: float | None = None) -> str:
    """One line per point: status, final train loss, perplexity at the train and longest
    lengths, seconds. With translation points among them the two score columns say what each
    point is scored by: ``BLEU`` within the training length and in the longest source-length
    bucket for those, ``ppl`` for the others (not ``—`` under a perplexity header)."""
    width = max([len(e["name"]) for e in entries] + [5])
    bleu = any(_scored_by_bleu(e) for e in entries)
    at_train, at_longest = ("at train", "at longest") if bleu else ("ppl@train", "ppl@longest")
    columns = (14, 22) if bleu else (10, 12)
    lines = [
        f"{'status':<11} {'point':<{width}} {'train loss':>10} {at_train:>{columns[0]}} "
        f"{at_longest:>{columns[1]}} {'seconds':>8}"
    ]
    for e in entries:
        if _scored_by_bleu(e):
            train = f"BLEU {_fmt(e.get('bleu_train_len'), 2)}"
            longest = f"BLEU {_fmt(e.get('bleu_longest'), 2)} @{e.get('longest_label')}"
        else:
            train = _fmt(e.get("ppl_train_len"), 2)
            longest = f"{_fmt(e.get('ppl_longest'), 2)}"
            if e.get("longest"):
                longest += f" @{e['longest']}"
            if bleu:
                train, longest = f"ppl {train}", f"ppl {longest}"
        lines.append(
            f"{e['status']:<11} {e['name']:<{width}} {_fmt(e.get('train_loss'), 4):>10} "
            f"{train:>{columns[0]}} {longest:>{columns[1]}} "
            f"{_fmt(e.get('seconds'), 0):>8}"
        )
        if e.get("error"):
            lines.append(f"{'':<11} error: {e['error'].splitlines()[0][:200]}")
    if seconds is not None:
        counts = {s: sum(e["status"] == s for e in entries) for s in STATUSES}
        text = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        lines.append(f"{text}; {seconds:.0f}s")
    return "\n".join(lines)


def _scored_by_bleu(entry: Mapping[str, Any]) -> bool:
    """Whether a summary entry is scored by BLEU per source-length bucket (a translation
    point's, :func:`summarize_point`), not by perplexity."""
    return entry.get("bleu_longest") is not None or entry.get("bleu_train_len") is not None


def _watch_parent(parent: int) -> None:
    """Ends this process when ``parent`` is no longer its parent (the sweep died).

    On Linux the kernel sends SIGKILL when the parent dies (``PR_SET_PDEATHSIG``); set here,
    in the child itself, then the parent is checked, so a parent that died before this ran is
    caught too. A watcher thread covers other systems. Every file a point writes is written
    atomically, so a point killed at any moment resumes from its last checkpoint.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="posenc-parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m posenc.runs.sweep <point dir> [--parent PID]``: runs one prepared point (used by
    ``jobs > 1``); with ``--parent`` the process ends if that process dies."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 3 and argv[1] == "--parent" and argv[2].isdigit():
        _watch_parent(int(argv[2]))
        argv = argv[:1]
    if len(argv) != 1:
        print("usage: python -m posenc.runs.sweep <point dir> [--parent PID]", file=sys.stderr)
        return 2
    status = run_point(argv[0])
    if status["status"] == "failed":
        print(status.get("traceback", status["error"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
