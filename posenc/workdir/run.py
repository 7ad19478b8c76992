"""A run's work directory: what it holds, and the rules for changing it.

Layout (names in :mod:`posenc.workdir.files`)::

    <workdir>/
      config.json           the resolved config the run trains with
      data.json             the data source's identity (split stream hashes) at the start
      init.json             the run and step the parameters started from (train.init_from)
      checkpoints/<step>/   orbax: params, train_state, posenc_sha256.json
      metrics.jsonl         one line per logged training step
      eval.json             evaluation with the run's own config
      eval-<settings>.json  evaluations under changed settings (posenc eval --lengths ...)
      attention[-<settings>].{json,md,csv,png}, ..._entropy.{csv,png}   posenc analyze
      posenc.lock           held by the process using the directory

A report's name is always a plain ``.json`` name inside the directory and never one of the
names posenc owns (:data:`~posenc.workdir.files.OWNED_NAMES`): :meth:`RunDir.eval_output`.

Rules, each enforced here with a one-line :class:`~posenc.workdir.files.WorkdirError`:

- a run resumes only with the config it was trained with, apart from fields that cannot change
  what it computes (:data:`RESUMABLE`); checkpoints without a ``config.json`` (or ``data.json``)
  are refused, since nothing says which run they belong to;
- a run resumes only on the data it started on: the split streams' hashes in ``data.json`` must
  match the source's (an edited ``textdir:`` folder is new data);
- one process at a time (:mod:`posenc.workdir.lock`);
- checkpoints are verified before they are restored (:mod:`posenc.workdir.checkpoints`);
- a refusal while a new run is being set up leaves the directory as it was
  (:meth:`RunDir.starting`), so the corrected command is not refused as another run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ml_collections

from posenc.workdir import lock
from posenc.workdir.checkpoints import Checkpoints
from posenc.workdir.files import (
    ANALYSIS_STEM,
    CHECKPOINT_DIR,
    CONFIG_FILE,
    DATA_FILE,
    EVAL_FILE,
    EVAL_PREFIX,
    HARNESS_DIR,
    HYPOTHESES_SUFFIX,
    INIT_FILE,
    METRICS_FILE,
    OWNED_NAMES,
    RETRIEVAL_STEM,
    RETRIEVAL_SUFFIXES,
    VOCAB_FILE,
    WorkdirError,
    atomic_write_bytes,
    config_from_dict,
    diff_fields,
    eval_file_name,
    read_json,
    resolve_tokenizer_folders,
    upgrade,
    write_json,
)

# Config fields (or prefixes ending in ".") that may differ when a run is resumed: logging,
# checkpoint cadence, evaluation, the process layout, the device mesh (checkpoints are restored
# into the new mesh's shards), rematerialisation (memory, not numbers) and where prepared data
# is cached.
RESUMABLE = (
    "train.progress",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "eval.",
    "distributed.",
    "mesh.",
    "model.remat",
    "model.loss_chunk",
    "data.data_dir",
)


def matches(field: str, patterns: tuple[str, ...]) -> bool:
    """Whether a dotted field is one of ``patterns`` or under a prefix ending in ``.``."""
    return any(field == p or (p.endswith(".") and field.startswith(p)) for p in patterns)


def data_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two data records (``Source.info()``): the corpus hash and, for each
    split both record, its stream's token count and sha256."""
    changes = []
    if before.get("content_sha256") and now.get("content_sha256"):
        if before["content_sha256"] != now["content_sha256"]:
            changes.append(
                f"content sha256 {before['content_sha256'][:12]} -> {now['content_sha256'][:12]}"
            )
    old, new = before.get("splits", {}), now.get("splits", {})
    for split in sorted(set(old) & set(new)):
        for key in ("tokens", "stream_sha256"):
            a, b = old[split].get(key), new[split].get(key)
            if a is not None and b is not None and a != b:
                a, b = (a[:12], b[:12]) if isinstance(a, str) else (a, b)
                changes.append(f"{split} {key.replace('_', ' ')} {a} -> {b}")
    return changes


def hypotheses_name(report: str) -> str:
    """The outputs file of a translation evaluation report: ``eval.json`` ->
    ``eval.hypotheses.txt``."""
    return report.removesuffix(".json") + HYPOTHESES_SUFFIX


