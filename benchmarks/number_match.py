"""When two numbers are the same answer: equal exactly, or one a decimal that is the other rounded.

math-verify compares a decimal with an exact value by rounding both to 6 decimal places, so that
0.333333 counts as 1/3 (its README: "Numeric equality within specified precision (e.g.,
0.333333 ≈ 1/3)"). The grader keeps that intent with a rule that does not depend on the size of
the number:

    A decimal stands for an exact value when it is that value rounded at its last written
    digit (within half a unit of that digit, so either neighbour of an exact tie passes) and it
    carries at least MIN_SIGNIFICANT_DIGITS = 6 significant digits.

So 0.333333, 0.3333333 and 0.33333333 are 1/3, and 1.4142136 and 1.41421 are sqrt(2); 0.33 and
0.33333 (too few digits), 0.333334 (not a rounding of 1/3) and 1.414213 (truncated, not rounded)
are not. Six digits, as math-verify's default, but counted as significant digits rather than
decimal places: 33.3333 is 100/3 here (math-verify wants 33.333333), and 0.000033 is not 1/30000
(math-verify accepts it, and even 0.0000003 for 1/3000000, since both round to 0.000000 at six
places). Reward safety: a decimal passes only when it is right to six digits, so a policy cannot
reach the reward without the answer; an integer is an exact claim and never a rounding (142857
is not 1000000/7).

When both numbers are decimals, the coarser one (fewer places) must be the finer one rounded,
with six significant digits itself; two decimals written to the same place must be equal.
"""

from fractions import Fraction

from benchmarks.answer_extraction import NumberLiteral

MIN_SIGNIFICANT_DIGITS = 6


def decimal_stands_for(decimal: NumberLiteral, value: Fraction) -> bool:
    """True when `decimal` is `value` rounded at its last written digit, with enough digits."""
    if decimal.unit is None or decimal.digits < MIN_SIGNIFICANT_DIGITS:
        return False
    return 2 * abs(value - decimal.value) <= decimal.unit


def numbers_match(a: NumberLiteral, b: NumberLiteral) -> tuple[bool, str]:
    """(same answer?, how it was decided: 'exact' or 'rounding') for two plain numbers."""
    if a.value == b.value:
        return True, "exact"
    if a.unit is None and b.unit is None:
        return False, "exact"
    # The coarser number decides; an exact value is finer than any decimal.
    coarse, fine = (a, b) if b.unit is None or (a.unit is not None and a.unit > b.unit) else (b, a)
    if fine.unit == coarse.unit:
        return False, "exact"
    return decimal_stands_for(coarse, fine.value), "rounding"
