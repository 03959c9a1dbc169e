"""The math benchmark loaders on the shared data copies, the hub path offline, the training file."""

import json
from pathlib import Path

import pytest

import benchmarks.math_benchmarks as math_benchmarks
from benchmarks.answer_extraction import number_literal_value
from benchmarks.registry import BENCHMARKS
from meds_cli.core.errors import UserError

DATA = Path("/work/shared/data")
ROWS = {
    "math500": 500,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "olympiadbench": 675,
    "gsm8k": 1319,
    "minerva_math": 272,
}
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared benchmark data not present")


@pytest.fixture(scope="module")
def loaded():
    return {name: BENCHMARKS.get(name).load(DATA, None) for name in ROWS}


def test_registered_as_math():
    for name in ROWS:
        assert BENCHMARKS.get(name).kind == "math"


@needs_data
def test_row_counts(loaded):
    assert {name: len(problems) for name, problems in loaded.items()} == ROWS


@needs_data
def test_answers_are_normalized_strings(loaded):
    for problems in loaded.values():
        assert all(isinstance(p.answer, str) and p.answer for p in problems)
        assert all(isinstance(p.question, str) and p.question for p in problems)
    first = {name: problems[0].answer for name, problems in loaded.items()}
    assert first["amc23"] == "27"  # float 27.0 in the file
    assert first["aime25"] == "70"  # int in the file
    assert first["aime24"] == "204"
    assert first["gsm8k"] == "18"  # text after ####
    assert first["minerva_math"] == "1.6"  # last \boxed{} of the solution
    assert first["math500"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first["olympiadbench"] == "2"  # one-element list final_answer
    assert "$" not in "".join(p.answer for p in loaded["olympiadbench"])
    # AIME answers written with three digits lose the leading zeros; gsm8k loses commas.
    assert "025" not in [p.answer for p in loaded["aime24"]] and "25" in [p.answer for p in loaded["aime24"]]
    assert all("," not in p.answer for p in loaded["gsm8k"])
    assert loaded["olympiadbench"][0].question.startswith("Xenia and Sergey")
    assert loaded["gsm8k"][0].question.startswith("Janet")


def _unparsed(answers):
    from math_verify import parse

    return [a for a in answers if not parse("\\boxed{" + a + "}")]


def _symbolic(problems):
    """Gold answers that are not plain numbers: the ones the grader hands to math-verify."""
    return [p.answer for p in problems if number_literal_value(p.answer) is None]


@needs_data
def test_gold_answers_parse_sample(loaded):
    # Plain numbers never reach math-verify (the grader compares them exactly), so they need only
    # read as literals; 20 symbolic gold answers of each benchmark must parse (all: slow test).
    golds = [p.answer for problems in loaded.values() for p in problems]
    assert 300 < len([a for a in golds if number_literal_value(a) is None]) < len(golds) / 2
    assert _unparsed([a for problems in loaded.values() for a in _symbolic(problems)[:20]]) == []


@needs_data
@pytest.mark.slow
def test_all_gold_answers_parse(loaded):
    # About 20 s: math-verify parses ~3,000 answers in this process.
    assert _unparsed([p.answer for problems in loaded.values() for p in problems]) == []


@needs_data
@pytest.mark.slow
def test_symbolic_gold_answers_equal_themselves_in_math_verify(loaded):
    # The pool takes identical text as correct without math-verify; here math-verify itself must
    # agree for every symbolic gold answer (~600, about 15 s).
    from benchmarks.math_grading import judge_pair

    failed = [(a, judge_pair(a, a, 10)) for problems in loaded.values() for a in _symbolic(problems)]
    assert [f for f in failed if f[1][0] != "correct"] == []


@needs_data
def test_gold_answers_grade_correct_against_themselves(loaded):
    for name, problems in loaded.items():
        verdicts = BENCHMARKS.get(name).grade([(p, f"so \\boxed{{{p.answer}}}.") for p in problems])
        wrong = [(p.answer, v.outcome) for p, v in zip(problems, verdicts) if not v.correct]
        assert wrong == [], name


@needs_data
def test_equivalent_forms_of_gold_answers_grade_correct(loaded):
    # Rewritten golds go through math-verify or the exact path rather than the identical-text one.
    problems = {name: problems for name, problems in loaded.items()}
    cases = [
        (problems["math500"][0], "(3, \\pi/2)"),
        (problems["amc23"][0], "27.0"),
        (problems["minerva_math"][0], "\\frac{8}{5}"),
        (problems["gsm8k"][0], "\\$18"),
    ]
    verdicts = BENCHMARKS.get("math500").grade([(p, f"\\boxed{{{answer}}}") for p, answer in cases])
    assert [v.outcome for v in verdicts] == ["correct"] * 4


def test_missing_data_dir_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        BENCHMARKS.get("aime24").load(tmp_path, None)


def test_hub_offline_is_one_line_user_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: nothing to fall back on
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    import datasets.config
    import huggingface_hub.constants

    # Both libraries read these at import time; the test may run after they were imported.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(UserError) as error:
        BENCHMARKS.get("math500").load(None, None)
    message = str(error.value)
    assert "\n" not in message
    assert "HuggingFaceH4/MATH-500" in message and "--data-dir" in message


def test_load_math_file_json_list(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"problem": "1+1?", "answer": "2", "type": "Algebra"}, {"question": "q", "answer": 3.0}]))
    problems = math_benchmarks.load_math_file(path)
    assert [(p.question, p.answer) for p in problems] == [("1+1?", "2"), ("q", "3")]
    assert problems[0].meta == {"type": "Algebra"}


def test_load_math_file_jsonl_and_errors(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "p", "answer": "\\\\frac{1}{2}"}\n\n{"problem": "r", "answer": "x"}\n')
    assert [p.answer for p in math_benchmarks.load_math_file(path)] == ["\\frac{1}{2}", "x"]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"answer": "3"}]')
    with pytest.raises(UserError, match="row 0"):
        math_benchmarks.load_math_file(bad)
    unanswered = tmp_path / "unanswered.json"
    unanswered.write_text('[{"problem": "p", "answer": null}]')
    with pytest.raises(UserError, match="no row has a gold answer"):
        math_benchmarks.load_math_file(unanswered)
    with pytest.raises(UserError, match="not found"):
        math_benchmarks.load_math_file(tmp_path / "missing.json")


@pytest.mark.skipif(not (DATA / "math_train_rllm/math.json").is_file(), reason="training data not present")
def test_load_math_file_rllm_math():
    problems = math_benchmarks.load_math_file(DATA / "math_train_rllm/math.json")
    assert len(problems) == 7474 - 4  # four rows have no answer (None or "")
    assert problems[0].answer == "0"
    assert all(p.answer and p.answer != "None" for p in problems)


def test_load_math_file_answer_from_solution(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "p", "solution": "so \\\\boxed{\\\\frac{1}{2}}."}\n')
    assert math_benchmarks.load_math_file(path)[0].answer == "\\frac{1}{2}"


def test_load_math_source(tmp_path, monkeypatch):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"problem": "1+1?", "answer": 2}]))
    assert [p.answer for p in math_benchmarks.load_math_source(str(path))] == ["2"]
    with pytest.raises(UserError, match="not found"):
        math_benchmarks.load_math_source(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match="empty"):
        math_benchmarks.load_math_source("")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(UserError, match="no-such-owner/no-such-set"):
        math_benchmarks.load_math_source("no-such-owner/no-such-set")
