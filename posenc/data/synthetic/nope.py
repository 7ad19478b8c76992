"""The synthetic tasks of Kazemnejad et al. 2023.

Kazemnejad, Padhi, Natesan Ramamurthy, Das and Reddy 2023, "The Impact of Positional Encoding on
Length Generalization in Transformers" (NeurIPS), Sec. 3 and Appendix C, with the data set
builders of their code (McGill-NLP/length-generalization, `scripts/dataset_builders/`) for the
distributions and their instance processors for the answers (polynomial evaluation and summation
modulo 10).

The paper writes each example as an English prompt for a T5 tokenizer ("Compute 1 2 + 3 4 ?",
"The answer is 4 6 ."). posenc's models read bytes, so each task here keeps the paper's
distribution and answer but writes the input and target compactly, one character per symbol.
Its `length` is the paper's notion of length (the x-axis of its plots): the number of tokens,
digits, values, terms or variables. For copy, reverse, sorting, summation and parity that is
the input length; for addition, polynomial evaluation and LEGO the input is longer (see each
docstring and `max_input_length`).

Every generator is `f(rng, length) -> (input, target)`, drawing from a `numpy.random.Generator`.
"""

from __future__ import annotations

import string

import numpy as np

# Copy and reverse draw from 100 T5 tokens in the paper; one byte per symbol leaves us the 62
# ASCII letters and digits.
COPY_VOCAB = string.digits + string.ascii_letters
# Sorting (single-token variant) draws from 50 tokens ranked by their index; here the first 50
# characters of `COPY_VOCAB` in byte order, so the rank is the byte value.
SORT_VOCAB = "".join(sorted(COPY_VOCAB))[:50]
POLY_MODULUS = 10  # configs/data/s2s_poly.jsonnet: modulo_factor
SUM_MODULUS = 10  # configs/data/s2s_sum.jsonnet: modulo_factor
# LEGO variables: the paper's 26 lowercase letters; longer chains (beyond its test range) also
# take the uppercase ones.
LEGO_VARS = string.ascii_lowercase
LEGO_VARS_LONG = string.ascii_lowercase + string.ascii_uppercase


def copy(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Copy (Kazemnejad et al. 2023, App. C, "copy_multi_char"): `length` tokens uniform over
    62 symbols; target: the same tokens."""
    s = "".join(COPY_VOCAB[i] for i in rng.integers(0, len(COPY_VOCAB), length))
    return s, s


def reverse(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Reverse (Kazemnejad et al. 2023, App. C, "multi_char"): `length` tokens uniform over 62
    symbols; target: the tokens in reverse order."""
    s = "".join(COPY_VOCAB[i] for i in rng.integers(0, len(COPY_VOCAB), length))
    return s, s[::-1]


def _decimal(rng: np.random.Generator, digits: int) -> str:
    """A number uniform in [10**(digits-1), 10**digits) ([0, 10) for one digit), in decimal."""
    first = int(rng.integers(0 if digits == 1 else 1, 10))
    return str(first) + "".join(str(d) for d in rng.integers(0, 10, digits - 1))


def addition(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Addition (Kazemnejad et al. 2023, App. C, `make_addition_dataset.py`): "a+b" in decimal,
    most significant digit first, each operand uniform among the numbers of its digit count
    (no leading zeros). `length` is the digit count of the longer operand, the other's is
    uniform in [1, length], and which one comes first is a fair coin (the paper's bins are all
    pairs of digit counts; a test bin is out of distribution when either count is). Target:
    a + b in decimal. Input length: length + 1 + [1, length]."""
    a = _decimal(rng, length)
    b = _decimal(rng, int(rng.integers(1, length + 1)))
    if rng.integers(0, 2):
        a, b = b, a
    return f"{a}+{b}", str(int(a) + int(b))


def _signed(value: int) -> str:
    return ("-" if value < 0 else "+") + str(abs(value))


def polynomial_evaluation(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Polynomial evaluation (Kazemnejad et al. 2023, App. C, `make_poly_dataset.py`): `length`
    terms c * x**d with c uniform in [-3, 3], d in [0, 3], and x in [-2, 2]. Input: x with its
    sign, ":", then each term as sign, |c|, "x", d, e.g. "-2:+3x2-1x0" for 3x^2 - 1 at x = -2.
    Target: the value modulo 10, a digit. Input length: 3 + 4 * length."""
    coeffs = rng.integers(-3, 4, length)
    degrees = rng.integers(0, 4, length)
    x = int(rng.integers(-2, 3))
    value = sum(int(c) * x ** int(d) for c, d in zip(coeffs, degrees, strict=True))
    terms = "".join(f"{_signed(int(c))}x{d}" for c, d in zip(coeffs, degrees, strict=True))
    return f"{_signed(x)}:{terms}", str(value % POLY_MODULUS)


def sorting(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Sorting (Kazemnejad et al. 2023, App. C, single-token variant "sngd"): `length` tokens
    uniform over 50 ranked symbols; target: the tokens sorted by rank (byte order here)."""
    s = "".join(SORT_VOCAB[i] for i in rng.integers(0, len(SORT_VOCAB), length))
    return s, "".join(sorted(s))


def summation(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Summation (Kazemnejad et al. 2023, App. C, `make_sum_dataset.py` with the "s2s_sum"
    processor): `length` digits uniform in [1, 9]; target: their sum modulo 10."""
    values = rng.integers(1, 10, length)
    return "".join(str(v) for v in values), str(int(values.sum()) % SUM_MODULUS)


def parity(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Parity (Kazemnejad et al. 2023, App. C, `make_parity_dataset.py`): `length` bits; target:
    their sum modulo 2 (the paper asks "is the number of 1's even?": its "Yes" is our "0")."""
    s = "".join(str(b) for b in rng.integers(0, 2, length))
    return s, str(s.count("1") % 2)


def lego(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """LEGO (Zhang et al. 2022, "Unveiling Transformers with LEGO", as in Kazemnejad et al.
    2023, App. C, `make_lego_dataset.py`, clauses in chain order): `length` variables with
    distinct names from a random permutation of the letters; the first is "+1" or "-1", each
    next one "+" or "-" the previous (values uniform bits). The query is a variable of the
    second half of the chain (index uniform in [ceil(length / 2), length - 1]; the paper
    enumerates all of them). Input: "a=+1,b=-a,c=+b?c" (length 3 with query c); target: the
    query's sign, "+" or "-". Input length: 5 * length + 1. Lengths in [2, 52]."""
    names = LEGO_VARS if length <= len(LEGO_VARS) else LEGO_VARS_LONG
    perm = rng.permutation(len(names))
    names = [names[i] for i in perm[:length]]
    values = rng.integers(0, 2, length)  # 0 -> -1, 1 -> +1
    clauses = [f"{names[0]}={'-+'[values[0]]}1"]
    for i in range(1, length):
        sign = "+" if values[i] == values[i - 1] else "-"
        clauses.append(f"{names[i]}={sign}{names[i - 1]}")
    query = int(rng.integers((length + 1) // 2, length))
    return ",".join(clauses) + "?" + names[query], "-+"[values[query]]
