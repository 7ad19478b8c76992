"""The task registry: names, alphabets, allowed lengths, and the deterministic `example`.

An example is a pure function of `(task, length, seed, index)`: its generator draws from
`numpy.random.default_rng([crc32(task), length, seed, EXAMPLE_STREAM, index])`, so it does not
depend on which other examples are drawn, on batch sizes or on Python's `hash()`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from collections.abc import Callable, Sequence

import numpy as np

from posenc.data.synthetic import chomsky, nope, retrieval, tfds_tasks

# Streams of random numbers (the last-but-one seed word): evaluation examples, training rows,
# training lengths.
EXAMPLE_STREAM, TRAIN_ROW_STREAM, TRAIN_LENGTH_STREAM = 0, 1, 2

Generator = Callable[[np.random.Generator, int], tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class Task:
    """One task's definition.

    Attributes:
      name: the task name (snake case, the paper's).
      paper: "ruoss" (Ruoss et al. 2023 / Delétang et al. 2023), "nope" (Kazemnejad et al.
        2023) or "retrieval" (passkey and RULER's needles, :mod:`posenc.retrieval`).
      generate: `(rng, length) -> (input, target)`.
      alphabet: every symbol inputs and targets use, in a fixed order.
      min_length: the shortest length the task can produce.
      max_length: the longest (None: unbounded).
      odd_only: only odd lengths exist.
      max_input: `length -> ` the longest input of that length.
      max_target: `length -> ` the longest target of that length.
      allowed: how the allowed lengths read in errors.
      weight_inputs: training weights the input's next-token predictions too (the retrieval
        tasks: a language model's loss over the prompt, whose repeated filler teaches copying
        from the context; evaluation scores the target only).
    """

    name: str
    paper: str
    generate: Generator
    alphabet: str
    min_length: int = 1
    max_length: int | None = None
    odd_only: bool = False
    max_input: Callable[[int], int] = lambda n: n
    max_target: Callable[[int], int] = lambda n: 1
    allowed: str = "any length >= 1"
    weight_inputs: bool = False


def _same(n: int) -> int:
    return n


_C = chomsky
_RUOSS = (
    Task("even_pairs", "ruoss", _C.even_pairs, "01"),
    Task(
        "modular_arithmetic",
        "ruoss",
        _C.modular_arithmetic,
        _C.DIGITS + "+-*",
        odd_only=True,
        allowed="odd lengths >= 1 (digit, operator, digit, ...)",
    ),
    Task("parity_check", "ruoss", _C.parity_check, "01"),
    Task("cycle_navigation", "ruoss", _C.cycle_navigation, _C.CYCLE_ACTIONS + _C.DIGITS),
    Task(
        "stack_manipulation",
        "ruoss",
        _C.stack_manipulation,
        _C.STACK_SYMBOLS + _C.END,
        max_target=lambda n: n + 1,
    ),
    Task("reverse_string", "ruoss", _C.reverse_string, "01", max_target=_same),
    Task(
        "modular_arithmetic_brackets", "ruoss", _C.modular_arithmetic_brackets, _C.DIGITS + "+-*()"
    ),
    Task(
        "solve_equation",
        "ruoss",
        _C.solve_equation,
        _C.DIGITS + "+-()x=",
        min_length=3,
        allowed="lengths >= 3 (an expression, '=' and its value)",
    ),
    Task("duplicate_string", "ruoss", _C.duplicate_string, "01", max_target=lambda n: 2 * n),
    Task(
        "missing_duplicate_string",
        "ruoss",
        _C.missing_duplicate_string,
        "01" + _C.MISSING + _C.PAD,
        min_length=2,
        allowed="lengths >= 2 (a string written twice)",
    ),
    Task("odds_first", "ruoss", _C.odds_first, "01", max_target=_same),
    Task(
        "binary_addition",
        "ruoss",
        _C.binary_addition,
        "01+" + _C.END,
        min_length=3,
        max_target=_same,
        allowed="lengths >= 3 (two numbers and '+')",
    ),
    Task(
        "binary_multiplication",
        "ruoss",
        _C.binary_multiplication,
        "01*" + _C.END,
        min_length=3,
        max_target=_same,
        allowed="lengths >= 3 (two numbers and '*')",
    ),
    Task("compute_sqrt", "ruoss", _C.compute_sqrt, "01", max_target=lambda n: math.ceil(n / 2)),
    Task("bucket_sort", "ruoss", _C.bucket_sort, "01234", max_target=_same),
)

_N = nope
_NOPE = (
    Task("copy", "nope", _N.copy, _N.COPY_VOCAB, max_target=_same),
    Task("reverse", "nope", _N.reverse, _N.COPY_VOCAB, max_target=_same),
    Task(
        "addition",
        "nope",
        _N.addition,
        "0123456789+",
        max_input=lambda n: 2 * n + 1,
        max_target=lambda n: n + 1,
        allowed="any number of digits >= 1",
    ),
    Task(
        "polynomial_evaluation",
        "nope",
        _N.polynomial_evaluation,
        "0123456789+-:x",
        max_input=lambda n: 3 + 4 * n,
        allowed="any number of terms >= 1",
    ),
    Task("sorting", "nope", _N.sorting, _N.SORT_VOCAB, max_target=_same),
    Task("summation", "nope", _N.summation, "0123456789"),
    Task("parity", "nope", _N.parity, "01"),
    Task(
        "lego",
        "nope",
        _N.lego,
        _N.LEGO_VARS_LONG + "=+-1,?",
        min_length=2,
        max_length=len(_N.LEGO_VARS_LONG),
        max_input=lambda n: 5 * n + 1,
        allowed=f"numbers of variables in [2, {len(_N.LEGO_VARS_LONG)}]",
    ),
    Task(
        "scan",
        "nope",
        tfds_tasks.scan_example,
        tfds_tasks.SCAN_ALPHABET,
        max_input=lambda n: tfds_tasks.SCAN_MAX_COMMAND_WORDS,
        max_target=_same,
        allowed="numbers of actions that occur in SCAN (1 to 48)",
    ),
    Task(
        "pcfg",
        "nope",
        tfds_tasks.pcfg_example,
        "",
        max_input=tfds_tasks.pcfg_max_input,
        max_target=tfds_tasks.pcfg_max_target,
        allowed="numbers of functions that occur in the prepared PCFG data set",
    ),
)

_R = retrieval
_PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n"
# Length = the prompt's byte tokens with the separator; the input is the bytes before it.
_RETRIEVAL = tuple(
    Task(
        name,
        "retrieval",
        _R.generator(name),
        _PRINTABLE,
        min_length=_R.min_length(name),
        max_input=lambda n: n - 1,
        max_target=functools.partial(lambda name, n: _R.max_target(name), name),
        allowed=f"lengths >= {_R.min_length(name)} (the prompt without filler)",
        weight_inputs=True,
    )
    for name in _R.TRAINABLE
)

REGISTRY: dict[str, Task] = {t.name: t for t in _RUOSS + _NOPE + _RETRIEVAL}
RUOSS_TASKS: tuple[str, ...] = tuple(t.name for t in _RUOSS)
NOPE_TASKS: tuple[str, ...] = tuple(t.name for t in _NOPE)
RETRIEVAL_TASKS: tuple[str, ...] = tuple(t.name for t in _RETRIEVAL)
TASKS: tuple[str, ...] = RUOSS_TASKS + NOPE_TASKS + RETRIEVAL_TASKS
# Tasks read from a prepared TFDS data set rather than generated.
DATA_TASKS: tuple[str, ...] = ("scan", "pcfg")
# Each paper's (longest training length, longest test length) per task, in the task's length
# unit: Ruoss et al. 2023 train on 1..40 and test on 41..500 (Sec. 4); Kazemnejad et al. 2023's
# final runs (their `notebooks/plot_aggregate_final.ipynb` splits) train on <= 20 and test on
# 21..40 for copy and reverse ("*_tr20_ts40"), <= 8 and 9..16 for the arithmetic tasks, LEGO and
# parity ("len_tr8_ts16", "n_terms_tr8_ts16"), <= 25 and 26..48 for SCAN; PCFG's productivity
# split is the data set's own (None).
PAPER_LENGTHS: dict[str, tuple[int, int] | None] = {
    **{t.name: (40, 500) for t in _RUOSS},
    **{name: (20, 40) for name in ("copy", "reverse")},
    **{
        name: (8, 16)
        for name in ("addition", "polynomial_evaluation", "sorting", "summation", "parity", "lego")
    },
    "scan": (25, 48),
    "pcfg": None,
    **{name: None for name in RETRIEVAL_TASKS},  # no paper trains on them; lengths are ours
}


def get_task(task: str) -> Task:
    """The `Task` named `task`; a one-line ValueError listing all names otherwise."""
    if task not in REGISTRY:
        raise ValueError(f"unknown synthetic task {task!r}; allowed: {', '.join(TASKS)}")
    return REGISTRY[task]


def length_ok(task: str, length: int) -> bool:
    """Whether `task` can produce examples of `length` (SCAN and PCFG: loads their data once)."""
    t = get_task(task)
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        return False
    if length < t.min_length or (t.max_length is not None and length > t.max_length):
        return False
    if t.odd_only and length % 2 == 0:
        return False
    return task not in DATA_TASKS or tfds_tasks.length_available(task, int(length))


def check_length(task: str, length: int) -> int:
    """Validates a length for `task`.

    Returns:
      `length` as an int.

    Raises:
      ValueError: one line naming the task, the length and the allowed lengths.
    """
    t = get_task(task)
    if not length_ok(task, length):
        shown = int(length) if isinstance(length, np.integer) else repr(length)
        raise ValueError(
            f"synthetic task {task!r} has no examples of length {shown}; allowed: {t.allowed}"
        )
    return int(length)


def alphabet(task: str) -> str:
    """Every symbol (one character each) of the task's inputs and targets, each once.

    For `pcfg` the alphabet comes from the prepared data set.
    """
    if task == "pcfg":
        return tfds_tasks.pcfg_alphabet()
    return "".join(dict.fromkeys(get_task(task).alphabet))


def max_input_length(task: str, length: int) -> int:
    """The longest input an example of `length` can have (`length` itself for most tasks)."""
    return get_task(task).max_input(check_length(task, length))


def max_target_length(task: str, length: int) -> int:
    """The longest target an example of `length` can have (to size buffers)."""
    return get_task(task).max_target(check_length(task, length))


def check_nonnegative(name: str, value: int) -> int:
    """`value` as an int; a one-line ValueError naming `name` unless it is an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"synthetic {name} must be an integer >= 0, got {value!r}")
    return int(value)


