"""Synthetic length-generalisation tasks: deterministic `(input, target)` generators and batches.

Two suites. Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of
Transformers" (15 tasks, with the definitions of Delétang et al. 2023, "Neural Networks and the
Chomsky Hierarchy"; `chomsky.py`), and Kazemnejad et al. 2023, "The Impact of Positional Encoding
on Length Generalization in Transformers" (`nope.py`; SCAN and PCFG from prepared TFDS data in
`tfds_tasks.py`). Inputs and targets are strings, one character (one byte) per symbol::

    >>> from posenc.data import synthetic
    >>> synthetic.example("binary_addition", 7, seed=0, index=0)   # ("n+m" little-endian, sum".")
    >>> synthetic.examples("copy", 5, n=3, seed=0)
    >>> synthetic.train_batch("parity_check", 128, max_length=40, seed=0, step=0)
    >>> synthetic.eval_batch("parity_check", 500, n=64, seed=1)

An example is a pure function of `(task, length, seed, index)`. Its length is the input length
for the Ruoss tasks (Delétang's `length`) and the paper's length for Kazemnejad's (tokens,
digits, terms, variables, actions; `max_input_length` bounds the input).

| task | alphabet (input -> target) | target | length |
|---|---|---|---|
| even_pairs | 01 -> 01 | "1" iff the number of 01/10 pairs is odd | input |
| modular_arithmetic | 01234+-* -> 01234 | value mod 5, usual precedence | odd input |
| parity_check | 01 -> 01 | number of 1s mod 2 | input |
| cycle_navigation | -0+ -> 01234 | final state on a 5-cycle from 0 (-: left, +: right) | input |
| stack_manipulation | 01pab -> 01. | final stack top first, "." (p: POP, a/b: PUSH 0/1) | input |
| reverse_string | 01 -> 01 | reversed | input |
| modular_arithmetic_brackets | 01234+-*() -> 01234 | value mod 5 | input |
| solve_equation | 01234+-()x= -> 01234 | the x solving the equation mod 5 | input >= 3 |
| duplicate_string | 01 -> 01 | s s | input |
| missing_duplicate_string | 01?# -> 01 | the bit at "?" in s s ("#": odd-length pad) | input >= 2 |
| odds_first | 01 -> 01 | s_1 s_3 ... s_2 s_4 ... (1-indexed) | input |
| binary_addition | 01+ -> 01. | n + m, little-endian, "." | input >= 3 |
| binary_multiplication | 01* -> 01. | n * m, little-endian, "." | input >= 3 |
| compute_sqrt | 01 -> 01 | floor(sqrt(n)), big-endian, ceil(L/2) bits | input |
| bucket_sort | 01234 -> 01234 | sorted | input |
| copy | 0-9a-zA-Z | the same tokens | tokens |
| reverse | 0-9a-zA-Z | reversed | tokens |
| addition | 0-9+ -> 0-9 | a + b in decimal | digits of the longer operand |
| polynomial_evaluation | 0-9+-:x -> 0-9 | sum c x^d mod 10, e.g. "-2:+3x2-1x0" | terms |
| sorting | 50 of 0-9A-Za-z | sorted by byte | tokens |
| summation | 1-9 -> 0-9 | sum mod 10 | digits |
| parity | 01 -> 01 | number of 1s mod 2 | bits |
| lego | a-zA-Z=+-1,? -> +- | sign of the queried variable, e.g. "a=+1,b=-a?b" | variables 2..52 |
| scan | jwuktlrao23nf -> JWUK<> | SCAN actions (`tfds_tasks.SCAN_COMMANDS`) | actions |
| pcfg | from the data set | PCFG SET output | function words |
| passkey | printable ASCII -> digits | " 12345." (Landmark's passkey prompt) | prompt bytes |
| niah_single_1 | printable ASCII | " 1234567." (RULER's noise haystack) | prompt bytes |
| niah_multikey_2 | printable ASCII | " 1234567." (distractor needles) | prompt bytes |
| niah_multikey_3 | printable ASCII | a UUID and "." (UUID keys, distractors) | prompt bytes |
| vt | printable ASCII | " ABCDE, FGHIJ, ... ." (RULER's variable chain) | prompt bytes |

The retrieval tasks (`retrieval.py`) are :mod:`posenc.retrieval`'s prompts at a length in byte
tokens (the separator before the target included), the needle at a uniform depth; `posenc
retrieval` scores the trained run by length and depth.

Batches (`batching.py`, numpy only): `encode`, `train_batch`, `eval_batch` give `inputs`,
`targets`, `weights` (1 on the target tokens), `prompt_len` and `target_len`. Training lengths
are uniform over the allowed lengths in `[min_length, max_length]`, one per batch for the Ruoss
tasks (Delétang's training loop), one per row for Kazemnejad's (their shuffled data sets);
`PAPER_LENGTHS` holds each paper's training and test ranges.

Departures from the papers:

- Our own random draws with the papers' distributions, not their examples.
- Delétang's code fills lengths that hold no task with placeholders (solve equation < 3, missing
  duplicate 1, binary addition and multiplication < 3); those lengths are errors here, and
  training redraws them. Modular arithmetic has odd lengths only (Delétang maps an even length
  L to L - 1).
- Variable-length targets (stack manipulation, binary addition/multiplication) end at the
  termination token "." instead of being zero-padded to a fixed output length: the padded
  positions are the ones Delétang's `accuracy_mask` leaves out.
- Odds first follows the paper's definition (1-indexed s_1 s_3 ... first); the reference code
  outputs the other half first.
- Kazemnejad et al. write English prompts for a T5 tokenizer; we keep the sampled quantities and
  answers and write them compactly with one byte per symbol. Copy and reverse draw from 62
  symbols (paper: 100 T5 tokens). Of their variants we take copy "cmc", reverse "mc", sorting
  "sngd" (single tokens), LEGO with clauses in chain order, polynomial evaluation and summation
  modulo 10. Addition's length is the longer operand's digit count (the paper bins by both
  counts). LEGO beyond the paper's 26 variables also names them with uppercase letters.
- SCAN and PCFG examples are drawn uniformly (with replacement) among the data set's examples
  of that length, all splits pooled. PCFG SET's 520 letters do not fit one byte per symbol:
  `pcfg` reads a data set of at most 189 distinct words (a PCFG SET with a smaller alphabet).
"""

from posenc.data.synthetic.batching import (
    LENGTH_PER,
    encode,
    eval_batch,
    row_width,
    train_batch,
    train_lengths,
    train_width,
)
from posenc.data.synthetic.tasks import (
    DATA_TASKS,
    NOPE_TASKS,
    PAPER_LENGTHS,
    RETRIEVAL_TASKS,
    RUOSS_TASKS,
    TASKS,
    alphabet,
    check_length,
    example,
    examples,
    max_input_length,
    max_target_length,
)

__all__ = [
    "DATA_TASKS",
    "LENGTH_PER",
    "NOPE_TASKS",
    "PAPER_LENGTHS",
    "RETRIEVAL_TASKS",
    "RUOSS_TASKS",
    "TASKS",
    "alphabet",
    "check_length",
    "encode",
    "eval_batch",
    "example",
    "examples",
    "max_input_length",
    "max_target_length",
    "row_width",
    "train_batch",
    "train_lengths",
    "train_width",
]
