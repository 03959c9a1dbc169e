"""Code benchmarks: loaders, the value codec, EvalPlus comparison rules, grading end to end."""

import base64
import json
import math
import pickle
import zlib
from pathlib import Path

import pytest

from benchmarks import code_benchmarks as cb
from benchmarks.registry import BENCHMARKS
from meds_cli.core.errors import UserError

DATA = Path("/work/shared/data")
needs_data = pytest.mark.skipif(not (DATA / "humanevalplus").is_dir(), reason="no shared benchmark data")


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


# ----- codec and comparison ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None, True, 3, -2.5, "text", [1, [2, 3]], (1, (2, "a")), {1: "a", (2, 3): [4]},
        {1, 2}, frozenset({"x"}), 1 + 2j, b"\x00\xff", 7**5000, -(7**5000), [float("inf")],
    ],
)  # fmt: skip
def test_codec_round_trips_through_json(value):
    decoded = cb.decode_value(json.loads(json.dumps(cb.encode_value(value))))
    assert decoded == value and type(decoded) is type(value)


def test_codec_keeps_nan_and_unknown_types_apart():
    assert math.isnan(cb.decode_value(json.loads(json.dumps(cb.encode_value(float("nan"))))))
    opaque = cb.decode_value(cb.encode_value(range(3)))
    assert opaque == cb.Opaque("range", "range(0, 3)")


def test_canonical_json_ignores_set_and_dict_order():
    a = cb.encode_value({"b": {3, 1, 2}, "a": 1})
    b = cb.encode_value({"a": 1, "b": {2, 3, 1}})
    assert cb.canonical_json(a) == cb.canonical_json(b)


@pytest.mark.parametrize(
    "out, exp, atol, match",
    [
        (3, 3, 0, True),
        (True, 1, 0, True),  # == as in EvalPlus
        ([1, 2], (1, 2), 0, False),
        (0.1 + 0.2, 0.3, 0, True),  # float expected: 1e-6 by default
        (0.3001, 0.3, 0, False),
        (0.3001, 0.3, 1e-3, True),
        ([1.0, 2.0000001], [1.0, 2.0], 0, True),
        ((1.0, 2.0000001), [1.0, 2.0], 0, False),  # approximate needs the same type
        ([1.0], [1.0, 2.0], 1e-3, False),
        (float("nan"), float("nan"), 0, True),
        ("a", 1.0, 0, False),
        (cb.Opaque("digest", "ab"), cb.Opaque("digest", "ab"), 0, True),
    ],
)
def test_outputs_match(out, exp, atol, match):
    assert cb.outputs_match(out, exp, atol) is match


def test_find_zero_accepts_any_root():
    assert cb._find_zero_ok([[-1, 0, 1]], 1.0, 1e-6)  # x**2 - 1
    assert cb._find_zero_ok([[-1, 0, 1]], -1.0, 1e-6)
    assert not cb._find_zero_ok([[-1, 0, 1]], 0.5, 1e-6)
    assert not cb._find_zero_ok([[-1, 0, 1]], "1", 1e-6)


def test_stdout_lines_compare_stripped_with_number_tolerance():
    assert cb._lines_match("1 2\n3\n\n", "1 2\n3")
    assert cb._lines_match("0.3333333\n", "0.33333333\n")
    assert not cb._lines_match("1 2\n", "1 3\n")
    assert not cb._lines_match("1\n", "1\n2\n")


def test_mbpp_arguments_get_their_types_back():
    assert cb._mbpp_args(2, [[3, 4], [5]]) == [(3, 4), (5,)]
    assert cb._mbpp_args(63, [[[1, 2], [3, 4]]]) == [[(1, 2), (3, 4)]]
    assert cb._mbpp_args(124, ["0", "1j"]) == [0.0, 1j]
    assert cb._mbpp_args(252, [4]) == [4 + 0j]
    assert cb._mbpp_args(580, [[1, [2, [3]]]]) == ((1, (2, (3,))),)
    assert cb._mbpp_args(3, [[1, 2]]) == [[1, 2]]


# ----- loading ----------------------------------------------------------------------------------


def test_benchmarks_are_registered_as_code():
    for name in ("humanevalplus", "mbppplus", "humaneval", "livecodebench"):
        assert BENCHMARKS.get(name).kind == "code"


@needs_data
@pytest.mark.parametrize("name, count", [("humanevalplus", 164), ("mbppplus", 378), ("humaneval", 164)])
def test_loaders_read_the_data_dir(name, count):
    problems = BENCHMARKS.get(name).load(DATA, None)
    assert len(problems) == count
    assert len({p.id for p in problems}) == count
    assert BENCHMARKS.get(name).load(DATA, 3) == problems[:3]
    assert problems[0].meta["entry_point"] and problems[0].question