def generate(task: str, length: int, key: Sequence[int]) -> tuple[str, str]:
    """The example of `task` at `length` drawn from the seed words `key` (no validation)."""
    rng = np.random.default_rng([zlib.crc32(task.encode()), length, *key])
    return get_task(task).generate(rng, length)


def example(task: str, length: int, seed: int, index: int) -> tuple[str, str]:
    """One `(input, target)` pair, a pure function of its arguments.

    Args:
      task: a name in `TASKS`.
      length: the example's length (see `check_length`; the input length for the tasks of
        Ruoss et al., the paper's length for those of Kazemnejad et al.).
      seed: >= 0.
      index: >= 0, the example's number.

    Returns:
      `(input, target)` strings over `alphabet(task)`.
    """
    length = check_length(task, length)
    seed, index = check_nonnegative("seed", seed), check_nonnegative("index", index)
    return generate(task, length, (seed, EXAMPLE_STREAM, index))


def examples(task: str, length: int, n: int, seed: int) -> list[tuple[str, str]]:
    """`[example(task, length, seed, i) for i in range(n)]`."""
    length = check_length(task, length)
    n, seed = check_nonnegative("n", n), check_nonnegative("seed", seed)
    return [generate(task, length, (seed, EXAMPLE_STREAM, i)) for i in range(n)]
