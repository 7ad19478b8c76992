"""One process at a time in a work directory: an advisory lock that names its holder.

``posenc train``, ``posenc eval`` and ``posenc sweep`` hold ``<dir>/posenc.lock`` (``flock``)
for as long as they use a directory; a second process gets a one-line
:class:`WorkdirBusyError` naming the holder (pid, host, command, start time), which the lock
file records. The operating system releases the lock when its process ends however it ends
(``kill -9`` included), so the lock of a process that died is simply taken over by the next
one. On a file system without ``flock`` support (some network mounts) the recorded pid is
checked instead: a holder on this host that no longer runs is taken over; one on another host
is assumed alive, and the message says which file to delete if it is not.

The lock is reentrant within a process: a sweep that runs a point in-process, or ``train``
evaluating when it finishes, holds it once.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from posenc.workdir.files import LOCK_FILE, WorkdirError


class WorkdirBusyError(WorkdirError):
    """Another process holds the work directory's lock."""


# realpath of a locked directory -> [file descriptor, depth]
_HELD: dict[str, list[int]] = {}


def describe_holder(info: Mapping[str, Any]) -> str:
    """``pid 123 on host (posenc train ...), since 2026-11-23 10:00:00``."""
    text = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
    if info.get("command"):
        text += f" ({str(info['command'])[:160]})"
    if info.get("since"):
        text += ", since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
    return text


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 65536, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _alive(info: Mapping[str, Any]) -> bool:
    """Whether the recorded holder may still run (unknown hosts count as alive)."""
    if not info.get("pid"):
        return False
    if info.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder(directory: str) -> dict[str, Any] | None:
    """The recorded holder of ``directory``'s lock if a live process holds it, else None."""
    path = os.path.join(directory, LOCK_FILE)
    if not os.path.exists(path):
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd)
    except OSError:
        info = _read_holder(fd)
        return info if _alive(info) else None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _acquire(directory: str, path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        info = _read_holder(fd)
        os.close(fd)
        raise WorkdirBusyError(
            f"{directory} is in use by {describe_holder(info)}; wait for it to finish or stop "
            "it, or use another directory"
        ) from None
    except OSError as e:
        if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        info = _read_holder(fd)
        if info.get("pid") != os.getpid() and _alive(info):
            os.close(fd)
            raise WorkdirBusyError(
                f"{directory} is in use by {describe_holder(info)} (this file system has no "
                f"flock; if that process is gone, delete {path})"
            ) from None
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)),
        "since": time.time(),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return fd


@contextlib.contextmanager
def hold(directory: str | os.PathLike[str], *, enabled: bool = True) -> Iterator[None]:
    """Holds ``directory``'s lock for the block (the directory must exist).

    Args:
      directory: a work or sweep directory.
      enabled: False makes this a no-op (processes other than 0 of a multi-process run, whose
        process 0 holds the lock for all of them).

    Raises:
      WorkdirBusyError: another live process holds it.
    """
    directory = os.fspath(directory)
    key = os.path.realpath(directory)
    if not enabled:
        yield
        return
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    fd = _acquire(directory, os.path.join(directory, LOCK_FILE))
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[key]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
