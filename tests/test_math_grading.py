"""Math equivalence through the worker pool: equivalences, the strict reward rule, time-outs."""

import time
from pathlib import Path

import pytest

from benchmarks.math_grading import MathGrader, grade_response, grade_responses, integer_answer_equal


def sleepy_judge(pred, gold, op_timeout):
    """A judge that never answers and ignores signals' time: only a hard kill ends it."""
    time.sleep(3600)


@pytest.fixture(scope="module")
def grader():
    with MathGrader(workers=2, timeout_s=4.0) as g:
        yield g


EQUIVALENT = [
    # (prediction, gold)
    ("0.5", "\\frac12"),
    ("\\frac{1}{2}", "0.5"),
    ("1/2", "\\frac{1}{2}"),
    ("\\dfrac{3}{4}", "0.75"),
    ("(1,2]", "(1,2]"),
    ("\\left(1, 2\\right]", "(1,2]"),
    ("90", "90^\\circ"),
    ("90^\\circ", "90"),
    ("\\text{Evelyn}", "\\text{Evelyn}"),
    ("Evelyn", "\\text{Evelyn}"),
    ("\\{2, 1\\}", "\\{1,2\\}"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("x=5", "5"),
    ("1,234", "1234"),
    ("4.5\\times 10^{33}", "4.5e33"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("6-5i", "6 - 5i"),
    ("3,5,7", "3, 5, 7"),
    ("-\\frac{1}{3}", "-1./3"),
]

NOT_EQUIVALENT = [
    ("27 + 82", "109"),  # boxing the question: rejected in strict mode
    ("10^2", "100"),
    ("\\sqrt{4}", "2"),
    ("3 \\cdot 4", "12"),
    ("\\frac{1}{3}", "0.5"),
    ("[1,2]", "(1,2]"),
    ("\\text{Bob}", "\\text{Evelyn}"),
    ("\\{1,3\\}", "\\{1,2\\}"),
    ("2\\sqrt{3}", "2\\sqrt{2}"),
    ("108", "109"),
    ("x+1", "x+2"),
]


def test_equivalent_pairs(grader):
    verdicts = grader.grade_many(EQUIVALENT)
    wrong = [(pair, v.outcome, v.detail) for pair, v in zip(EQUIVALENT, verdicts) if not v.correct]
    assert wrong == []


def test_non_equivalent_pairs(grader):
    verdicts = grader.grade_many(NOT_EQUIVALENT)
    accepted = [pair for pair, v in zip(NOT_EQUIVALENT, verdicts) if v.correct]
    assert accepted == []
    assert all(v.outcome == "wrong" for v in verdicts)
    assert verdicts[0].detail["by"] == "strict"


def test_lenient_mode_shows_the_hazard(grader):
    # Without the strict rule math-verify rewards boxing the question.
    assert grader.grade_many([("27 + 82", "109")], strict=False)[0].correct
    # Expressions against expression golds are unaffected by strictness.
    assert grader.grade_many([("2\\sqrt{2}", "\\sqrt{8}")], strict=True)[0].correct


def test_no_answer(grader):
    verdicts = grader.grade_many([(None, "5"), ("  ", "5")])
    assert [v.outcome for v in verdicts] == ["no_answer", "no_answer"]
    assert not any(v.correct for v in verdicts)


def test_grade_responses_extraction(grader):
    pairs = [
        ("so the total is \\boxed{109}.", "109"),
        ("27 + 82 = \\boxed{27 + 82}", "109"),
        ("the answer is 109", "109"),
    ]
    assert [v.outcome for v in grader.grade_responses(pairs)] == ["correct", "wrong", "no_answer"]
    lenient = grader.grade_responses(pairs, extraction="boxed_then_last_number")
    assert [v.outcome for v in lenient] == ["correct", "wrong", "correct"]
    assert lenient[2].extracted == "109"


def test_pathological_answers_return_quickly(grader):
    pairs = [("9^9^9^9", "109"), ("9^{9^{9^{9}}}", "p - q"), ("x" * 100_000, "p - q"), ("(" * 50_000, "2\\sqrt{2}")]
    start = time.monotonic()
    verdicts = grader.grade_many(pairs, strict=False)
    # Each answer gets at most timeout_s = 4 s on one of 2 workers: 4 answers, ~8 s worst case.
    assert time.monotonic() - start < 20
    assert not any(v.correct for v in verdicts)
    assert all(v.outcome in ("timeout", "wrong") for v in verdicts)
    # The pool still works afterwards.
    assert grader.grade_many([("\\sqrt{8}", "2\\sqrt{2}")])[0].correct


def test_hung_worker_is_killed_and_replaced(monkeypatch):
    # Workers import the judge by name; make this file importable whatever pytest's import mode.
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with MathGrader(workers=3, timeout_s=1.0, judge="test_math_grading:sleepy_judge") as g:
        start = time.monotonic()
        verdicts = g.grade_many([("x", "y"), ("a", "b"), ("c", "d")])
        elapsed = time.monotonic() - start
        assert [v.outcome for v in verdicts] == ["timeout"] * 3
        assert g.restarts == 3
        assert g.counts["timeout"] == 3
        # Three workers, three 1 s jobs at once: ~1 s once the workers have started.
        assert elapsed < 30


def test_worker_killed_from_outside_loses_nothing(grader):
    grader.grade_many([("x+1", "x+1")])  # make sure workers exist
    restarts = grader.restarts
    for worker in grader._pool:
        worker.process.kill()
        worker.process.wait()
    verdicts = grader.grade_many([("x+1", "1+x"), ("y", "y")])
    assert all(v.correct for v in verdicts)
    assert grader.restarts >= restarts + 1


def test_grade_response_convenience():
    assert grade_response("\\boxed{\\frac{1}{2}}", "0.5").correct
    assert not grade_response("\\boxed{27 + 82}", "109").correct
    verdicts = grade_responses(["\\boxed{7}", "7", "\\boxed{x+1}"], ["7", "7", "1+x"])
    assert [v.outcome for v in verdicts] == ["correct", "no_answer", "correct"]
    with pytest.raises(ValueError):
        grade_responses(["a"], [])


def test_integer_answer_equal():
    assert integer_answer_equal("109", 109)
    assert integer_answer_equal(" $1,234$ ", 1234)
    assert integer_answer_equal("-7", -7)
    assert integer_answer_equal("\\text{42}", 42)
    assert not integer_answer_equal("27 + 82", 109)
    assert not integer_answer_equal("109.0", 109)
    assert not integer_answer_equal("108", 109)
    assert not integer_answer_equal(None, 109)


# --- decimals for exact answers (benchmarks.number_match's rule) -------------------------------

DECIMALS = [
    # (prediction, gold, correct)
    ("0.333333", "\\frac{1}{3}", True),    # six significant digits, correctly rounded
    ("0.33", "\\frac{1}{3}", False),       # right to two places, but too few digits to stand for 1/3
    ("0.33333", "\\frac{1}{3}", False),
    ("0.333334", "\\frac{1}{3}", False),   # six digits, but not a rounding of 1/3
    ("1.4142136", "\\sqrt{2}", True),      # a symbolic gold: SymPy evaluates it in the worker
    ("1.41421", "\\sqrt{2}", True),
    ("1.414", "\\sqrt{2}", False),
    ("1.414213", "\\sqrt{2}", False),      # truncated, not rounded
    ("2.82843", "2\\sqrt{2}", True),
    ("3.14159", "\\pi", True),
    ("0.785398", "\\frac{\\pi}{4}", True),
    ("1.0", "\\sqrt{1}", True),            # too few digits for a rounding, but exactly equal
    ("x = 0.333333", "\\frac{1}{3}", True),
    ("0.3333333\\text{ m}", "\\frac{1}{3}", True),
    ("1.5", "x + 1", False),
    ("108.999999", "109", False),          # an integer gold is exact: six digits but off by 1e-6
    ("109.000000", "109", True),
]


def test_decimals_against_exact_golds(grader):
    verdicts = grader.grade_many([(pred, gold) for pred, gold, _ in DECIMALS])
    assert [(p, g, v.correct) for (p, g, _), v in zip(DECIMALS, verdicts)] == DECIMALS
    assert verdicts[0].detail["by"] == verdicts[4].detail["by"] == "rounding"


def test_boxed_expression_is_still_not_a_number(grader):
    # The decimal rule adds no way to game the reward: an expression stays an expression.
    pairs = [("0.333333 + 0", "\\frac{1}{3}"), ("\\frac{1}{3} \\cdot 1", "0.333333"), ("27 + 82", "109.000000")]
    verdicts = grader.grade_many(pairs)
    assert [v.outcome for v in verdicts] == ["wrong"] * 3
    assert all(v.detail["reason"] == "not a number literal" for v in verdicts)
    responses = grader.grade_responses([("so \\boxed{0.333333}", "\\frac{1}{3}"), ("\\boxed{1/3 + 0}", "0.333333")])
    assert [v.correct for v in responses] == [True, False]


SEPARATED = [
    # (prediction, gold, correct): a separator never joins two numbers into one
    ("2 7", "27", False),
    ("32, 349", "32349", False),
    ("32 349", "32349", False),
    ("2\\ 7", "27", False),
    ("32,349", "32349", True),
    ("32{,}349", "32349", True),
    ("32,\\!349", "32349", True),
    ("32\\,349", "32349", True),
    # MATH train's answer to "find all solutions to sqrt[4]{x} = 12/(7 - sqrt[4]{x})": two numbers
    ("81256", "81, 256", False),
    ("81,256", "81, 256", False),
    ("81, 256", "81, 256", True),
    ("256, 81", "81, 256", True),
]


@pytest.mark.parametrize("strict", [True, False])
def test_separators_never_join_numbers(grader, strict):
    verdicts = grader.grade_many([(pred, gold) for pred, gold, _ in SEPARATED], strict=strict)
    assert [(p, g, v.correct) for (p, g, _), v in zip(SEPARATED, verdicts)] == SEPARATED


# --- math-verify's documented behaviour -------------------------------------------------------
# Each pair follows a behaviour math-verify (0.9.0) documents: its README ("Key Features", "Gold
# Comparison", FAQ) or its own test suite (tests/test_all.py). The comment names which.

MATH_VERIFY_EQUIVALENT = [
    # README, Gold Comparison: "Numeric equality within specified precision (e.g., 0.333333 ≈ 1/3)"
    ("0.333333", "\\frac{1}{3}"),
    # tests/test_all.py, "Tests from qwen parser": "Test decimal vs fraction equivalence"
    ("0.0833333333333333", "\\frac{1}{12}"),
    # same test: a decimal inside a tuple (math-verify's own six-place rounding applies there)
    ("(1,4.5)", "(1,\\frac{9}{2})"),
    # README, Key Features: "Applies Latex fixes for common malformations (e.g. frac13 -> 1/3)"
    ("\\frac13", "\\frac{1}{3}"),
    # README, Key Features: "symbol assignment resolution (e.g. x = 1 -> 1)"
    ("x = 1", "1"),
    # README, Key Features: "Percentage best effort conversion (e.g. 10% -> 0.1)"
    ("10\\%", "0.1"),
    # README, Key Features: "Units in text handling (e.g. 10 cm -> 10)"
    ("10\\text{ cm}", "10"),
    # README, Example Usage: verify(parse("${1,3} \\cup {2,4}$"), parse("${1,2,3,4}$")) is True
    ("\\{1,2,3,4\\}", "\\{1,3\\} \\cup \\{2,4\\}"),
    # tests/test_all.py, test_number_extraction: "Test for thousands separator" (7,425,000), and
    # "Test thousand separator with floating point number" (1,000.99)
    ("7,425,000", "7425000"),
    ("1,000.99", "1000.99"),
    # README, Key Features: "Relation evaluation with flip support (e.g., a < 2 == 2 > a)"
    ("2 > a", "a < 2"),
    # README, FAQ 1: gold an inequality, prediction the interval: True
    ("(1,2)", "1 < x < 2"),
]

MATH_VERIFY_NOT_EQUIVALENT = [
    # README, FAQ 1: gold an interval, prediction the inequality: False, so that a model cannot
    # be rewarded for restating the inequality it was asked to solve
    ("1 < x < 2", "(1,2)"),
    # tests/test_all.py, test_precision: 1/3 against 0.333 fails at float_rounding=4 (and at the
    # default 6); the grader's six significant digits refuse it too
    ("0.333", "\\frac{1}{3}"),
    # tests/test_all.py, test_number_extraction: "Test correct extraction of not correct answer"
    ("AZYUK2A", "2"),
]


def test_math_verify_documented_equivalences(grader):
    verdicts = grader.grade_many(MATH_VERIFY_EQUIVALENT)
    assert [(pair, v.outcome) for pair, v in zip(MATH_VERIFY_EQUIVALENT, verdicts) if not v.correct] == []


def test_math_verify_documented_non_equivalences(grader):
    for strict in (True, False):
        verdicts = grader.grade_many(MATH_VERIFY_NOT_EQUIVALENT, strict=strict)
        assert [pair for pair, v in zip(MATH_VERIFY_NOT_EQUIVALENT, verdicts) if v.correct] == []


def _math_verify(pred: str, gold: str, plain_text: bool) -> bool:
    """math-verify's own verdict: on boxed LaTeX, or on plain text (its ExprExtractionConfig, as
    in its test_number_extraction)."""
    from math_verify import ExprExtractionConfig, parse, verify

    if plain_text:
        return verify(parse(gold, [ExprExtractionConfig()]), parse(pred, [ExprExtractionConfig()]))
    return verify(parse("\\boxed{" + gold + "}"), parse("\\boxed{" + pred + "}"))


@pytest.mark.parametrize("pred, gold, plain_text, math_verify_says, grader_says", [
    # tests/test_all.py, test_number_extraction accepts a space as thousands separator ("1 000");
    # the grader does not: a space never joins numbers ("2 7" is not 27)
    ("1 000", "1000", True, True, False),
    # tests/test_all.py, test_number_extraction reads "1,22" as 1.22 (a decimal comma); the
    # grader does not: a comma between numbers is a list or a thousands separator
    ("1,22", "1.22", True, True, False),
    # README, FAQ 2: a solution chain ending in the gold number counts; in strict mode the grader
    # wants the number itself, so a policy is not paid for boxing a chain of equations
    ("a+2z = 2z + a = 101", "101", False, True, False),
    # math-verify rounds both sides to 6 decimal places (verify(float_rounding=6)): 33.3333 fails
    # and 0.0000003 passes for 1/3000000; the grader counts six significant digits instead
    ("33.3333", "\\frac{100}{3}", False, False, True),
    ("0.0000003", "\\frac{1}{3000000}", False, True, False),
])
def test_where_the_grader_departs_from_math_verify(grader, pred, gold, plain_text, math_verify_says, grader_says):
    assert _math_verify(pred, gold, plain_text) is math_verify_says  # the documented behaviour, from math-verify
    assert grader.grade_many([(pred, gold)])[0].correct is grader_says


def test_invalid_timeout():
    with pytest.raises(ValueError):
        MathGrader(timeout_s=0)
