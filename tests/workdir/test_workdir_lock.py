"""posenc.workdir.lock: one process per directory, the holder named, a dead holder taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from posenc.workdir import LOCK_FILE, WorkdirBusyError, hold
from posenc.workdir import lock as lock_lib

HOLDER = textwrap.dedent(
    """
    import sys, time
    from posenc.workdir import hold
    with hold(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def _start_holder(directory) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_with_the_holder_named_until_it_dies(tmp_path):
    proc = _start_holder(tmp_path)
    try:
        with pytest.raises(WorkdirBusyError) as info:
            with hold(tmp_path):
                pytest.fail("entered a directory another process holds")
        message = str(info.value)
        assert f"is in use by pid {proc.pid} on " in message and "\n" not in message
        assert lock_lib.holder(str(tmp_path))["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # kill -9 releases the lock: the next process takes it over.
    assert lock_lib.holder(str(tmp_path)) is None
    with hold(tmp_path):
        assert lock_lib.holder(str(tmp_path))["pid"] == os.getpid()
    assert lock_lib.holder(str(tmp_path)) is None and os.path.exists(tmp_path / LOCK_FILE)


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    with hold(tmp_path):
        with hold(tmp_path):
            pass
        # still held after the inner block: another process is refused
        code = subprocess.run(
            [sys.executable, "-c", HOLDER, str(tmp_path)], capture_output=True, text=True
        )
        assert code.returncode != 0 and "WorkdirBusyError" in code.stderr
    started = time.monotonic()
    proc = _start_holder(tmp_path)  # released after the outer block
    proc.kill()
    proc.wait()
    assert time.monotonic() - started < 60


def test_without_flock_a_dead_holder_on_this_host_is_taken_over(tmp_path, monkeypatch):
    """Some network file systems have no flock: the recorded pid decides."""
    import errno
    import fcntl
    import json
    import socket

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks available")

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], text=True, capture_output=True
    ).stdout.strip()
    record = {"pid": int(dead), "host": socket.gethostname(), "since": time.time()}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    monkeypatch.setattr(fcntl, "flock", no_flock)
    with hold(tmp_path):  # the recorded process has exited
        pass
    alive = {"pid": os.getppid(), "host": socket.gethostname(), "since": time.time()}
    (tmp_path / LOCK_FILE).write_text(json.dumps(alive))
    with pytest.raises(WorkdirBusyError, match="this file system has no flock"):
        with hold(tmp_path):
            pass
