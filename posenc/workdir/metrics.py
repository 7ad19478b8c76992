"""Where training metrics go: a JSONL file, TensorBoard when installed, and a progress bar."""

from __future__ import annotations

import math
import os
from typing import Any

from posenc.workdir import METRICS_FILE, TENSORBOARD_DIR, append_jsonl, read_jsonl, rewrite_jsonl


class MetricsWriter:
    """Appends one JSON object per line to ``<workdir>/metrics.jsonl``.

    Also writes TensorBoard scalars under ``<workdir>/tensorboard`` when ``tensorboardX`` is
    installed (``pip install posenc[tensorboard]``). Only process 0 writes (``enabled``).
    """

    def __init__(self, workdir: str, *, enabled: bool = True, filename: str = METRICS_FILE):
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
        self._tb = SummaryWriter(os.path.join(workdir, TENSORBOARD_DIR))

    def write(self, line: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_jsonl(self._file, line)
        if self._tb is not None:
            for key, value in line.items():
                if key not in ("step", "time") and isinstance(value, int | float):
                    self._tb.add_scalar(f"train/{key}", value, line["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: str, filename: str = METRICS_FILE) -> list[dict[str, Any]]:
    """The metric lines of a work directory, in order (a torn last line is skipped)."""
    return read_jsonl(os.path.join(workdir, filename))


def drop_metrics_after(workdir: str, step: int, filename: str = METRICS_FILE) -> None:
    """Removes the lines of steps after ``step`` from the metrics file, and any torn line.

    A run stopped between two checkpoints (killed, or stopped by a non-finite loss) has logged
    steps past the checkpoint it resumes from; the resumed run logs them again, so without this
    the loss curve would hold those steps twice. A process killed while writing can also leave
    a partial last line, which would otherwise be glued to the next one.
    """
    rewrite_jsonl(os.path.join(workdir, filename), lambda line: line.get("step", 0) <= step)


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


def perplexity(loss: float) -> float:
    """``exp(loss)``, or ``inf`` where that overflows a float (a loss above about 709 nats)."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