@needs_data
def test_mbpp_inputs_are_tuples_where_the_contract_says_so():
    problem = next(p for p in cb.load_mbppplus(DATA) if p.id == "Mbpp/2")
    assert problem.answer["base_input"][0] == [(3, 4, 5, 6), (5, 7, 4, 10)]


def test_missing_data_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="humanevalplus/HumanEvalPlus.jsonl.gz"):
        cb.load_humanevalplus(tmp_path)
    with pytest.raises(UserError, match="hub or a local copy"):
        cb.load_livecodebench(tmp_path)


@pytest.mark.parametrize("name", ["humanevalplus", "mbppplus", "humaneval", "livecodebench"])
def test_offline_hub_is_a_one_line_user_error(monkeypatch, name):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as error:
        BENCHMARKS.get(name).load(None, None)
    message = str(error.value)
    assert "\n" not in message and "hub" in message and name in message


# ----- grading ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval_plus():
    if not (DATA / "humanevalplus").is_dir():
        pytest.skip("no shared benchmark data")
    problems = {p.id: p for p in cb.load_humanevalplus(DATA)}
    return problems


def test_canonical_wrong_raising_and_looping_solutions(humaneval_plus, monkeypatch):
    monkeypatch.setattr(cb, "MIN_TIMEOUT_S", 1.0)
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
        "passed", "WrongAnswer", "IndexError", "Timeout", "SyntaxError", "SyntaxError", "WrongAnswer", "passed",
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
    problem = cb.load_humaneval(DATA, 1)[0]
    verdicts = cb.grade(
        [
            (problem, fenced(problem.answer["canonical_solution"])),
            (problem, fenced("def has_close_elements(numbers, threshold):\n    return True")),
        ]
    )
    assert [v.outcome for v in verdicts] == ["passed", "WrongAnswer"]
    assert verdicts[0].detail["plus_passed"] is None


def _packed(tests: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def test_livecodebench_stdin_and_functional_problems():
    stdio_row = {
        "question_id": "abc001_a", "question_content": "Print a+b.", "platform": "atcoder",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _packed([{"input": "5 7\n", "output": "12\n", "testtype": "stdin"}]),
        "metadata": "{}", "starter_code": "",
    }  # fmt: skip
    method_row = {
        "question_id": "two-sum", "question_content": "Add.", "platform": "leetcode",
        "public_test_cases": json.dumps([{"input": "[1, 2]\n3", "output": "[1, 2, 3]", "testtype": "functional"}]),
        "private_test_cases": _packed([]), "metadata": json.dumps({"func_name": "extend"}),
        "starter_code": "class Solution:\n    def extend(self, xs, x):\n        ",
    }  # fmt: skip
    stdio, method = cb._lcb_problem(stdio_row), cb._lcb_problem(method_row)
    assert (stdio.answer["n_base"], stdio.answer["n_plus"]) == (1, 1)
    pairs = [
        (stdio, fenced("a, b = map(int, input().split())\nprint(a + b)")),
        (stdio, fenced("a, b = map(int, input().split())\nprint(a * b)")),
        (stdio, fenced("def main():\n    print(sum(map(int, input().split())))\nif __name__ == '__main__':\n    main()")),
        (method, fenced("class Solution:\n    def extend(self, xs, x):\n        return tuple(xs + [x])")),
        (method, fenced("class Solution:\n    def extend(self, xs, x):\n        return xs")),
    ]
    verdicts = cb.grade(pairs)
    assert [v.outcome for v in verdicts] == ["passed", "WrongAnswer", "passed", "passed", "WrongAnswer"]
    assert verdicts[1].detail["base_passed"] is False


@pytest.mark.slow
@needs_data
@pytest.mark.parametrize("name", ["humanevalplus", "mbppplus"])
def test_every_canonical_solution_passes_base_and_plus(name):
    problems = BENCHMARKS.get(name).load(DATA, None)
    verdicts = BENCHMARKS.get(name).grade([(p, fenced(p.answer["canonical_solution"])) for p in problems])
    failed = [(p.id, v.outcome) for p, v in zip(problems, verdicts) if not v.correct]
    assert not failed
    # plus_passed is None only where the data has no plus inputs (Mbpp/793).
    assert all(v.detail["base_passed"] and v.detail["plus_passed"] is not False for v in verdicts)
    # Inputs left out (the canonical output is too big to grade) stay the rare exception.
    skipped = {p.id: len(cb._skipped(p)) for p in problems if cb._skipped(p)}
    assert sum(skipped.values()) <= 2, skipped  # Mbpp/255 input 88: 1.6 million 77-tuples
