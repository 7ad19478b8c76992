"""Session-wide settings of posenc's test suite.

Compiling dominates the suite's run time on CPU, and many tests compile the same programs: the
tiny configs' training and evaluation steps, again in every test that trains one, in a resumed
run, and in the ``posenc`` commands the tests start as child processes. JAX's persistent
compilation cache serves every repeat after the first from disk. One cache directory serves a
whole session: created by the first pytest process (the xdist controller), inherited through
the environment by its workers and by every child process, removed when the session ends.

A cache hit returns the executable the compilation wrote, so no result changes
(tests/test_sweep.py checks that a run with the cache equals one without). A directory the
user already names in ``JAX_COMPILATION_CACHE_DIR`` is used as it is and left in place.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

_DIR = "JAX_COMPILATION_CACHE_DIR"
# Cache every compilation, however short: the tiny models compile in well under JAX's default
# threshold of one second, and their repeats are what the cache is for.
_MIN_SECONDS = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"

_created: str | None = None


def pytest_configure(config):
    global _created
    if _DIR in os.environ:  # the user's own cache, or this session's (an xdist worker)
        return
    _created = tempfile.mkdtemp(prefix="posenc-tests-jax-cache-")
    os.environ[_DIR] = _created
    os.environ.setdefault(_MIN_SECONDS, "0")
    if "jax" in sys.modules:  # JAX reads the environment when imported; tell it if it was
        import jax

        jax.config.update("jax_compilation_cache_dir", _created)
        jax.config.update(
            "jax_persistent_cache_min_compile_time_secs", float(os.environ[_MIN_SECONDS])
        )


def pytest_unconfigure(config):
    global _created
    if _created is not None:
        shutil.rmtree(_created, ignore_errors=True)
        os.environ.pop(_DIR, None)
        _created = None
