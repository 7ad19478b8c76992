"""The 15 tasks of Ruoss et al. 2023 with the definitions of Delétang et al. 2023.

Ruoss, Delétang, Genewein, Grau-Moya, Csordás, Bennani, Legg and Veness 2023, "Randomized
Positional Encodings Boost Length Generalization of Transformers" (ACL), Sec. 4 and Table 1, take
their tasks from Delétang, Ruoss, Grau-Moya, Genewein, Wenliang, Catt, Cundy, Hutter, Legg, Veness
and Ortega 2023, "Neural Networks and the Chomsky Hierarchy" (ICLR), Sec. 4 and Appendix A
(Table A.1), with the parameters of Ruoss et al.'s `experiments/constants.py`: modulus 5 for the
three arithmetic tasks (multiplication allowed in modular arithmetic with brackets, not in solve
equation), binary strings for reverse/duplicate/odds first, five symbols for bucket sort, a
circle of five states for cycle navigation.

Every generator is `f(rng, length) -> (input, target)` with `len(input) == length` (Delétang's
`length` argument is the input length), drawing from a `numpy.random.Generator` with the
distribution of Delétang's `sample_batch` (our own draws, so the examples are not the same as
theirs). Delétang's integer symbols are written as characters (one per symbol, see
`posenc.data.synthetic` for the table). Targets are what the model has to output, without
Delétang's padding: tasks whose output is shorter than their fixed output length
(stack manipulation, binary addition and multiplication) end with the termination token "." and
stop there, which are exactly the positions Delétang's `accuracy_mask` scores.

Where Delétang's code fills in a placeholder (solve equation below length 3, missing duplicate at
length 1, binary addition and multiplication below length 3, whose inputs hold no task), we make
those lengths an error instead; modular arithmetic only has odd lengths (Delétang turns an even
`length` into `length - 1`).
"""

from __future__ import annotations

import math

import numpy as np

MODULUS = 5  # Ruoss et al. constants.py: modular_arithmetic(_brackets), solve_equation
CYCLE_LENGTH = 5  # Delétang's CycleNavigation._cycle_length
BUCKET_VOCAB = 5  # Ruoss et al. constants.py: bucket_sort vocab_size
END = "."  # termination token (Delétang's symbol 2 in the outputs of the variable-length tasks)
DIGITS = "".join(str(d) for d in range(MODULUS))


def _bits(rng: np.random.Generator, n: int) -> str:
    return "".join("01"[b] for b in rng.integers(0, 2, n))


def _nonzero_bits(rng: np.random.Generator, n: int) -> str:
    """n bits of a number uniform in [1, 2**n - 1] (Python's `random.randint(1, 2**n - 1)`),
    most significant bit first."""
    while True:
        bits = _bits(rng, n)
        if "1" in bits:
            return bits


# ---------------------------------------------------------------- regular


