"""Where training metrics go: a JSONL file, TensorBoard when installed, and a progress bar."""

from __future__ import annotations

import json
import os
from typing import Any


class MetricsWriter:
    """Appends one JSON object per line to ``<workdir>/metrics.jsonl``.

    Also writes TensorBoard scalars under ``<workdir>/tensorboard`` when ``tensorboardX`` is
    installed (``pip install posenc[tensorboard]``). Only process 0 writes (``enabled``).
    """

    def __init__(self, workdir: str, *, enabled: bool = True, filename: str = "metrics.jsonl"):
        self.enabled = enabled
        self._file = None
        self._tb = None
        if not enabled:
            return
        self._file = open(os.path.join(workdir, filename), "a")  # noqa: SIM115
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            return
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, line: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(line, sort_keys=True) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in line.items():
                if key not in ("step", "time") and isinstance(value, int | float):
                    self._tb.add_scalar(f"train/{key}", value, line["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: str, filename: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """The metric lines of a work directory, in order."""
    path = os.path.join(workdir, filename)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_metrics_after(workdir: str, step: int, filename: str = "metrics.jsonl") -> None:
    """Removes the lines of steps after ``step`` from the metrics file, and any torn line.

    A run stopped between two checkpoints (killed, or stopped by a non-finite loss) has logged
    steps past the checkpoint it resumes from; the resumed run logs them again, so without this
    the loss curve would hold those steps twice. A process killed while writing can also leave
    a partial last line, which would otherwise be glued to the next one.
    """
    path = os.path.join(workdir, filename)
    if not os.path.exists(path):
        return
    with open(path) as f:
        raw = [text for text in f.read().split("\n") if text.strip()]
    keep = []
    for text in raw:
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and line.get("step", 0) <= step:
            keep.append(text)
    if len(keep) == len(raw):
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.writelines(text + "\n" for text in keep)
    os.replace(tmp, path)


class _NullBar:
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(*, total: int, initial: int = 0, enabled: bool = True, desc: str = "train"):
    """A tqdm bar (step, loss, tokens/s, ETA), or a silent stand-in when disabled."""
    if not enabled:
        bar = _NullBar()
        bar.n = initial
        return bar
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)
