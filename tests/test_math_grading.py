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


def test_invalid_timeout():
    with pytest.raises(ValueError):
        MathGrader(timeout_s=0)
