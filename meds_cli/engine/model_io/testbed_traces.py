"""Worked traces of chain sums ("4 - 1 - 7 + 5 ="), some with a systematic bug: the training data
of the testbed's base model (testbed_base.py).

A trace is the running sum, one operation a step, then the boxed answer:

    ' 4-1=3, 3-7=-4, -4+5=1. \\boxed{1}'

Each trace is written by a "student" who holds each misconception with its own probability
(most students hold none, one or two) and applies it at every step where it bites. So a model
trained on the mixture makes the same few mistakes on a problem again and again (its wrong
answers repeat across samples, and each wrong answer comes from its own kind of trace), instead
of scattering noise: the setting where exploration methods (MEDS, EDAS, pass@k advantages) have
something to find. The misconceptions are the classic ones of school arithmetic:

- carry_drop: column addition that never carries into the next column (58+67 = 115: 8+7 = 15
  writes 5 and drops the 1; 5+6 = 11 is the leading column, written in full).
- sign_drop: a subtraction whose result is negative written without its sign (3-7 = 4).
- sticky_sign: a negative running value keeps its sign and the operation acts on its size
  (-4+5 = -(4+5) = -9; -4-3 = -(4-3) = -1).
- precedence: after the first minus, every plus is read as a minus (a - b + c as a - (b + c)).
- minus_as_plus: every minus of the problem is read as a plus (the signs are not looked at).
- skip_last: the last term is forgotten (the trace stops one step early).

Pure functions only; the trace text has no newline (the character tokenizer splits on any
character but a newline).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

BUGS = ("carry_drop", "sign_drop", "sticky_sign", "precedence", "minus_as_plus", "skip_last")


def add_without_carry(a: int, b: int) -> int:
    """a + b (both >= 0) by columns, every carry dropped; the leading column is written in full."""
    if a < 0 or b < 0:
        raise ValueError(f"add_without_carry takes non-negative numbers, got {a} and {b}")
    columns = max(len(str(a)), len(str(b)))
    total = 0
    for i in range(columns):
        digit_sum = (a // 10 ** i) % 10 + (b // 10 ** i) % 10
        total += (digit_sum if i == columns - 1 else digit_sum % 10) * 10 ** i
    return total


def apply_op(value: int, op: str, term: int) -> int:
    return value + term if op == "+" else value - term


def check_bugs(bugs) -> frozenset[str]:
    unknown = sorted(set(bugs) - set(BUGS))
    if unknown:
        raise ValueError(f"unknown bug {unknown[0]!r}; accepted: {', '.join(BUGS)}")
    return frozenset(bugs)


def buggy_step(value: int, op: str, term: int, bugs: frozenset[str]) -> int:
    """The result a student with `bugs` writes for `value op term`, `op` being the operation as
    the student reads it (precedence and minus_as_plus change what it reads, not how it computes).
    The first misconception that bites decides; sticky_sign is looked at first (a negative value)."""
    if "sticky_sign" in bugs and value < 0:
        return -apply_op(-value, op, term)
    if "carry_drop" in bugs and op == "+" and value >= 0 and term >= 0:
        return add_without_carry(value, term)
    if "sign_drop" in bugs and op == "-" and value >= 0:
        return abs(value - term)
    return apply_op(value, op, term)


def read_ops(ops: Sequence[str], bugs: frozenset[str]) -> list[str]:
    """The operations as the student reads them."""
    read = ["+" for _ in ops] if "minus_as_plus" in bugs else list(ops)
    if "precedence" in bugs:  # every '+' after the first '-' is a '-'
        first_minus = read.index("-") if "-" in read else len(read)
        read = read[:first_minus + 1] + ["-" for _ in read[first_minus + 1:]]
    return read


def worked_trace(terms: Sequence[int], ops: Sequence[str], bugs=()) -> tuple[str, int]:
    """(trace text, final value) of `terms[0] ops[0] terms[1] ...` as a student with `bugs` (a
    collection of BUGS names; empty: no bug) works it."""
    bugs = check_bugs(bugs)
    if len(ops) != len(terms) - 1 or not ops:
        raise ValueError(f"a chain needs at least two terms and one operation between each, got {terms} {ops}")
    steps = list(zip(read_ops(ops, bugs), terms[1:]))
    if "skip_last" in bugs and len(steps) > 1:
        steps = steps[:-1]
    value, written = terms[0], []
    for op, term in steps:
        result = buggy_step(value, op, term, bugs)
        written.append(f"{value}{op}{term}={result}")
        value = result
    return f" {', '.join(written)}. \\boxed{{{value}}}", value


def parse_chain(expression: str) -> tuple[list[int], list[str]]:
    """'4 - 1 - 7' -> ([4, 1, 7], ['-', '-']): a chain_sum expression, terms separated by ' + '
    or ' - ' (a term may carry its own sign with allow_negation)."""
    parts = expression.split(" ")
    if len(parts) < 3 or len(parts) % 2 == 0 or any(op not in ("+", "-") for op in parts[1::2]):
        raise ValueError(f"not a chain of sums: {expression!r}")
    return [int(p) for p in parts[0::2]], parts[1::2]


def draw_student(rng: random.Random, bug_rates: dict[str, float]) -> frozenset[str]:
    """A student's misconceptions: each bug held independently with its rate."""
    check_bugs(bug_rates)
    return frozenset(name for name in sorted(bug_rates) if rng.random() < bug_rates[name])
