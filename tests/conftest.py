"""Suite-wide pieces: a guard that keeps a test process under the kernel's limit on memory
mappings, the ``no_network`` fixture, and ``data_dir`` (the embedded corpus, built once per
module, for the tests that train tiny runs).

XLA:CPU maps each compiled executable's code and data into memory (three mappings each) and
keeps it while JAX's caches hold the executable. A pytest-xdist worker compiles many thousands
of small programs over the default suite; past Linux's ``vm.max_map_count`` (65530 by default)
the next ``mmap`` fails inside XLA and the worker dies with a segmentation fault (CI lost two
workers that way near the end of a run). After a test, when the process holds more than
``_CLEAR_ABOVE`` mappings, JAX's caches are cleared: the executables are released and later
tests compile what they need again. Below the threshold nothing changes, so programs shared
between tests stay compiled.
"""

from __future__ import annotations

import gc
import os
import socket

import _train_helpers as helpers
import jax
import pytest

_MAPS = "/proc/self/maps"
_CLEAR_ABOVE = 30_000  # half of Linux's default vm.max_map_count
_EVERY = 10  # tests between counts (reading 30k lines costs a few milliseconds)
_seen = 0


def _mappings() -> int:
    with open(_MAPS, "rb") as f:
        return sum(1 for _ in f)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    global _seen
    _seen += 1
    if _seen % _EVERY or not os.path.exists(_MAPS):
        return
    if _mappings() > _CLEAR_ABOVE:
        jax.clear_caches()
        gc.collect()


@pytest.fixture
def no_network(monkeypatch):
    """Fails the test on any attempt to open a network connection."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A data dir with the embedded ``pystdlib`` corpus prepared (one per test module)."""
    return helpers.build_pystdlib(tmp_path_factory.mktemp("pystdlib"))
