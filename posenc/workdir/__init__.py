"""The run directory: one owner for everything posenc keeps on disk about a run or a sweep.

- :mod:`posenc.workdir.files`: the file names, atomic JSON/JSONL writes and reads, configs in
  their JSON form, readable names for sets of settings.
- :mod:`posenc.workdir.run`: :class:`RunDir`, a run's directory and its rules (same config,
  same data, verified checkpoints, evaluation reports beside the run's own).
- :mod:`posenc.workdir.lock`: one process at a time per directory.
- :mod:`posenc.workdir.checkpoints`: orbax checkpoints with checksums and fallback.

Training, evaluation, sweeps and reports all go through this package; none of them knows
another's files. Importing it is cheap (no JAX, no orbax until a checkpoint is opened).
"""

from posenc.workdir.checkpoints import (
    CheckpointError,
    Checkpoints,
    CheckpointSaveError,
    CheckpointWarning,
)
from posenc.workdir.files import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    CORRUPT_DIR,
    DATA_FILE,
    EVAL_FILE,
    EVAL_PREFIX,
    INIT_FILE,
    LOCK_FILE,
    LOG_FILE,
    METRICS_FILE,
    OWNED_NAMES,
    POINT_FILE,
    PRETRAINED_FILE,
    STATUS_FILE,
    SWEEP_FILE,
    TENSORBOARD_DIR,
    TOKENIZER_DIR,
    VOCAB_FILE,
    WorkdirError,
    append_jsonl,
    atomic_write_bytes,
    config_from_dict,
    config_sha256,
    diff_fields,
    flatten,
    parse_value,
    read_json,
    read_jsonl,
    rewrite_jsonl,
    settings_hash,
    settings_name,
    to_json,
    upgrade,
    write_json,
)
from posenc.workdir.lock import WorkdirBusyError, describe_holder, hold
from posenc.workdir.run import (
    RESUMABLE,
    RunDir,
    data_changes,
    eval_file_name,
    hypotheses_name,
    matches,
)

__all__ = [
    "CHECKPOINT_DIR",
    "CONFIG_FILE",
    "CORRUPT_DIR",
    "DATA_FILE",
    "EVAL_FILE",
    "EVAL_PREFIX",
    "INIT_FILE",
    "LOCK_FILE",
    "LOG_FILE",
    "METRICS_FILE",
    "OWNED_NAMES",
    "POINT_FILE",
    "PRETRAINED_FILE",
    "RESUMABLE",
    "STATUS_FILE",
    "SWEEP_FILE",
    "TENSORBOARD_DIR",
    "TOKENIZER_DIR",
    "VOCAB_FILE",
    "CheckpointError",
    "CheckpointSaveError",
    "CheckpointWarning",
    "Checkpoints",
    "RunDir",
    "WorkdirBusyError",
    "WorkdirError",
    "append_jsonl",
    "atomic_write_bytes",
    "config_from_dict",
    "config_sha256",
    "data_changes",
    "describe_holder",
    "diff_fields",
    "eval_file_name",
    "hypotheses_name",
    "flatten",
    "hold",
    "matches",
    "parse_value",
    "read_json",
    "read_jsonl",
    "rewrite_jsonl",
    "settings_hash",
    "settings_name",
    "to_json",
    "upgrade",
    "write_json",
]
