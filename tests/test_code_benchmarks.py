"""Grading code benchmarks end to end: EvalPlus's verdicts on HumanEval+ and MBPP+ solutions, the
original HumanEval check() tests."""

import json
from pathlib import Path

import pytest

from benchmarks import code_benchmarks as cb
from benchmarks import code_loaders
from benchmarks.code_expected import expected_for
from benchmarks.registry import BENCHMARKS

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "humanevalplus").is_dir(), reason="no shared benchmark data")


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


# ----- grading ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval_plus():
    if not (DATA / "humanevalplus").is_dir():
        pytest.skip("no shared benchmark data")
    return {p.id: p for p in code_loaders.load_humanevalplus(DATA)}


def test_canonical_wrong_raising_and_looping_solutions(humaneval_plus):
    problem = humaneval_plus["HumanEval/0"]  # has_close_elements(numbers, threshold)
    responses = [
        fenced(problem.answer["canonical_solution"]),
        fenced("def has_close_elements(numbers, threshold):\n    return False"),
        fenced("def has_close_elements(numbers, threshold):\n    return numbers[99]"),
        fenced("def has_close_elements(numbers, threshold):\n    while True: pass"),
        fenced("def has_close_elements(numbers, threshold)\n    return False"),
        "I cannot solve this.",
        # No has_close_elements: completed with the prompt, whose stub returns None.
        fenced("def something_else():\n    return 1"),
        # A body only: completed with the prompt, as HumanEval completions are.
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n",
    ]
    verdicts = cb.grade([(problem, r) for r in responses])
    outcomes = [v.outcome for v in verdicts]
    assert outcomes == [
        "passed", "WrongAnswer", "IndexError", "Timeout", "SyntaxError", "no_program", "WrongAnswer", "passed",
    ]  # fmt: skip
    assert [v.correct for v in verdicts] == [True] + [False] * 6 + [True]
    assert verdicts[0].detail["base_passed"] and verdicts[0].detail["plus_passed"]
    assert verdicts[0].detail["base_total"] == 7 and verdicts[0].detail["plus_total"] > 0
    assert verdicts[5].extracted is None


def test_passing_base_but_not_plus_is_not_correct(humaneval_plus):
    problem = humaneval_plus["HumanEval/0"]
    base = json.dumps(problem.answer["base_input"])
    cheat = (
        problem.answer["canonical_solution"]
        + f"\n_real = has_close_elements\n_BASE = {base}\n"
        + "def has_close_elements(numbers, threshold):\n"
        + "    answer = _real(numbers, threshold)\n"
        + "    return answer if [numbers, threshold] in _BASE else not answer\n"
    )
    (verdict,) = cb.grade([(problem, fenced(cheat))])
    assert verdict.detail["base_passed"] and not verdict.detail["plus_passed"]
    assert (verdict.correct, verdict.outcome) == (False, "WrongAnswer")


def test_rigged_equality_does_not_pass(humaneval_plus):
    problem = humaneval_plus["HumanEval/0"]
    rigged = "class Any:\n    def __eq__(self, other): return True\n\ndef has_close_elements(n, t):\n    return Any()"
    (verdict,) = cb.grade([(problem, fenced(rigged))])
    assert verdict.outcome == "WrongAnswer"


def test_floats_compare_with_tolerance(humaneval_plus):
    problem = humaneval_plus["HumanEval/4"]  # mean_absolute_deviation: a float
    noisy = problem.answer["canonical_solution"].replace(
        "def mean_absolute_deviation", "def _mad"
    ) + "\ndef mean_absolute_deviation(numbers):\n    return _mad(numbers) * (1 + 1e-9)\n"
    off = noisy.replace("1e-9", "1e-3")
    verdicts = cb.grade([(problem, fenced(noisy)), (problem, fenced(off))])
    assert [v.outcome for v in verdicts] == ["passed", "WrongAnswer"]


@needs_data
def test_humaneval_check_tests():
    problem = code_loaders.load_humaneval(DATA, 1)[0]
    verdicts = cb.grade(
        [
            (problem, fenced(problem.answer["canonical_solution"])),
            (problem, fenced("def has_close_elements(numbers, threshold):\n    return True")),
        ]
    )
    assert [v.outcome for v in verdicts] == ["passed", "WrongAnswer"]
    assert verdicts[0].detail["plus_passed"] is None