class RunDir:
    """The work directory of one run.

    Args:
      path: the directory (need not exist yet).

    Raises:
      WorkdirError: ``path`` exists and is not a directory.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise WorkdirError(f"work directory {self.path} is a file, not a directory")

    def file(self, name: str) -> str:
        """The path of ``name`` inside the directory."""
        return os.path.join(self.path, name)

    @property
    def metrics_path(self) -> str:
        return self.file(METRICS_FILE)

    def create(self) -> None:
        os.makedirs(self.path, exist_ok=True)

    @contextlib.contextmanager
    def starting(self, *, enabled: bool = True) -> Iterator[Callable[[], None]]:
        """Creates the directory for a run that starts (or resumes) in a ``with`` block, which
        calls the function it is given once the run is set up (config and data recorded,
        parameters restored or initialised).

        If the block raises before that call and the directory held no run when the block began
        (no ``config.json``, no checkpoints), everything posenc wrote in it is removed again (and
        the directory itself if the block created it): a refused ``--init-from``, a busy or
        missing source, a model that does not fit leave nothing that would make the corrected
        command "a different config". A run that already existed is never touched.

        Args:
          enabled: False only creates the directory (processes other than 0 of a
            multi-process run, which write nothing here).
        """
        existed = os.path.isdir(self.path)
        before = set(os.listdir(self.path)) if existed else set()
        fresh = not os.path.exists(self.file(CONFIG_FILE)) and not self.has_checkpoints()
        self.create()
        done = []
        try:
            yield lambda: done.append(True)
        except BaseException:
            if enabled and fresh and not done:
                self._remove_new(before, existed)
            raise

    def _remove_new(self, before: set[str], existed: bool) -> None:
        """Removes the entries posenc owns that are not in ``before`` (folders only when they
        hold no checkpoint step), and the directory if it did not exist and is now empty."""
        for name in set(os.listdir(self.path)) - before:
            path = self.file(name)
            if name not in OWNED_NAMES:
                continue
            if not os.path.isdir(path):
                os.remove(path)
            elif not any(entry.isdigit() for entry in os.listdir(path)):
                shutil.rmtree(path)
        if not existed and not os.listdir(self.path):
            os.rmdir(self.path)

    def lock(self, *, enabled: bool = True):
        """Holds the directory's lock for a ``with`` block (:func:`posenc.workdir.lock.hold`)."""
        return lock.hold(self.path, enabled=enabled)

    # -- config and data -------------------------------------------------------------------

    def read_config(self) -> ml_collections.ConfigDict:
        """The resolved config the run was trained with (``config.json``), locked."""
        fields = read_json(self.file(CONFIG_FILE))
        if fields is None:
            raise WorkdirError(
                f"{self.file(CONFIG_FILE)} does not exist: {self.path!r} is not a posenc work "
                "directory"
            )
        # An imported run's tokenizer is recorded relative to the run (hf:tokenizer).
        return config_from_dict(resolve_tokenizer_folders(fields, self.path))

    def has_checkpoints(self) -> bool:
        folder = self.file(CHECKPOINT_DIR)
        return os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder))

    def _require_record(self, name: str, what: str) -> None:
        if self.has_checkpoints():
            raise WorkdirError(
                f"{self.path} has checkpoints but no {name}, so nothing says which {what} they "
                f"were trained with; restore {name} or use another work directory"
            )

    def record_config(self, config: ml_collections.ConfigDict) -> None:
        """Writes ``config.json``, refusing a config that would change what the run computes."""
        self.check_config(config)
        write_json(self.file(CONFIG_FILE), config.to_dict(), sort_keys=True)

    def check_config(self, config: ml_collections.ConfigDict) -> None:
        """Refuses (writing nothing) a config that would change what the run computes."""
        previous = read_json(self.file(CONFIG_FILE))
        if previous is None:
            self._require_record(CONFIG_FILE, "config")
        else:
            changed = [
                f
                for f in diff_fields(upgrade(previous), config.to_dict())
                if not matches(f, RESUMABLE)
            ]
            if changed:
                raise WorkdirError(
                    f"{self.path} holds a run with a different config (fields {changed}); "
                    "resume it with the same config or use another work directory"
                )

    def record_data(self, info: Mapping[str, Any]) -> None:
        """Writes ``data.json``, refusing data that differs from what the run started on."""
        self.check_data(info)
        write_json(self.file(DATA_FILE), dict(info))

    def read_data(self) -> dict[str, Any] | None:
        """``data.json``: the data the run started on, or None."""
        return read_json(self.file(DATA_FILE))

    def check_data(self, info: Mapping[str, Any]) -> None:
        """Refuses (writing nothing) data that differs from what the run started on."""
        previous = read_json(self.file(DATA_FILE))
        if previous is None:
            self._require_record(DATA_FILE, "data")
        else:
            changes = data_changes(previous, info)
            if changes:
                raise WorkdirError(
                    f"the data of {self.path} changed since the run started "
                    f"({'; '.join(changes)}); its checkpoints were trained on the old data. "
                    "Restore the data, or train on the new data in another work directory"
                )

    def record_vocab(self, model: bytes) -> None:
        """Writes the run's SentencePiece model (``vocab.model``), refusing another model than
        the one the run started with."""
        previous = self.read_vocab()
        if previous is not None and previous != model:
            raise WorkdirError(
                f"{self.file(VOCAB_FILE)} holds another SentencePiece model than the data gives "
                "now; the run's checkpoints were trained with the old one. Train in another "
                "work directory"
            )
        atomic_write_bytes(self.file(VOCAB_FILE), model)

    def read_vocab(self) -> bytes | None:
        """The run's SentencePiece model, or None (a byte vocabulary, or no translation run)."""
        path = self.file(VOCAB_FILE)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    def record_init(self, record: Mapping[str, Any]) -> None:
        """Writes ``init.json``: the run (and step) this one's parameters started from."""
        write_json(self.file(INIT_FILE), dict(record))

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoints(self, *, keep: int | None = None, primary: bool = True) -> Checkpoints:
        """The run's checkpoints, opened for training (created if missing)."""
        return Checkpoints(self.file(CHECKPOINT_DIR), keep=keep, primary=primary)

    def restore_params(self, abstract_params: Any) -> tuple[int, Any]:
        """The parameters of the newest intact checkpoint, without the optimizer state.

        Returns:
          ``(step, params)``.

        Raises:
          WorkdirError: no checkpoint (train first), or none intact.
        """
        if not self.has_checkpoints():
            raise WorkdirError(
                f"no checkpoint in {self.file(CHECKPOINT_DIR)}; train first with "
                f"`posenc train --workdir {self.path} ...`"
            )
        checkpoints = Checkpoints(self.file(CHECKPOINT_DIR), writer=False)
        try:
            step, params, _ = checkpoints.restore_latest(abstract_params)
        finally:
            checkpoints.close()
        return step, params

    # -- evaluation results ----------------------------------------------------------------

    def eval_output(self, name: str | None, changes: Mapping[str, Any]) -> str:
        """The file an evaluation report is written to: ``name``, or by default
        :func:`eval_file_name` of the changed settings.

        Raises:
          WorkdirError: ``name`` is not a plain ``.json`` file name (a path, a hidden name),
            is one of the files the run owns (config, data, metrics, checkpoints, lock, ...) or
            a retrieval or analysis result's name (``retrieval-*``, ``attention-*``), is
            a folder, or is ``eval.json`` for changed settings (the run's own evaluation).
        """
        default = eval_file_name(changes)
        if name is None:
            return default
        problem = None
        if not name or name != os.path.basename(name) or name in (".", "..") or "\\" in name:
            problem = "give a file name inside the work directory, not a path"
        elif name in OWNED_NAMES:
            problem = f"{name} is the run's own; posenc keeps the run's records under that name"
        elif name.startswith((RETRIEVAL_STEM + "-", ANALYSIS_STEM + "-")):
            problem = (
                f"posenc keeps retrieval and attention analysis results under names starting "
                f"with {RETRIEVAL_STEM}- and {ANALYSIS_STEM}-"
            )
        elif name.startswith("."):
            problem = "a report's name may not start with '.' (temporary files do)"
        elif not name.endswith(".json"):
            problem = "a report's name must end in .json"
        elif os.path.isdir(self.file(name)):
            problem = f"{self.file(name)} is a folder"
        elif name == EVAL_FILE and changes:
            problem = (
                f"{EVAL_FILE} is the run's own evaluation; results under changed settings "
                f"({', '.join(changes)}) are written beside it"
            )
        if problem is None:
            return name
        raise WorkdirError(f"--output {name!r}: {problem} (default name {default})")

    def write_eval(self, report: Mapping[str, Any], name: str = EVAL_FILE) -> str:
        """Writes an evaluation report; returns its path."""
        path = self.file(name)
        write_json(path, dict(report))
        return path

    def write_hypotheses(self, lines: Sequence[str], report: str = EVAL_FILE) -> str:
        """Writes a translation evaluation's outputs beside its report ``report``
        (``eval.json`` -> ``eval.hypotheses.txt``), one line per source line; returns the
        path."""
        path = self.file(hypotheses_name(report))
        text = "".join(line.replace("\n", " ") + "\n" for line in lines)
        atomic_write_bytes(path, text.encode("utf-8"))
        return path

    def read_eval(self, name: str = EVAL_FILE) -> dict[str, Any] | None:
        """An evaluation report, or None if there is none."""
        return read_json(self.file(name))

    def retrieval_files(self) -> Iterator[str]:
        """The names of the retrieval records in the directory (``retrieval.json`` first, then
        ``retrieval-<changes>.json``)."""
        if not os.path.isdir(self.path):
            return
        names = sorted(os.listdir(self.path))
        first = RETRIEVAL_STEM + RETRIEVAL_SUFFIXES["json"]
        if first in names:
            yield first
        for name in names:
            if name.startswith(RETRIEVAL_STEM + "-") and name.endswith(RETRIEVAL_SUFFIXES["json"]):
                yield name

    def harness_files(self) -> list[str]:
        """The paths of the lm-evaluation-harness results files under the run's
        :data:`~posenc.workdir.files.HARNESS_DIR` (``results_<time>.json``, at any depth: the
        harness adds a folder named after the model), oldest first by their name's time."""
        root = self.file(HARNESS_DIR)
        found = []
        for folder, _, names in os.walk(root):
            found += [
                os.path.join(folder, n)
                for n in names
                if n.startswith("results_") and n.endswith(".json")
            ]
        return sorted(found, key=os.path.basename)

    def eval_files(self) -> Iterator[str]:
        """The names of the evaluation reports in the directory: ``eval.json`` first."""
        if not os.path.isdir(self.path):
            return
        names = sorted(os.listdir(self.path))
        if EVAL_FILE in names:
            yield EVAL_FILE
        for name in names:
            if name.startswith(EVAL_PREFIX) and name.endswith(".json"):
                yield name
