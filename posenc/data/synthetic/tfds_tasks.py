"""SCAN and PCFG, the two data-set tasks of Kazemnejad et al. 2023, read from prepared TFDS data.

SCAN (Lake and Baroni 2018, "Generalization without Systematicity") is TFDS's `scan`; as
Kazemnejad et al. 2023 (App. C, `scripts/dataset_builders/make_scan_dataset.py`) we pool the
train and test splits of its `length` config and index examples by the number of actions in the
target (they train on <= 25 actions and test on 26..48). PCFG SET (Hupkes, Dankers, Mul and Bruni
2020, "Compositionality decomposed") is not in the TFDS catalog: prepare your own TFDS builder
for it (text features "source" and "target") under the data dir, named `pcfg_set` or as
`$POSENC_PCFG_TFDS` says; as Kazemnejad et al. (`make_pcfg_dataset.py`, productivity split) we
pool its splits and index examples by the number of function words in the input.

Both are read with `tfds.data_source` from array_record files (no TensorFlow), never downloaded
at run time: an unprepared data set raises `DataNotFoundError` with the command that prepares it.
The data dir is `posenc.data.default_data_dir()` (`$POSENC_DATA_DIR`).

One character per symbol: SCAN's 13 command words and 6 actions map to the fixed tables
`SCAN_COMMANDS` and `SCAN_ACTIONS`; PCFG's words map, in sorted order, to the byte-sized
characters of `PCFG_CHARS`. That allows at most 189 distinct words: the original PCFG SET's
string alphabet of 520 letters does not fit a byte vocabulary, so `pcfg` needs a PCFG SET
regenerated with a smaller alphabet (a larger vocabulary would break one byte per symbol).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from posenc.data.base import DataNotFoundError, default_data_dir

SCAN_TFDS_NAME = "scan/length"
SCAN_SPLITS = ("train", "test")
# Environment variable naming the user-prepared PCFG SET data set, and its default name.
PCFG_ENV = "POSENC_PCFG_TFDS"
PCFG_DEFAULT_NAME = "pcfg_set"
PCFG_SPLITS = ("train", "validation", "test")
# PCFG SET's string-edit functions (Hupkes et al. 2020, Table 1; Kazemnejad et al.'s list).
PCFG_FUNCTIONS = frozenset(
    "copy reverse shift swap repeat echo append prepend remove_first remove_second "
    "swap_first_last".split()
)
SCAN_COMMANDS: dict[str, str] = {
    "jump": "j",
    "walk": "w",
    "run": "u",
    "look": "k",
    "turn": "t",
    "left": "l",
    "right": "r",
    "around": "a",
    "opposite": "o",
    "twice": "2",
    "thrice": "3",
    "and": "n",
    "after": "f",
}
SCAN_ACTIONS: dict[str, str] = {
    "I_JUMP": "J",
    "I_WALK": "W",
    "I_RUN": "U",
    "I_LOOK": "K",
    "I_TURN_LEFT": "<",
    "I_TURN_RIGHT": ">",
}
SCAN_ALPHABET = "".join(SCAN_COMMANDS.values()) + "".join(SCAN_ACTIONS.values())
SCAN_MAX_COMMAND_WORDS = 9  # e.g. "jump around left twice and walk opposite right thrice"
# Printable Latin-1 characters (no space, no control characters): one byte each.
PCFG_CHARS = "".join(chr(c) for c in list(range(33, 127)) + list(range(161, 256)))


def scan_symbols(commands: str, actions: str) -> tuple[str, str]:
    """A SCAN pair in one character per word (`SCAN_COMMANDS`, `SCAN_ACTIONS`).

    Args:
      commands: e.g. "jump twice".
      actions: e.g. "I_JUMP I_JUMP".

    Returns:
      e.g. ("j2", "JJ").
    """
    try:
        return (
            "".join(SCAN_COMMANDS[w] for w in commands.split()),
            "".join(SCAN_ACTIONS[w] for w in actions.split()),
        )
    except KeyError as err:
        raise ValueError(f"SCAN word {err.args[0]!r} is not in posenc's SCAN table") from err


def _text(value) -> str:
    if isinstance(value, np.ndarray):
        value = value.item()
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _read_records(name: str, splits: Iterable[str], fields: tuple[str, str], prepare: str):
    """Yields `(field0, field1)` text pairs of the named splits of a prepared TFDS data set."""
    from posenc.data.tfds_source import import_tfds, tfds_builder

    data_dir = default_data_dir()
    try:
        builder = tfds_builder(name, data_dir)
    except DataNotFoundError as err:
        raise DataNotFoundError(
            f"synthetic task data {name!r} is not prepared under {data_dir}; {prepare}"
        ) from err
    if not builder.is_prepared():
        raise DataNotFoundError(
            f"synthetic task data {name!r} is not prepared under {data_dir}; {prepare}"
        )
    tfds = import_tfds()
    available = set(builder.info.splits.keys())
    for split in splits:
        if split not in available:
            continue
        source = tfds.data_source(name, split=split, data_dir=str(data_dir), download=False)
        for i in range(len(source)):
            record = source[i]
            yield _text(record[fields[0]]), _text(record[fields[1]])


def _scan_prepare_hint() -> str:
    data_dir = default_data_dir()
    return (
        f"prepare it once with: posenc data prepare tfds:{SCAN_TFDS_NAME} --text_field commands "
        f"--data_dir {data_dir} (or: tfds build {SCAN_TFDS_NAME} --data_dir={data_dir} "
        "--file_format=array_record)"
    )


def _pcfg_name() -> str:
    return os.environ.get(PCFG_ENV) or PCFG_DEFAULT_NAME


def _pcfg_prepare_hint() -> str:
    return (
        "PCFG SET is not in the TFDS catalog: write a TFDS builder for it (text features "
        f"'source' and 'target') and prepare it once with: tfds build <path/to/{_pcfg_name()}> "
        f"--data_dir={default_data_dir()} --file_format=array_record "
        f"(set ${PCFG_ENV} to its name if it is not {PCFG_DEFAULT_NAME!r})"
    )


@functools.cache
def _scan_pool(data_dir: Path) -> dict[int, list[tuple[str, str]]]:
    del data_dir  # the cache key; the reader uses default_data_dir()
    pool: dict[int, list[tuple[str, str]]] = {}
    records = _read_records(
        SCAN_TFDS_NAME, SCAN_SPLITS, ("commands", "actions"), _scan_prepare_hint()
    )
    for commands, actions in records:
        pair = scan_symbols(commands, actions)
        pool.setdefault(len(pair[1]), []).append(pair)
    return {n: sorted(pairs) for n, pairs in sorted(pool.items())}


def pcfg_char_table(words: Iterable[str]) -> dict[str, str]:
    """The PCFG word -> character table: sorted distinct words to `PCFG_CHARS` in order."""
    vocab = sorted(set(words))
    if len(vocab) > len(PCFG_CHARS):
        raise ValueError(
            f"the PCFG data set has {len(vocab)} distinct words; one byte per symbol allows at "
            f"most {len(PCFG_CHARS)}"
        )
    return dict(zip(vocab, PCFG_CHARS, strict=False))


@functools.cache
def _pcfg_data(data_dir: Path, name: str) -> tuple[dict[int, list[tuple[str, str]]], str]:
    del data_dir
    pairs = list(_read_records(name, PCFG_SPLITS, ("source", "target"), _pcfg_prepare_hint()))
    table = pcfg_char_table(w for s, t in pairs for w in (s + " " + t).split())
    pool: dict[int, list[tuple[str, str]]] = {}
    for source, target in pairs:
        pair = (
            "".join(table[w] for w in source.split()),
            "".join(table[w] for w in target.split()),
        )
        functions = sum(w in PCFG_FUNCTIONS for w in source.split())
        pool.setdefault(functions, []).append(pair)
    return {n: sorted(p) for n, p in sorted(pool.items())}, "".join(table.values())


def _pool(task: str) -> dict[int, list[tuple[str, str]]]:
    if task == "scan":
        return _scan_pool(default_data_dir())
    return _pcfg_data(default_data_dir(), _pcfg_name())[0]


def length_available(task: str, length: int) -> bool:
    """Whether the prepared data set of `task` has examples of `length` (loads it once)."""
    return length in _pool(task)


def _choose(task: str, rng: np.random.Generator, length: int) -> tuple[str, str]:
    pairs = _pool(task)[length]
    return pairs[int(rng.integers(0, len(pairs)))]


def scan_example(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """A SCAN pair whose target has `length` actions, uniform among those of the pooled splits."""
    return _choose("scan", rng, length)


def pcfg_example(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """A PCFG pair whose input has `length` function words, uniform among the data set's."""
    return _choose("pcfg", rng, length)


def pcfg_max_input(length: int) -> int:
    """The longest PCFG input with `length` function words."""
    return max(len(s) for s, _ in _pool("pcfg")[length])


def pcfg_max_target(length: int) -> int:
    """The longest PCFG target of an input with `length` function words."""
    return max(len(t) for _, t in _pool("pcfg")[length])


def pcfg_alphabet() -> str:
    """The characters of the prepared PCFG data set's words, in word order."""
    return _pcfg_data(default_data_dir(), _pcfg_name())[1]