def test_digested_outputs_compare_as_equal_values_do():
    from benchmarks.code_values import Opaque, Unequal, digest

    as_digest = Opaque("digest", digest(list(range(5))))
    assert cb._comparable(list(range(5)), as_digest) == as_digest  # the output digested to meet it
    assert cb._comparable([float(i) for i in range(5)], as_digest) == as_digest
    assert cb._comparable(as_digest, [0.0, 1.0, 2.0, 3.0, 4.0]) == [0.0, 1.0, 2.0, 3.0, 4.0]  # equal: stands for it
    assert cb._comparable(as_digest, [0, 1]) is as_digest
    assert cb._comparable([float("nan")], as_digest) != as_digest
    assert isinstance(cb._comparable([float("nan")], Unequal()), Unequal)


def wrapped(problem, body: str) -> str:
    """The canonical solution behind a wrapper that returns `body` computed from its output."""
    entry_point = problem.answer["entry_point"]
    return (f"import time\nimport numpy as np\n{problem.answer['canonical_solution']}\n_ref = {entry_point}\n"
            f"_calls = [0]\ndef {entry_point}(*args):\n    _calls[0] += 1\n    out = _ref(*args)\n    {body}\n")


def test_types_are_not_normalised(humaneval_plus):
    problem = humaneval_plus["HumanEval/5"]  # intersperse(numbers, delimeter) -> list
    verdicts = cb.grade([(problem, fenced(wrapped(problem, body))) for body in
                         ["return np.array(out)", "return tuple(out)", "return list(out)"]])  # fmt: skip
    assert [v.outcome for v in verdicts] == ["WrongAnswer", "WrongAnswer", "passed"]


def test_each_input_has_its_own_time_limit(humaneval_plus):
    problem = humaneval_plus["HumanEval/0"]
    slow_first_call = wrapped(problem, "time.sleep(1.5 if _calls[0] == 1 else 0)\n    return out")
    (verdict,) = cb.grade([(problem, fenced(slow_first_call))])
    assert (verdict.outcome, verdict.detail["base_ok"], verdict.detail["base_passed"]) == ("Timeout", 0, False)
    assert verdict.detail["plus_passed"] is False  # the plus group's first call is slow too: a fresh load


def test_humaneval_32_accepts_any_root(humaneval_plus):
    # EvalPlus 0.3.1 fails every solution to HumanEval/32; graded here as EvalPlus means to.
    problem = humaneval_plus["HumanEval/32"]
    # Bisection from a widening bracket, Newton's method (the canonical solution) where it finds
    # no bracket: another root than the canonical one on 144 of the 888 inputs.
    other_root = problem.answer["canonical_solution"].replace("def find_zero", "def _newton") + (
        "\ndef find_zero(xs):\n    f = lambda x: poly(xs, x)\n    lo, hi = -1.0, 1.0\n"
        "    for _ in range(60):\n        if f(lo) * f(hi) <= 0:\n            break\n        lo, hi = 2 * lo, 2 * hi\n"
        "    else:\n        return _newton(xs)\n"
        "    for _ in range(200):\n        mid = (lo + hi) / 2\n"
        "        lo, hi = (mid, hi) if (f(lo) < 0) == (f(mid) < 0) else (lo, mid)\n"
        "    return lo if abs(f(lo)) <= 1e-6 else _newton(xs)\n"
    )  # fmt: skip
    verdicts = cb.grade([(problem, fenced(problem.answer["canonical_solution"])), (problem, fenced(other_root)),
                         (problem, fenced("def find_zero(xs):\n    return 0.0"))])  # fmt: skip
    assert [v.outcome for v in verdicts] == ["passed", "passed", "WrongAnswer"]


@needs_data
def test_a_task_without_plus_inputs_passes_plus_when_the_solution_runs():
    problem = next(p for p in code_loaders.load_mbppplus(DATA) if p.id == "Mbpp/793")
    assert problem.answer["n_plus"] == 0
    (verdict,) = cb.grade([(problem, fenced(problem.answer["canonical_solution"]))])
    assert verdict.correct and verdict.detail["plus_passed"] is True and verdict.detail["plus_total"] == 0


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("name", ["humanevalplus", "mbppplus"])
def test_every_canonical_solution_passes_base_and_plus(name):
    problems = BENCHMARKS.get(name).load(DATA, None)
    verdicts = BENCHMARKS.get(name).grade([(p, fenced(p.answer["canonical_solution"])) for p in problems])
    failed = [(p.id, v.outcome) for p, v in zip(problems, verdicts) if not v.correct]
    assert not failed
    assert all(v.detail["base_passed"] and v.detail["plus_passed"] for v in verdicts)
    # Inputs left out (the canonical output is too big to grade) stay the rare exception.
    skipped = {p.id: len(expected_for(p).skipped) for p in problems if expected_for(p).skipped}
    assert sum(skipped.values()) <= 2, skipped  # Mbpp/255 input 88: 1.6 million 77-tuples
