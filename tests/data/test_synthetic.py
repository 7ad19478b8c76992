"""posenc.data.synthetic: every task against an independent solver written here from the papers'
definitions (Delétang et al. 2023 App. A as used by Ruoss et al. 2023; Kazemnejad et al. 2023
App. C), determinism, alphabets, batching and errors."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from posenc.data import synthetic
from posenc.data.tokenizer import SEP_ID

MOD = 5


# ----------------------------------------------------------------- independent solvers
# Each takes the input string (and its length argument) and returns the target the paper
# defines; structural checks on the input are asserts.


def _solve_even_pairs(s, n):
    return str(sum(s[i] != s[i + 1] for i in range(len(s) - 1)) % 2)


def _solve_modular_arithmetic(s, n):
    assert re.fullmatch(r"[0-4]([-+*][0-4])*", s)
    return str(eval(s) % MOD)  # Python's precedence: * before + and -


def _solve_parity(s, n):
    return str(s.count("1") % 2)


def _solve_cycle_navigation(s, n):
    position = 0
    for c in s:
        position += {"-": -1, "0": 0, "+": 1}[c]
    return str(position % 5)


def _solve_stack_manipulation(s, n):
    m = re.fullmatch(r"([01]+)([pab]*)", s)
    assert m and (n == 1 or m.group(2)), s
    stack = list(m.group(1))
    for action in m.group(2):
        if action == "p":
            if stack:
                stack.pop()
        else:
            stack.append("0" if action == "a" else "1")
    return "".join(reversed(stack)) + "."


def _solve_reverse(s, n):
    return s[::-1]


def _solve_brackets(s, n):
    assert re.fullmatch(r"[0-4+\-*()]+", s)
    return str(eval(s) % MOD)


def _solve_equation(s, n):
    lhs, rhs = s.split("=")
    assert lhs.count("x") == 1 and "*" not in lhs
    solutions = [v for v in range(MOD) if eval(lhs.replace("x", str(v))) % MOD == int(rhs)]
    assert len(solutions) == 1, s
    return str(solutions[0])


def _solve_duplicate(s, n):
    return s + s


def _solve_missing_duplicate(s, n):
    assert s.endswith("#") == (n % 2 == 1)
    body = s.rstrip("#")
    half = len(body) // 2
    first, second = body[:half], body[half:]
    i = body.index("?")
    return second[i] if i < half else first[i - half]


def _solve_odds_first(s, n):
    odd = [s[i - 1] for i in range(1, n + 1) if i % 2 == 1]  # 1-indexed s_1, s_3, ...
    even = [s[i - 1] for i in range(1, n + 1) if i % 2 == 0]
    return "".join(odd + even)


def _little_endian_value(bits):
    return sum(int(b) << i for i, b in enumerate(bits))


def _solve_binary(op):
    def solve(s, n):
        a, b = s.split(op)
        assert a and b and a.strip("0") and b.strip("0")  # both numbers >= 1
        x, y = _little_endian_value(a), _little_endian_value(b)
        value = x + y if op == "+" else x * y
        out = ""
        while value:
            out += str(value % 2)
            value //= 2
        return out + "."

    return solve


def _solve_sqrt(s, n):
    value = int(s, 2)
    assert value >= 1
    root = 0
    while (root + 1) ** 2 <= value:  # fine for small values; large ones use math.isqrt
        root += 1
        if root > 1000:
            root = math.isqrt(value)
            break
    return format(root, "b").rjust(math.ceil(n / 2), "0")


def _solve_sorted(s, n):
    return "".join(sorted(s))


def _solve_addition(s, n):
    a, b = s.split("+")
    assert max(len(a), len(b)) == n
    assert all(len(x) == 1 or x[0] != "0" for x in (a, b))
    return str(int(a) + int(b))


def _solve_polynomial(s, n):
    x_str, terms = s.split(":")
    x = int(x_str)
    assert -2 <= x <= 2 and len(terms) == 4 * n
    total = 0
    for k in range(n):
        sign, coeff, var, degree = terms[4 * k : 4 * k + 4]
        assert var == "x" and int(coeff) <= 3 and int(degree) <= 3
        total += int(sign + coeff) * x ** int(degree)
    return str(total % 10)


def _solve_summation(s, n):
    assert "0" not in s
    return str(sum(int(c) for c in s) % 10)


def _solve_lego(s, n):
    clauses, query = s.split("?")
    clauses = clauses.split(",")
    assert len(clauses) == n
    value = {}
    names = []
    for clause in clauses:
        name, rhs = clause.split("=")
        names.append(name)
        sign = 1 if rhs[0] == "+" else -1
        value[name] = sign * (1 if rhs[1:] == "1" else value[rhs[1:]])
    assert len(set(names)) == n
    assert names.index(query) >= math.ceil(n / 2)
    return "+" if value[query] == 1 else "-"


SOLVERS = {
    "even_pairs": _solve_even_pairs,
    "modular_arithmetic": _solve_modular_arithmetic,
    "parity_check": _solve_parity,
    "cycle_navigation": _solve_cycle_navigation,
    "stack_manipulation": _solve_stack_manipulation,
    "reverse_string": _solve_reverse,
    "modular_arithmetic_brackets": _solve_brackets,
    "solve_equation": _solve_equation,
    "duplicate_string": _solve_duplicate,
    "missing_duplicate_string": _solve_missing_duplicate,
    "odds_first": _solve_odds_first,
    "binary_addition": _solve_binary("+"),
    "binary_multiplication": _solve_binary("*"),
    "compute_sqrt": _solve_sqrt,
    "bucket_sort": _solve_sorted,
    "copy": lambda s, n: s,
    "reverse": _solve_reverse,
    "addition": _solve_addition,
    "polynomial_evaluation": _solve_polynomial,
    "sorting": _solve_sorted,
    "summation": _solve_summation,
    "parity": _solve_parity,
    "lego": _solve_lego,
}
# The retrieval tasks have their own tests (tests/test_retrieval.py): lengths of hundreds of bytes.
GENERATED = tuple(
    t for t in synthetic.TASKS if t not in synthetic.DATA_TASKS + synthetic.RETRIEVAL_TASKS
)
# Input length as a function of the length argument, where it is fixed.
INPUT_LENGTH = {"polynomial_evaluation": lambda n: 3 + 4 * n, "lego": lambda n: 5 * n + 1}


def _test_lengths(task):
    if task == "lego":
        return [2, 3, 4, 7, 8, 16, 26, 27, 52]
    longest = 500 if task in synthetic.RUOSS_TASKS else 100
    lengths = [*range(1, 13), 20, 40, 41, 63, longest, longest + 1]
    return [n for n in lengths if _allowed(task, n)]


def _allowed(task, n):
    try:
        synthetic.check_length(task, n)
    except ValueError:
        return False
    return True


def test_task_lists():
    assert synthetic.RUOSS_TASKS == (
        "even_pairs", "modular_arithmetic", "parity_check", "cycle_navigation",
        "stack_manipulation", "reverse_string", "modular_arithmetic_brackets", "solve_equation",
        "duplicate_string", "missing_duplicate_string", "odds_first", "binary_addition",
        "binary_multiplication", "compute_sqrt", "bucket_sort",
    )  # fmt: skip
    assert synthetic.NOPE_TASKS == (
        "copy", "reverse", "addition", "polynomial_evaluation", "sorting", "summation",
        "parity", "lego", "scan", "pcfg",
    )  # fmt: skip
    assert synthetic.RETRIEVAL_TASKS == (
        "passkey", "niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt"
    )  # fmt: skip
    assert (
        synthetic.TASKS == synthetic.RUOSS_TASKS + synthetic.NOPE_TASKS + synthetic.RETRIEVAL_TASKS
    )
    assert set(SOLVERS) == set(GENERATED)
    assert set(synthetic.PAPER_LENGTHS) == set(synthetic.TASKS)


@pytest.mark.parametrize("task", GENERATED)
def test_targets_match_independent_solver(task):
    solver = SOLVERS[task]
    seen = set()
    for n in _test_lengths(task):
        count = 4 if n >= 100 else 12
        for seed in (0, 1, 7):
            for inp, tgt in synthetic.examples(task, n, count, seed):
                expected_len = INPUT_LENGTH.get(task, lambda m: m)(n)
                if task != "addition":
                    assert len(inp) == expected_len, (task, n, inp)
                assert len(inp) <= synthetic.max_input_length(task, n)
                assert len(tgt) <= synthetic.max_target_length(task, n)
                assert tgt == solver(inp, n), (task, n, seed, inp, tgt)
                seen.add((inp, tgt))
    assert len(seen) > 20  # examples vary


def test_known_examples():
    # Worked examples of Delétang et al. 2023's task docstrings (in our symbols).
    assert _solve_binary("+")("001+01101", 9) == "01011."  # 4 + 22 = 26
    assert _solve_binary("*")("001*01101", 9) == "0001101."  # 4 * 22 = 88
    assert _solve_stack_manipulation("0110bpp", 7) == "110."
    assert _solve_odds_first("00110101", 8) == "01000111"
    assert _solve_sqrt("100101", 6) == "110"  # floor(sqrt(37)) = 6
    assert _solve_modular_arithmetic("0*1+4*3-2", 9) == "0"
    assert _solve_missing_duplicate("01100?10", 8) == "1"  # "01100210 -> 1"
    assert _solve_missing_duplicate("1011?1#", 7) == "0"  # "1011213 -> 0"


@pytest.mark.parametrize("task", GENERATED)
def test_deterministic_and_index_varied(task):
    n = 9 if task != "lego" else 6
    first = synthetic.example(task, n, 3, 5)
    assert synthetic.example(task, n, 3, 5) == first
    assert synthetic.examples(task, n, 8, 3)[5] == first
    pairs = synthetic.examples(task, n, 8, 3)
    assert len(set(pairs)) > 1
    assert synthetic.examples(task, n, 8, 4) != pairs  # the seed matters


@pytest.mark.parametrize("task", GENERATED)
def test_alphabet(task):
    symbols = set()
    lengths = [n for n in (3, 5, 7, 30) if _allowed(task, n)]
    for n in lengths:
        for inp, tgt in synthetic.examples(task, n, 200, 0):
            symbols |= set(inp + tgt)
    alphabet = synthetic.alphabet(task)
    assert len(set(alphabet)) == len(alphabet)
    assert symbols == set(alphabet)
    assert all(ord(c) < 256 for c in alphabet)


def _expected_rows(pairs, width):
    # The causal-LM rows built by hand: seq = input SEP target, shifted by one.
    inputs = np.zeros((len(pairs), width), np.int64)
    targets = np.zeros((len(pairs), width), np.int64)
    weights = np.zeros((len(pairs), width))
    for r, (inp, tgt) in enumerate(pairs):
        seq = [ord(c) for c in inp] + [SEP_ID] + [ord(c) for c in tgt]
        for j in range(len(seq) - 1):
            inputs[r, j] = seq[j]
            targets[r, j] = seq[j + 1]
            weights[r, j] = 1.0 if j + 1 > len(inp) else 0.0
    return inputs, targets, weights


def test_encode_weights_on_target_tokens_only():
    pairs = [("ab", "xyz"), ("0", "1"), ("hello", "")]
    batch = synthetic.encode(pairs, 9)
    inputs, targets, weights = _expected_rows(pairs, 9)
    np.testing.assert_array_equal(batch["inputs"], inputs)
    np.testing.assert_array_equal(batch["targets"], targets)
    np.testing.assert_array_equal(batch["weights"], weights)
    assert batch["inputs"].dtype == np.int32 and batch["weights"].dtype == np.float32
    np.testing.assert_array_equal(batch["prompt_len"], [3, 2, 6])
    np.testing.assert_array_equal(batch["target_len"], [3, 1, 0])
    # Row 0: inputs "a b SEP x y", targets "b SEP x y z", weights on x y z.
    assert list(batch["targets"][0, :5]) == [98, SEP_ID, 120, 121, 122]
    assert list(batch["weights"][0, :6]) == [0, 0, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="width 4 is too small"):
        synthetic.encode(pairs, 4)


def _decode_rows(batch):
    pairs = []
    for r in range(batch["inputs"].shape[0]):
        p, t = int(batch["prompt_len"][r]), int(batch["target_len"][r])
        seq = list(batch["inputs"][r, : p + t - 1]) + [batch["targets"][r, p + t - 2]]
        assert seq[p - 1] == SEP_ID
        assert batch["weights"][r].sum() == t
        pairs.append(("".join(map(chr, seq[: p - 1])), "".join(map(chr, seq[p:]))))
    return pairs


@pytest.mark.parametrize("length_per", [None, "batch", "row"])
@pytest.mark.parametrize("task", ["binary_addition", "modular_arithmetic", "lego", "addition"])
def test_train_batch_rows_reproducible(task, length_per):
    full = synthetic.train_batch(task, 8, 20, seed=3, step=11, length_per=length_per)
    width = synthetic.train_width(task, 20)
    assert full["inputs"].shape == (8, width)
    for rows in (slice(2, 5), [7, 0, 4]):
        part = synthetic.train_batch(task, 8, 20, seed=3, step=11, rows=rows, length_per=length_per)
        idx = list(range(8)[rows]) if isinstance(rows, slice) else rows
        for key in full:
            np.testing.assert_array_equal(part[key], full[key][idx], err_msg=key)
    # The rows are real examples of their lengths.
    for (inp, tgt), n in zip(_decode_rows(full), full["lengths"], strict=True):
        assert synthetic.check_length(task, int(n)) == n
        assert tgt == SOLVERS[task](inp, int(n))
    per = length_per or ("batch" if task in synthetic.RUOSS_TASKS else "row")
    # Delétang et al.: one length per batch; Kazemnejad et al.: lengths mixed within a batch.
    assert (len(set(full["lengths"].tolist())) == 1) == (per == "batch")
    later = synthetic.train_batch(task, 8, 20, seed=3, step=12, length_per=length_per)
    assert later["inputs"].shape == full["inputs"].shape
    assert not np.array_equal(later["inputs"], full["inputs"])


def test_train_lengths_uniform_over_allowed():
    lengths = [
        int(synthetic.train_batch("modular_arithmetic", 1, 9, seed=0, step=s)["lengths"][0])
        for s in range(300)
    ]
    assert set(lengths) == {1, 3, 5, 7, 9}
    assert min(np.bincount(lengths)[1::2]) > 30
    rows = synthetic.train_batch("copy", 400, 5, seed=0, step=0, min_length=2)["lengths"]
    assert set(rows.tolist()) == {2, 3, 4, 5}
    assert synthetic.train_width("copy", 5) == 5 + 1 + 5


def test_eval_batch():
    batch = synthetic.eval_batch("duplicate_string", 500, 3, seed=1)
    assert batch["inputs"].shape == (3, 500 + 1 + 1000)
    assert _decode_rows(batch) == synthetic.examples("duplicate_string", 500, 3, 1)


def test_errors():
    with pytest.raises(ValueError, match="unknown synthetic task 'nope'.*even_pairs.*lego, scan"):
        synthetic.example("nope", 5, 0, 0)
    bad = [
        ("parity_check", 0),
        ("modular_arithmetic", 4),
        ("solve_equation", 2),
        ("missing_duplicate_string", 1),
        ("binary_addition", 2),
        ("lego", 1),
        ("lego", 53),
        ("copy", -1),
    ]
    for task, n in bad:
        with pytest.raises(ValueError, match=f"'{task}' has no examples of length {n}; allowed"):
            synthetic.examples(task, n, 1, 0)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        synthetic.example("copy", 3, -1, 0)
    with pytest.raises(ValueError, match="no examples with lengths in"):
        synthetic.train_batch("solve_equation", 2, 2, seed=0, step=0)
    with pytest.raises(ValueError, match="length_per"):
        synthetic.train_batch("copy", 2, 2, seed=0, step=0, length_per="step")
    for task, message in (
        ("x", r"unknown synthetic task 'x'; allowed: even_pairs, .*, pcfg"),
        ("modular_arithmetic", r"'modular_arithmetic' has no examples of length 2; allowed: odd"),
    ):
        with pytest.raises(ValueError, match=message) as err:
            synthetic.check_length(task, 2)
        assert "\n" not in str(err.value)
