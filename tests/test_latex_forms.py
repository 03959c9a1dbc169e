"""One spelling for equal LaTeX (benchmarks/latex_forms.py), and the grader on the forms it
settles (issue 38: \\cfrac, \\dfrac, \\tfrac in every position, \\left...\\right around a whole
answer, brace-less arguments), each against the plain form."""

import pytest

from benchmarks.answer_extraction import answer_key, number_literal_value
from benchmarks.latex_forms import plain_latex
from benchmarks.math_grading import MathGrader


@pytest.mark.parametrize("text, plain", [
    ("\\cfrac{1}{3}", "\\frac{1}{3}"),
    ("\\dfrac{1}{3}", "\\frac{1}{3}"),
    ("\\tfrac{1}{3}", "\\frac{1}{3}"),
    ("\\sqrt{\\cfrac{\\pi}{2}}", "\\sqrt{\\frac{\\pi}{2}}"),
    ("\\frac13", "\\frac{1}{3}"),
    ("\\frac3{3}", "\\frac{3}{3}"),
    ("\\frac{1}3", "\\frac{1}{3}"),
    ("\\frac\\pi2", "\\frac{\\pi}{2}"),
    ("\\frac{\\frac12}{3}", "\\frac{\\frac{1}{2}}{3}"),  # nested: each \frac braced
    ("\\frac123", "\\frac{1}{2}3"),  # TeX takes one token per argument
    ("\\sqrt2", "\\sqrt{2}"),
    ("2\\sqrt3x", "2\\sqrt{3}x"),
    ("\\sqrt[3]2", "\\sqrt[3]{2}"),
    ("\\left( \\frac{1}{3} \\right)", "( \\frac{1}{3} )"),
    ("\\left\\{ 1, 2 \\right\\}", "\\{ 1, 2 \\}"),
    ("\\left. x \\right|_0^1", " x |_0^1"),  # the null delimiter goes entirely
    ("\\leftarrow \\rightarrow", "\\leftarrow \\rightarrow"),  # not sizing commands
    ("\\frac{", "\\frac{"),  # malformed text is left as it is
    ("\\sqrt[", "\\sqrt["),
])
def test_plain_latex(text, plain):
    assert plain_latex(text) == plain


def test_plain_latex_is_linear_on_long_nested_input():
    # 20,000 nested brace-less fractions: one pass each, no quadratic rescan (a few ms)
    text = "\\frac1" * 20_000 + "2"
    assert plain_latex(text).count("{") == 40_000


@pytest.mark.parametrize("text, value", [
    ("\\cfrac{1}{3}", "1/3"), ("\\frac3{3}", "1"), ("\\frac13", "1/3"), ("\\frac1{3}", "1/3"),
    ("\\left( \\frac{1}{3} \\right)", "1/3"), ("(-2)", "-2"), ("\\left. 5 \\right.", "5"),
    ("125\\textnormal{ miles}", "125"), ("28 percent", "28"),
    # not literals: an operator, a pair, a set, an absolute value
    ("\\left( 27 + 82 \\right)", None), ("(1,234)", None), ("\\left\\{ 2 \\right\\}", None),
    ("\\left| -3 \\right|", None),
])
def test_number_literals_in_these_forms(text, value):
    from fractions import Fraction

    assert number_literal_value(text) == (Fraction(value) if value is not None else None)


def test_answer_keys_agree_across_forms():
    assert answer_key("\\sqrt2") == answer_key("\\sqrt{2}")
    assert answer_key("\\cfrac{\\pi}{2}") == answer_key("\\frac{\\pi}{2}") == answer_key("\\frac\\pi2")
    assert answer_key("\\left( x, y \\right)") == answer_key("(x, y)")


@pytest.fixture(scope="module")
def grader():
    with MathGrader(workers=2, timeout_s=4.0) as g:
        yield g


EQUAL_TO_PLAIN = [
    # (prediction, gold): the form on either side, and inside larger answers
    ("\\cfrac{1}{3}", "\\frac{1}{3}"), ("\\frac{1}{3}", "\\cfrac{1}{3}"), ("\\cfrac{1}{3}", "1/3"),
    ("\\dfrac{1}{3}", "1/3"), ("\\tfrac{1}{3}", "0.333333"), ("1/3", "\\tfrac{1}{3}"),
    ("\\sqrt{\\cfrac{1}{3}}", "\\frac{\\sqrt{3}}{3}"), ("(\\tfrac12, 3)", "(\\frac{1}{2}, 3)"),
    ("\\cfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}"), ("x = \\dfrac{\\pi}{4}", "\\frac{\\pi}{4}"),
    ("\\left( \\frac{1}{3} \\right)", "\\frac{1}{3}"), ("\\left( \\frac{1}{3} \\right)", "1/3"),
    ("\\frac{1}{3}", "\\left( \\frac{1}{3} \\right)"), ("\\left[ 0, 1 \\right)", "[0, 1)"),
    ("\\left\\{ 1, 2 \\right\\}", "\\{1, 2\\}"), ("\\left. 5 \\right.", "5"),
    ("\\frac3{3}", "1"), ("\\frac13", "1/3"), ("\\frac1{3}", "\\frac{1}{3}"), ("\\sqrt2", "\\sqrt{2}"),
    ("\\sqrt[3]2", "\\sqrt[3]{2}"), ("\\sqrt[3]2", "2^{1/3}"), ("\\frac{\\sqrt2}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("125\\textnormal{ miles}", "125"), ("28 percent", "28\\%"), ("28 pct", "0.28"),
]

STILL_WRONG = [
    # reward safety: an operator between numbers is not the number, in any of these forms
    ("\\left( 27 + 82 \\right)", "109"), ("\\frac{27 + 82}{1}", "109"), ("\\sqrt{11881}", "109"),
    ("\\left| -3 \\right|", "3"), ("\\cfrac{1}{4}", "\\frac{1}{3}"), ("\\sqrt3", "\\sqrt{2}"),
]


def test_forms_equal_their_plain_forms(grader):
    verdicts = grader.grade_many(EQUAL_TO_PLAIN)
    assert [(pair, v.outcome, v.detail) for pair, v in zip(EQUAL_TO_PLAIN, verdicts) if not v.correct] == []


def test_forms_do_not_open_a_way_around_the_strict_rule(grader):
    verdicts = grader.grade_many(STILL_WRONG)
    assert [pair for pair, v in zip(STILL_WRONG, verdicts) if v.correct] == []
