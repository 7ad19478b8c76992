"""``synthetic:<task>``: an algorithmic task (:mod:`posenc.data.synthetic`) as a data source.

A task has no token stream: its examples are generated on demand, a pure function of
``(task, length, seed, index)``. This source gives a run what it records about its data
(:meth:`TaskSource.info`: the task, its alphabet and a fingerprint of the generator's output, so
that a changed generator is noticed like edited text), and a clear error where code asks it for a
stream. Training batches and evaluation are in :mod:`posenc.kinds.tasks`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from posenc.data.base import SOURCE_FIELD, Source

PREFIX = "synthetic:"
# Lengths and seed of the examples whose hash identifies the generator's output.
_FINGERPRINT_LENGTHS = (1, 2, 3, 5, 8, 13)
_FINGERPRINT_SEED = 0
_FINGERPRINT_EXAMPLES = 8


def task_name(spec: str) -> str | None:
    """The task of a ``synthetic:<task>`` spec, or None for any other spec."""
    if isinstance(spec, str) and spec.startswith(PREFIX):
        return spec[len(PREFIX) :]
    return None


class TaskSource(Source):
    """The data source of ``data.source = "synthetic:<task>"``.

    Raises:
      ValueError: an unknown task (the message lists the tasks).
    """

    splits = ()

    def __init__(self, task: str, spec: str | None = None):
        from posenc.data import synthetic

        if task not in synthetic.TASKS:
            raise ValueError(
                f"{SOURCE_FIELD}={spec or PREFIX + task!r}: unknown task {task!r}; tasks: "
                f"{', '.join(synthetic.TASKS)}"
            )
        self.task = task
        self.spec = spec or PREFIX + task

    def split_stream(self, split: str) -> np.ndarray:
        raise ValueError(
            f"{SOURCE_FIELD}={self.spec!r} is an algorithmic task: it has no {split!r} token "
            "stream (examples are generated per length; see posenc.kinds.tasks)"
        )

    def fingerprint(self) -> str:
        """sha256 of a fixed set of generated examples: changes when the generator does."""
        from posenc.data import synthetic

        pairs = []
        for length in _FINGERPRINT_LENGTHS:
            try:
                synthetic.check_length(self.task, length)
            except ValueError:
                continue
            pairs += synthetic.examples(self.task, length, _FINGERPRINT_EXAMPLES, _FINGERPRINT_SEED)
        return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()

    def info(self) -> dict[str, Any]:
        from posenc.data import synthetic

        return {
            "spec": self.spec,
            "task": self.task,
            "alphabet": synthetic.alphabet(self.task),
            "content_sha256": self.fingerprint(),  # compared on resume, like a corpus hash
        }
