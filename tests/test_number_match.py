"""The precision rule: when a decimal stands for an exact value, worked out by hand at its edges."""

from fractions import Fraction

import pytest

from benchmarks.answer_extraction import NumberLiteral, read_number_literal
from benchmarks.number_match import MIN_SIGNIFICANT_DIGITS, decimal_stands_for, numbers_match


def literal(text):
    number = read_number_literal(text)
    assert number is not None, text
    return number


@pytest.mark.parametrize("text, unit, digits", [
    ("0.333333", Fraction(1, 10**6), 6),
    ("1.4142136", Fraction(1, 10**7), 8),
    ("0.000033", Fraction(1, 10**6), 2),      # leading zeros are not significant
    ("100.000", Fraction(1, 1000), 6),        # trailing zeros after the point are
    ("1,234.5", Fraction(1, 10), 5),
    ("4.5e33", Fraction(10**32), 2),          # scientific notation: the unit of the mantissa's last digit
    ("1.6 \\times 10^{-3}", Fraction(1, 10**4), 2),
    ("-2.50", Fraction(1, 100), 3),
])
def test_decimal_unit_and_significant_digits(text, unit, digits):
    number = literal(text)
    assert (number.unit, number.digits) == (unit, digits)


@pytest.mark.parametrize("text", ["109", "1,234", "\\frac{1}{3}", "-3/4", "5."])
def test_integers_and_fractions_are_exact(text):
    assert literal(text).unit is None


# 1/3 = 0.3333333...; sqrt(2) = 1.41421356237...
SQRT2 = Fraction(141421356237309504880, 10**20)


@pytest.mark.parametrize("decimal, value, expected", [
    ("0.333333", Fraction(1, 3), True),     # |1/3 - 0.333333| = 3.3e-7 <= 5e-7, six digits
    ("0.3333333", Fraction(1, 3), True),
    ("0.33", Fraction(1, 3), False),         # right to its two places, but two digits are too few
    ("0.33333", Fraction(1, 3), False),      # five digits: one short
    ("0.333334", Fraction(1, 3), False),     # |diff| = 6.7e-7 > 5e-7: not a rounding of 1/3
    ("0.666667", Fraction(2, 3), True),      # rounded up
    ("0.666666", Fraction(2, 3), False),     # truncated: |diff| = 6.7e-7 > 5e-7
    ("1.4142136", SQRT2, True),              # |diff| = 3.8e-8 <= 5e-8
    ("1.41421", SQRT2, True),                # six significant digits, five places
    ("1.414213", SQRT2, False),              # truncated: |diff| = 5.6e-7 > 5e-7
    ("33.3333", Fraction(100, 3), True),     # six significant digits, whatever the magnitude
    ("0.0000333333", Fraction(1, 30000), True),
    ("0.000033", Fraction(1, 30000), False),  # six places but two digits
    ("0.000000", Fraction(1, 3 * 10**7), False),  # zero has no significant digit
    ("0.1250000", Fraction(1, 8), True),     # exact, of course
    ("0.1234565", Fraction(2469131, 20000000), True),   # an exact tie (…6500): both neighbours pass
    ("0.1234566", Fraction(2469131, 20000000), True),
    ("109.000", Fraction(109), True),
    ("108.99999999", Fraction(109), False),  # ten digits, off by 1e-8 > 5e-9
])
def test_decimal_stands_for(decimal, value, expected):
    assert decimal_stands_for(literal(decimal), value) is expected


def test_minimum_is_six_significant_digits():
    assert MIN_SIGNIFICANT_DIGITS == 6
    # Exactly at the edge: 6 digits pass, 5 do not, for the same correctly rounded value of 2/7.
    assert decimal_stands_for(literal("0.285714"), Fraction(2, 7))
    assert not decimal_stands_for(literal("0.28571"), Fraction(2, 7))


def test_exact_numbers_never_round():
    # An integer is an exact claim: 142857 is not 1000000/7 = 142857.142857...
    assert not decimal_stands_for(literal("142857"), Fraction(1000000, 7))
    assert numbers_match(literal("142857"), literal("\\frac{1000000}{7}")) == (False, "exact")
    assert numbers_match(literal("\\frac{1}{3}"), literal("\\frac{2}{6}")) == (True, "exact")


def test_numbers_match_either_order():
    assert numbers_match(literal("0.333333"), literal("\\frac{1}{3}")) == (True, "rounding")
    assert numbers_match(literal("\\frac{1}{3}"), literal("0.333333")) == (True, "rounding")
    assert numbers_match(literal("0.33"), literal("1/3")) == (False, "rounding")
    assert numbers_match(literal("0.5"), literal("\\frac{1}{2}")) == (True, "exact")


def test_two_decimals_the_coarser_decides():
    # 0.333333 (six digits) is 0.3333333 rounded; 0.3333 (four digits) is too coarse to stand for it.
    assert numbers_match(literal("0.3333333"), literal("0.333333"))[0]
    assert numbers_match(literal("0.333333"), literal("0.3333333"))[0]
    assert not numbers_match(literal("0.3333"), literal("0.3333333"))[0]
    # Two decimals to the same place: equal or different, no rounding between them.
    assert numbers_match(literal("0.333334"), literal("0.333333")) == (False, "exact")
    # Minerva-style golds with two digits match only exactly.
    assert numbers_match(literal("1.6"), literal("\\frac{8}{5}")) == (True, "exact")
    assert not numbers_match(literal("1.63"), literal("1.6"))[0]


def test_not_a_decimal_is_never_a_rounding():
    assert not decimal_stands_for(NumberLiteral(Fraction(1, 3)), Fraction(1, 3) + Fraction(1, 10**9))
