"""Answer equivalence classes shared by EDAS and RLIF (algorithms/answer_groups.py)."""

import time

import pytest

from algorithms import answer_groups
from algorithms.answer_groups import answer_classes, class_sizes, decided_without_grader


def test_numbers_share_a_class_by_value_without_the_grader(monkeypatch):
    def no_grader(pairs):
        raise AssertionError(f"grader asked about {pairs}")

    monkeypatch.setattr(answer_groups, "_grader_equal", no_grader)
    # 1/2, 0.5 and \frac{1}{2} are one value; 3 and 3.0 too; '$4$' is 4
    labels = answer_classes([["1/2", "0.5", "\\frac{1}{2}", "3", "3.0", None, "$4$", "4"]])
    assert labels == [[0, 0, 0, 1, 1, None, 2, 2]]


def test_integers_and_single_symbols_are_settled_without_the_grader(monkeypatch):
    monkeypatch.setattr(answer_groups, "_grader_equal", lambda pairs: pytest.fail("grader called"))
    assert answer_classes([["12", "012", "-12", "1,200"], ["a", "+", "a", ""]]) == [[0, 0, 1, 2], [0, 1, 0, None]]
    assert decided_without_grader("num:12", "num:13") is False
    assert decided_without_grader("num:1/3", "num:1/2") is False  # far apart
    assert decided_without_grader("num:1/3", "num:333333/1000000") is None  # rounding rules: the grader decides
    assert decided_without_grader("x", "y") is False


def test_key_mode_never_asks_the_grader(monkeypatch):
    monkeypatch.setattr(answer_groups, "_grader_equal", lambda pairs: pytest.fail("grader called"))
    assert answer_classes([["\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"]], equivalence="key") == [[0, 1]]


def test_undecided_pairs_are_batched_and_joined_transitively(monkeypatch):
    asked = []

    def fake(pairs):
        asked.append(list(pairs))
        # pretend: x+1 == 1+x and 1+x == (x+1); nothing else
        same = {("x+1", "1+x"), ("1+x", "(x+1)")}
        return [p in same for p in pairs]

    monkeypatch.setattr(answer_groups, "_grader_equal", fake)
    labels = answer_classes([["x+1", "y", "1+x", "(x+1)"], ["p", "q"]])
    # one call for both groups; x+1 ~ 1+x ~ (x+1) by union-find even though (x+1, x+1) pair was 'different'
    assert len(asked) == 1
    assert labels == [[0, 1, 0, 0], [0, 1]]
    assert class_sizes(labels[0]) == {0: 3, 1: 1}


def test_real_grader_joins_equal_expressions():
    # math-verify in a worker: sqrt(2)/2 equals 1/sqrt(2); 2x is not x^2.
    t0 = time.perf_counter()
    labels = answer_classes([["\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", "2x", "x^2"]])
    assert labels == [[0, 0, 1, 2]]
    assert time.perf_counter() - t0 < 60