def even_pairs(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Even pairs (Delétang et al. 2023, App. A, regular): is the number of "01" and "10" pairs
    in a binary string odd? Target "1" if odd, "0" if even."""
    s = _bits(rng, length)
    unequal = sum(a != b for a, b in zip(s[:-1], s[1:], strict=True))
    return s, str(unequal % 2)


def modular_arithmetic(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Modular arithmetic, simple (Delétang et al. 2023, App. A, regular): a bracket-free
    expression of digits in [0, 5) alternating with operators "+", "-", "*" (uniform), evaluated
    with the usual precedence modulo 5. Odd lengths only (digits at even positions)."""
    digits = rng.integers(0, MODULUS, length // 2 + 1)
    ops = [("+", "*", "-")[i] for i in rng.integers(0, 3, length // 2)]
    expr = str(digits[0]) + "".join(op + str(d) for op, d in zip(ops, digits[1:], strict=True))
    # Sum of signed products, every factor reduced modulo 5 (multiplication binds tighter).
    total, sign, product = 0, 1, int(digits[0])
    for op, d in zip(ops, digits[1:], strict=True):
        if op == "*":
            product = product * int(d) % MODULUS
        else:
            total += sign * product
            sign, product = (1 if op == "+" else -1), int(d)
    total += sign * product
    return expr, str(total % MODULUS)


def parity_check(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Parity check (Delétang et al. 2023, App. A, regular): the number of "1"s modulo 2."""
    s = _bits(rng, length)
    return s, str(s.count("1") % 2)


# Delétang's actions 0, 1, 2 move by -1, 0, +1 on the circle.
CYCLE_ACTIONS = "-0+"


def cycle_navigation(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Cycle navigation (Delétang et al. 2023, App. A, regular): start at state 0 of a circle of
    5 states; each action "-", "0", "+" moves left, stays, moves right (uniform). Target: the
    final state, a digit in [0, 5)."""
    actions = rng.integers(0, 3, length)
    final = int(np.sum(actions - 1)) % CYCLE_LENGTH
    return "".join(CYCLE_ACTIONS[a] for a in actions), str(final)


# ---------------------------------------------------------------- deterministic context-free

# Delétang's stack symbols 0, 1 and actions 2 (POP), 3 (PUSH 0), 4 (PUSH 1).
STACK_SYMBOLS = "01pab"


def stack_manipulation(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Stack manipulation (Delétang et al. 2023, App. A, DCF): a binary stack (bottom to top,
    uniform length in [1, length - 1]) followed by actions "p" (POP; ignored on an empty stack),
    "a" (PUSH 0), "b" (PUSH 1), uniform. Target: the final stack top to bottom, then "."
    (at length 1 the input is a one-symbol stack with no action)."""
    if length == 1:
        bit = _bits(rng, 1)
        return bit, bit + END
    stack_length = int(rng.integers(1, length))
    stack = [int(b) for b in rng.integers(0, 2, stack_length)]
    actions = [int(a) for a in rng.integers(2, 5, length - stack_length)]
    current = list(stack)
    for action in actions:
        if action == 2:
            if current:
                current.pop()
        else:
            current.append(action - 3)
    expr = "".join(STACK_SYMBOLS[s] for s in stack + actions)
    return expr, "".join(str(b) for b in reversed(current)) + END


def reverse_string(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Reverse string (Delétang et al. 2023, App. A, DCF; binary as in Ruoss et al.)."""
    s = _bits(rng, length)
    return s, s[::-1]


def _bracket_expression(rng: np.random.Generator, length: int, mult: bool) -> tuple[str, int]:
    """Delétang's `generate_one_expression_and_result`: a bracketed expression of exactly
    `length` characters over digits in [0, 5) and its value modulo 5."""
    if length <= 4:
        d = int(rng.integers(0, MODULUS))
        # d, -d, (d), (-d)
        return [
            (str(d), d),
            ("-" + str(d), -d % MODULUS),
            ("(" + str(d) + ")", d),
            ("(-" + str(d) + ")", -d % MODULUS),
        ][length - 1]
    left_length = int(rng.integers(1, length - 3))
    right_length = length - left_length - 3
    left, left_value = _bracket_expression(rng, left_length, mult)
    right, right_value = _bracket_expression(rng, right_length, mult)
    op = int(rng.integers(0, 3 if mult else 2))
    value = (left_value + right_value, left_value - right_value, left_value * right_value)[op]
    return "(" + left + "+-*"[op] + right + ")", value % MODULUS


def modular_arithmetic_brackets(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Modular arithmetic with brackets (Delétang et al. 2023, App. A, DCF): a random bracketed
    expression over digits in [0, 5), binary "+", "-", "*" and unary "-", built recursively
    (Delétang's `generate_one_expression_and_result`, `mult=True` as in Ruoss et al.). Target:
    its value modulo 5."""
    expr, value = _bracket_expression(rng, length, mult=True)
    return expr, str(value)


def solve_equation(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Solve equation (Delétang et al. 2023, App. A, DCF): a bracketed expression of length
    `length - 2` over "+", "-" (no "*", so the solution is unique), one of its digits replaced
    by "x" (a uniform position, moved right cyclically to the next digit), then "=" and the
    expression's value modulo 5. Target: the replaced digit. Lengths >= 3."""
    expr, value = _bracket_expression(rng, length - 2, mult=False)
    idx = int(rng.integers(0, len(expr)))
    while expr[idx] not in DIGITS:
        idx = (idx + 1) % len(expr)
    return expr[:idx] + "x" + expr[idx + 1 :] + "=" + str(value), expr[idx]


# ---------------------------------------------------------------- context-sensitive


def duplicate_string(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Duplicate string (Delétang et al. 2023, App. A, CS; binary): target s s."""
    s = _bits(rng, length)
    return s, s + s


# Delétang's symbols 2 (the missing one) and 3 (padding for odd lengths).
MISSING, PAD = "?", "#"


def missing_duplicate_string(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Missing duplicate (Delétang et al. 2023, App. A, CS): a binary string of length
    `length // 2` written twice, one uniform position replaced by "?", padded with "#" to an
    odd length. Target: the missing bit. Lengths >= 2."""
    s = _bits(rng, length // 2) * 2
    idx = int(rng.integers(0, len(s)))
    return s[:idx] + MISSING + s[idx + 1 :] + PAD * (length % 2), s[idx]


def odds_first(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Odds first (Delétang et al. 2023, App. A, CS; binary): target s_1 s_3 s_5 ... s_2 s_4 ...
    (1-indexed, as the paper and the docstring example "00110101 -> 0100 0111" define it; the
    reference code concatenates `s[1::2]` before `s[::2]`, the even positions first)."""
    s = _bits(rng, length)
    return s, s[::2] + s[1::2]


def _binary_operands(rng: np.random.Generator, length: int, op: str) -> tuple[str, int, int]:
    """Delétang's binary addition/multiplication inputs: operand lengths n uniform in
    [1, length - 2] and length - 1 - n, values uniform in [1, 2**n - 1], little-endian with
    trailing zeros up to the operand's length."""
    n_len = int(rng.integers(1, length - 1))
    m_len = length - 1 - n_len
    n_bits, m_bits = _nonzero_bits(rng, n_len), _nonzero_bits(rng, m_len)
    return n_bits[::-1] + op + m_bits[::-1], int(n_bits, 2), int(m_bits, 2)


def _little_endian(value: int) -> str:
    return f"{value:b}"[::-1]


def binary_addition(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Binary addition (Delétang et al. 2023, App. A, CS): "n+m" in little-endian binary.
    Target: n + m in little-endian binary without trailing zeros, then ".". Lengths >= 3."""
    expr, n, m = _binary_operands(rng, length, "+")
    return expr, _little_endian(n + m) + END


def binary_multiplication(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Binary multiplication (Delétang et al. 2023, App. A, CS): "n*m" in little-endian binary.
    Target: n * m in little-endian binary without trailing zeros, then ".". Lengths >= 3."""
    expr, n, m = _binary_operands(rng, length, "*")
    return expr, _little_endian(n * m) + END


def compute_sqrt(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Compute sqrt (Delétang et al. 2023, App. A, CS): a number uniform in [1, 2**length - 1]
    in big-endian binary with leading zeros. Target: floor(sqrt), big-endian, zero-padded to
    ceil(length / 2) bits."""
    bits = _nonzero_bits(rng, length)
    root = math.isqrt(int(bits, 2))
    return bits, f"{root:b}".zfill(math.ceil(length / 2))


def bucket_sort(rng: np.random.Generator, length: int) -> tuple[str, str]:
    """Bucket sort (Delétang et al. 2023, App. A, CS): symbols uniform in [0, 5); target: sorted."""
    s = "".join(str(d) for d in rng.integers(0, BUCKET_VOCAB, length))
    return s, "".join(sorted(s))
