"""A run's checkpoints: orbax steps, verified before they are restored.

Each step is an orbax ``CheckpointManager`` step under ``<workdir>/checkpoints/<step>/`` with two
items, ``params`` (the model's parameters) and ``train_state`` (optimizer state and step), so
evaluation restores the parameters alone. (Steps written by posenc 0.1, one ``state`` item
holding both, are still restored.) After orbax finishes writing a step, process 0
records the size and sha256 of every file in it (``posenc_sha256.json`` inside the step).
Orbax has no content verification of its own: a truncated file fails deep inside TensorStore,
and flipped bytes load silently.

Before a step is restored its files are checked against the record. A step that fails (or that
orbax cannot read) is reported in one line (a :class:`CheckpointWarning`) and the next older
step is tried; training moves failed steps aside to ``<workdir>/corrupt_checkpoints/`` (nothing
is deleted) so that it can save that step again. When no step is intact a
:class:`CheckpointError` says so. A step without a record (interrupted between orbax's commit
and the record, or written by an older posenc) is restored unverified, still falling back if
orbax fails.

A save that fails (a full disk) raises one line, :class:`CheckpointSaveError`, saying why and
which step is the last good one; the steps saved before it are untouched, and the unfinished
step is removed when training opens the directory again.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import time
import warnings
from typing import Any

from posenc.workdir.files import CORRUPT_DIR, WorkdirError, read_json, write_json

CHECKSUM_FILE = "posenc_sha256.json"
_CHUNK = 1 << 20


class CheckpointError(WorkdirError):
    """No checkpoint of a run can be restored."""


class CheckpointSaveError(WorkdirError):
    """Saving a step failed (a full disk, say); the steps saved before it are intact."""


class CheckpointWarning(UserWarning):
    """A checkpoint failed verification and an older one is used instead."""


def _files(root: str) -> list[str]:
    out = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        rel = os.path.relpath(folder, root)
        for name in names:
            out.append(name if rel == "." else os.path.join(rel, name).replace(os.sep, "/"))
    return sorted(p for p in out if p != CHECKSUM_FILE)


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def record_checksums(step_dir: str) -> None:
    """Writes the size and sha256 of every file of a finished step into the step."""
    files = {}
    for rel in _files(step_dir):
        path = os.path.join(step_dir, rel)
        files[rel] = {"bytes": os.path.getsize(path), "sha256": _sha256(path)}
    write_json(os.path.join(step_dir, CHECKSUM_FILE), {"files": files})


def verify(step_dir: str) -> str | None:
    """Checks a step against its record.

    Returns:
      None if every recorded file is present with its size and hash (or there is no record:
      see the module docstring), else a short description of the first problem.
    """
    record = read_json(os.path.join(step_dir, CHECKSUM_FILE))
    if record is None:
        return None
    for rel, expected in sorted(record["files"].items()):
        path = os.path.join(step_dir, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing"
        size = os.path.getsize(path)
        if size != expected["bytes"]:
            return f"{rel} has {size} bytes, {expected['bytes']} were written"
        if _sha256(path) != expected["sha256"]:
            return f"{rel} does not match its sha256 (the bytes changed after saving)"
    return None


class Checkpoints:
    """The checkpoints of one work directory.

    Args:
      directory: ``<workdir>/checkpoints``.
      keep: steps to keep (older ones are deleted by orbax); None keeps all.
      writer: this process saves (created if missing); False opens an existing directory to
        restore from (nothing is written).
      primary: this process writes the checksum records and moves failed steps aside (process
        0 of a multi-process run).
    """

    def __init__(
        self,
        directory: str,
        *,
        keep: int | None = None,
        writer: bool = True,
        primary: bool = True,
    ):
        import orbax.checkpoint as ocp

        self.directory = os.path.abspath(directory)
        self.primary = primary
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=writer,
            enable_async_checkpointing=False,
            # A step whose save was cut off (a full disk, kill -9) is removed when training
            # opens the directory again, giving its space back.
            cleanup_tmp_directories=writer,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        _keep_orbax_thread_errors_off_the_console()

    def steps(self) -> list[int]:
        """The saved steps, oldest first."""
        return sorted(self._manager.all_steps())

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def save(self, step: int, params: Any, train_state: Any) -> None:
        """Saves a step (blocking) and records its checksums.

        Raises:
          CheckpointSaveError: the save failed (one line: why, and which step is the last good
            one; orbax's log of its threads' failures is kept off the console).
        """
        import orbax.checkpoint as ocp

        saved = self.steps()
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(params),
                    train_state=ocp.args.StandardSave(train_state),
                ),
            )
            self._manager.wait_until_finished()
            if self.primary:
                record_checksums(self.step_dir(step))
        except Exception as e:  # noqa: BLE001 - whatever failed, the older steps are intact
            raise CheckpointSaveError(_save_failed(self.directory, step, saved, e)) from e

    def restore_latest(
        self,
        abstract_params: Any,
        abstract_train_state: Any | None = None,
        *,
        set_aside: bool = False,
    ) -> tuple[int, Any, Any] | None:
        """The newest intact step: ``(step, params, train_state or None)``; None if no steps.

        Args:
          abstract_params: the parameter tree of ``jax.ShapeDtypeStruct`` (with shardings).
          abstract_train_state: the same for the optimizer state; None restores parameters
            only.
          set_aside: move steps that fail to ``corrupt_checkpoints/`` (training does, so it can
            save those steps again; evaluation leaves the directory as it is).

        Raises:
          CheckpointError: there are steps but none is intact.
        """
        steps = self.steps()
        failed = []
        for step in reversed(steps):
            problem = verify(self.step_dir(step))
            if problem is None:
                try:
                    return (step, *self._restore(step, abstract_params, abstract_train_state))
                except Exception as e:  # noqa: BLE001 - any unreadable checkpoint falls back
                    problem = f"orbax cannot read it ({type(e).__name__}: {_first_line(e)})"
            failed.append(f"step {step}: {problem}")
            fallback = next((s for s in reversed(steps) if s < step), None)
            then = f"using step {fallback}" if fallback is not None else "no older step"
            if set_aside and self.primary:
                moved = self._set_aside(step)
                then += f"; moved it to {moved}"
            warnings.warn(
                f"checkpoint step {step} in {self.directory} is damaged ({problem}); {then}",
                CheckpointWarning,
                stacklevel=2,
            )
        if not steps:
            return None
        raise CheckpointError(
            f"no intact checkpoint in {self.directory} ({'; '.join(failed)}); delete the work "
            "directory's checkpoints to train again from the start"
        )

    def _restore(self, step: int, abstract_params: Any, abstract_train_state: Any | None):
        import orbax.checkpoint as ocp

        if _is_legacy(self.step_dir(step)):
            return self._restore_legacy(step, abstract_params, abstract_train_state)
        items = {"params": ocp.args.StandardRestore(abstract_params)}
        if abstract_train_state is not None:
            items["train_state"] = ocp.args.StandardRestore(abstract_train_state)
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        return restored["params"], restored.get("train_state")

    def _restore_legacy(self, step: int, abstract_params: Any, abstract_train_state: Any | None):
        """posenc 0.1 saved one item, ``state = {params, opt_state, step}``."""
        import orbax.checkpoint as ocp

        target = {"params": abstract_params, **(abstract_train_state or {})}
        args = ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=abstract_train_state is None,
        )
        state = self._manager.restore(step, args=ocp.args.Composite(state=args))["state"]
        params = state.pop("params")
        return params, (state if abstract_train_state is not None else None)

    def _set_aside(self, step: int) -> str:
        target = os.path.join(
            os.path.dirname(self.directory), CORRUPT_DIR, f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(self.step_dir(step), target)
        self._manager.reload()
        return target

    def close(self) -> None:
        self._manager.close()


def _orbax_thread_error(record: logging.LogRecord) -> bool:
    """Whether a log record is orbax reporting that one of its writer threads raised: with
    synchronous saves that exception reaches :meth:`Checkpoints.save`, which raises it as one
    line, so the record (hundreds of lines of asyncio tracebacks) would only repeat it."""
    return "orbax" in record.pathname and "raised an exception" in record.getMessage()


def _keep_orbax_thread_errors_off_the_console() -> None:
    logger = logging.getLogger("absl")  # orbax logs through absl's logger
    if _ORBAX_FILTER not in logger.filters:
        logger.addFilter(_ORBAX_FILTER)


_ORBAX_FILTER = logging.Filter()
_ORBAX_FILTER.filter = lambda record: not _orbax_thread_error(record)


def _save_failed(directory: str, step: int, saved: list[int], error: BaseException) -> str:
    """The one line of a failed save: why, what is intact, and what to do."""
    code = _os_error_code(error)
    why = os.strerror(code) if code else f"{type(error).__name__}: {_first_line(error)}"
    fix = "free some space" if code in (errno.ENOSPC, errno.EDQUOT) else "fix that"
    if saved:
        then = (
            f"the last good checkpoint, step {saved[-1]}, is intact: {fix} and run the same "
            "command again to resume from it"
        )
    else:
        then = f"no earlier step was saved: {fix} and run the same command again to start over"
    return f"saving checkpoint step {step} in {directory} failed: {why}; {then}"


def _os_error_code(error: BaseException) -> int | None:
    """The operating system's error number behind a failure, if any: an ``OSError`` among the
    exception and its causes, or TensorStore's ``[os_error_code='28']`` in a message."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:
            return error.errno
        match = re.search(r"os_error_code='(\d+)'", str(error))
        if match:
            return int(match.group(1))
        error = error.__cause__ or error.__context__
    return None


def _is_legacy(step_dir: str) -> bool:
    return os.path.isdir(os.path.join(step_dir, "state")) and not os.path.isdir(
        os.path.join(step_dir, "params")
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""
