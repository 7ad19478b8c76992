"""What a benchmark run measures: the model sizes, the run's settings and each encoder's config."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ml_collections

from posenc import data as data_lib
from posenc import encodings
from posenc.runs.config import load_config, open_source

# Model sizes. "small" is the reference setting (configs/base.py); "cpu" runs in seconds.
SIZES: dict[str, dict[str, Any]] = {
    "cpu": {
        "model": dict(num_layers=2, model_dim=64, num_heads=4, mlp_dim=256, dtype="float32"),
        "train": dict(seq_len=128, batch_size=8),
        "eval_lengths": (256, 1024, 4096),
    },
    "small": {
        "model": dict(num_layers=6, model_dim=512, num_heads=8, mlp_dim=2048, dtype="bfloat16"),
        "train": dict(seq_len=512, batch_size=64),
        "eval_lengths": (1024, 4096, 16384, 32768),
    },
    "gpt2": {
        "model": dict(num_layers=12, model_dim=768, num_heads=12, mlp_dim=3072, dtype="bfloat16"),
        "train": dict(seq_len=1024, batch_size=32),
        "eval_lengths": (1024, 4096, 16384, 32768),
    },
    # The device check's dry run: the smallest model that runs every part.
    "dry": {
        "model": dict(num_layers=1, model_dim=32, num_heads=2, mlp_dim=64, dtype="float32"),
        "train": dict(seq_len=32, batch_size=2),
        "eval_lengths": (64,),
    },
    # GPT-2 small's shape at 2k tokens: the device check's (experiments/device_check.py).
    "gpt2_2k": {
        "model": dict(num_layers=12, model_dim=768, num_heads=12, mlp_dim=3072, dtype="bfloat16"),
        "train": dict(seq_len=2048, batch_size=16),
        "eval_lengths": (8192, 32768),
    },
}

ISOLATE = ("auto", "always", "never")

# The config every size modifies.
BASE_CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "base.py"


@dataclasses.dataclass
class Settings:
    """One benchmark run. Plain JSON values, so that worker processes receive them as JSON."""

    # Model size, a key of SIZES.
    size: str = "small"
    # Encoders to measure (default: every registered encoder).
    encoders: tuple[str, ...] | None = None
    # Timed training steps.
    steps: int = 20
    # Untimed training steps after compiling.
    warmup: int = 3
    # Window lengths of the evaluation (default: the size's eval_lengths).
    eval_lengths: tuple[int, ...] | None = None
    # Timed runs per evaluation length (the median is reported).
    eval_repeats: int = 3
    # model.attention_impl of every encoder (posenc.attention.core.IMPLEMENTATIONS).
    attention_impl: str = "auto"
    # model.dtype, overriding the size's.
    dtype: str | None = None
    # train.batch_size, overriding the size's.
    batch_size: int | None = None
    # Peak TFLOP/s per device for MFU (default: PEAK_TFLOPS by device kind; none on CPU).
    peak_tflops: float | None = None
    # data.source and data.data_dir of the windows.
    data: str = "pystdlib"
    data_dir: str | None = None
    # One process per measurement: "auto" where the device reports peak memory, "always", "never".
    isolate: str = "auto"
    # Seconds per worker process.
    timeout: float = 3600

    def __post_init__(self):
        known = encodings.names()
        self.encoders = tuple(known if self.encoders is None else self.encoders)
        if self.size not in SIZES:
            raise ValueError(f"unknown size {self.size!r}; known: {', '.join(sorted(SIZES))}")
        lengths = self.eval_lengths
        if lengths is None:
            lengths = SIZES[self.size]["eval_lengths"]
        self.eval_lengths = tuple(int(n) for n in lengths)
        unknown = sorted(set(self.encoders) - set(known))
        if unknown:
            raise ValueError(f"unknown encoders {unknown}; known: {', '.join(known)}")
        if self.steps < 1 or self.warmup < 0 or self.eval_repeats < 1:
            raise ValueError("steps and eval_repeats must be >= 1 and warmup >= 0")
        if self.isolate not in ISOLATE:
            raise ValueError(f"isolate must be one of {ISOLATE}, not {self.isolate!r}")


def make_config(settings: Settings, encoder: str) -> ml_collections.ConfigDict:
    """The run config of one encoder at ``settings.size`` (configs/base.py plus the size)."""
    size = SIZES[settings.size]
    config = load_config(str(BASE_CONFIG))
    config.model.update(size["model"])
    config.train.update(size["train"])
    if settings.dtype:
        config.model.dtype = settings.dtype
    if settings.batch_size:
        config.train.batch_size = settings.batch_size
    config.model.attention_impl = settings.attention_impl
    config.encoding.name = encoder
    config.data.source = settings.data
    config.data.data_dir = settings.data_dir
    # Only shapes the learning-rate schedule.
    config.train.steps = settings.warmup + settings.steps + 1
    config.optim.warmup_steps = 1
    return config


def train_windows(config: ml_collections.ConfigDict) -> data_lib.TrainWindows:
    """The training windows every benchmark of ``config`` times: its training split, its
    length and batch, deterministic in its seed."""
    t = config.train
    stream = open_source(config).split_stream("train")
    return data_lib.TrainWindows(stream, t.seq_len, t.batch_size, seed=config.seed)
