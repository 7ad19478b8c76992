"""``posenc harness <lm_eval arguments>``: the harness's own command line with posenc's model
registered.

The arguments are lm_eval 0.4's, unchanged (``run``, ``ls``, ``validate``; without a subcommand
``run`` is meant, as with ``lm_eval``). Two things are added for a posenc run:

- ``--model posenc`` without ``--output_path`` writes the results under the run directory
  (``<workdir>/harness/``, :data:`posenc.workdir.HARNESS_DIR`), where ``posenc report`` finds
  them;
- a task whose data is neither cached nor local (the ``datasets`` library cannot reach the Hub:
  ``posenc harness`` runs with ``HF_DATASETS_OFFLINE=1`` unless it is set) fails in one line
  saying what to prepare.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from posenc.workdir import HARNESS_DIR

OFFLINE_HINT = (
    "cache its data first (run the same command once with HF_DATASETS_OFFLINE=0 and network), "
    "or write a local task YAML (dataset_path: json, dataset_kwargs.data_files) and pass its "
    "folder with --include_path"
)


def _offline_failure(error: BaseException) -> bool:
    """Whether ``error`` is the datasets library failing to reach the Hub for a task's data."""
    module = type(error).__module__ or ""
    text = str(error)
    return (
        module.startswith(("datasets", "huggingface_hub", "requests", "urllib3"))
        or isinstance(error, ConnectionError)
        or "offline mode" in text.lower()
        or "couldn't reach" in text.lower()
    )


def run_cli(argv: Sequence[str]) -> int:
    """Runs lm_eval's command line with ``argv`` and posenc's model registered (module
    docstring); returns the exit status. Raises a one-line ``ValueError`` for a task whose data
    is not available offline."""
    unset = [k for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE") if k not in os.environ]
    os.environ.update(dict.fromkeys(unset, "1"))
    try:
        return _run(argv)
    finally:
        for key in unset:  # the caller's environment as it was (a test's process goes on)
            os.environ.pop(key, None)


def _run(argv: Sequence[str]) -> int:
    try:
        import posenc.harness  # noqa: F401 - registers the model
    except ImportError as e:
        raise ValueError(str(e)) from None
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    saved = sys.argv
    sys.argv = ["posenc harness", *argv]
    try:
        setup_logging()
        parser = HarnessCLI()
        args = parser.parse_args()
    finally:
        sys.argv = saved
    if getattr(args, "command", None) == "run" and args.model == "posenc":
        workdir = (args.model_args or {}).get("workdir")
        if workdir and not args.output_path:
            args.output_path = os.path.join(str(workdir), HARNESS_DIR)
    try:
        parser.execute(args)
    except Exception as e:
        if not _offline_failure(e):
            raise
        tasks = ",".join(getattr(args, "tasks", None) or []) or "the task"
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"the data of {tasks} is not available offline ({first}); {OFFLINE_HINT}"
        ) from None
    return 0
