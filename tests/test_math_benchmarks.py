"""The math benchmark loaders on the shared data copies, the hub path offline, the training file."""

import json
import logging
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
    path.write_text(json.dumps([{"problem": "1+1?", "answer": "2", "type": "Algebra"},
                                {"question": "q", "answer": 3.0}]))
    problems = math_benchmarks.load_math_file(path)
    assert [(p.question, p.answer) for p in problems] == [("1+1?", "2"), ("q", "3")]
    assert problems[0].meta == {"type": "Algebra"}


def test_load_math_file_jsonl_and_errors(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"problem": "p", "answer": "\\\\frac{1}{2}"}\n\n{"problem": "r", "answer": "x"}\n')
    assert [p.answer for p in math_benchmarks.load_math_file(path)] == ["\\frac{1}{2}", "x"]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"answer": "3"}]')
    with pytest.raises(UserError, match="no usable row: 1 without a problem text \\(row 0\\)"):
        math_benchmarks.load_math_file(bad)
    unanswered = tmp_path / "unanswered.json"
    unanswered.write_text('[{"problem": "p", "answer": null}]')
    with pytest.raises(UserError, match="no usable row: 1 without an answer"):
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


# --- bad rows, row counts and pinned revisions ------------------------------------------------

def _write_benchmark(folder: Path, name: str, lines: list) -> Path:
    (folder / name).mkdir(parents=True, exist_ok=True)
    path = folder / name / "test.jsonl"
    path.write_bytes(b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n"
                              for line in lines))
    return path


def test_bad_benchmark_rows_are_skipped_counted_and_never_graded(tmp_path, caplog):
    good = [{"problem": f"q{i}", "answer": str(i)} for i in range(28)]
    path = _write_benchmark(tmp_path, "aime24", good[:5] + [
        b'{"problem": "cut off', {"problem": "no answer", "answer": None}, {"problem": "empty", "answer": " "},
        {"answer": "7"}, b"\xff\xfe not utf-8", ["a", "list"],
    ] + good[5:])
    with caplog.at_level(logging.WARNING):
        problems = BENCHMARKS.get("aime24").load(tmp_path, None)
    assert [p.answer for p in problems] == [str(i) for i in range(28)]  # never "None"
    assert problems.data["skipped"] == {"not valid JSON": 1, "without an answer": 2, "without a problem text": 1,
                                        "not UTF-8 text": 1, "not a JSON object": 1}
    assert problems.data["problems"] == 28 and problems.data["expected_problems"] == 30
    assert problems.data["count_ok"] is False and problems.data["source"] == str(path)
    note = problems.data["note"]
    assert note.startswith("28 problems where aime24 has 30; skipped 6 of 34 rows: ")
    assert "1 not valid JSON (line 6)" in note and "2 without an answer (line 7, line 8)" in note
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "aime24" in warning and note in warning and "\n" not in warning
    # Problem ids count rows in the file, so fixing a bad row later does not renumber the others.
    assert problems[5].id == "aime24/11"
    # --limit takes the first problems and keeps the data record of the whole file.
    limited = BENCHMARKS.get("aime24").load(tmp_path, 3)
    assert len(limited) == 3 and limited.data == problems.data


def test_repeated_problem_id_is_skipped(tmp_path):
    _write_benchmark(tmp_path, "math500", [{"problem": "a", "answer": "1", "unique_id": "x"},
                                           {"problem": "b", "answer": "2", "unique_id": "x"},
                                           {"problem": "c", "answer": "3", "unique_id": None}])
    problems = BENCHMARKS.get("math500").load(tmp_path, None)
    assert [(p.id, p.answer) for p in problems] == [("math500/x", "1"), ("math500/2", "3")]
    assert problems.data["skipped"] == {"with a repeated id": 1}


def test_benchmark_row_count_is_checked(tmp_path):
    _write_benchmark(tmp_path, "amc23", [{"question": f"q{i}", "answer": float(i)} for i in range(40)])
    exact = BENCHMARKS.get("amc23").load(tmp_path, None)
    assert exact.data["count_ok"] is True and exact.data["note"] == "" and exact.data["skipped"] == {}
    _write_benchmark(tmp_path, "amc23", [{"question": f"q{i}", "answer": float(i)} for i in range(41)])
    extra = BENCHMARKS.get("amc23").load(tmp_path, None)
    assert extra.data["count_ok"] is False and extra.data["note"] == "41 problems where amc23 has 40"


@pytest.mark.parametrize("lines, message", [
    ([b"not json at all", b"{broken"], "no usable row: 2 not valid JSON (line 1, line 2)"),
    ([{"problem": "p", "answer": None}], "no usable row: 1 without an answer (line 1)"),
    ([{"question": "p", "answer": "no hashes"}], "no usable row: 1 without an answer (line 1)"),  # gsm8k needs ####
])
def test_benchmark_without_usable_rows_is_one_line(tmp_path, lines, message):
    path = _write_benchmark(tmp_path, "gsm8k", lines)
    with pytest.raises(UserError) as error:
        BENCHMARKS.get("gsm8k").load(tmp_path, None)
    assert message in str(error.value) and str(path) in str(error.value) and "\n" not in str(error.value)


def test_answer_normalizers_refuse_missing_answers():
    for row in ({"answer": None}, {"answer": ""}, {"answer": True}, {"answer": float("nan")}, {"answer": [1]}, {}):
        with pytest.raises(math_benchmarks.BadRow):
            math_benchmarks._plain_answer(row)
    for row in ({"final_answer": []}, {"final_answer": None}, {"final_answer": ["  "]}, {"final_answer": [3]}):
        with pytest.raises(math_benchmarks.BadRow):
            math_benchmarks._olympiad_answer(row)
    with pytest.raises(math_benchmarks.BadRow):
        math_benchmarks._minerva_answer({"solution": "no box here"})
    assert math_benchmarks._olympiad_answer({"final_answer": ["$69$", "$84$"]}) == "69, 84"


HUB_PINS = {  # benchmark: (hub id, config, split, revision, problems the pinned copy holds)
    "aime24": ("HuggingFaceH4/aime_2024", None, "train", "2fe88a2f1091d5048c0f36abc874fb997b3dd99a", 30),
    "aime25": ("math-ai/aime25", None, "test", "563bb8404243c5f09de6ec262f2db674fe5bce9b", 30),
    "amc23": ("math-ai/amc23", None, "test", "80815d37005feb82cd7f8fbc6901d5d3eff43057", 40),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be", 500),
    "olympiadbench": ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train",
                      "91184b52131e7fc9455fef848035173aea8cc01a", 674),
    "gsm8k": ("openai/gsm8k", "main", "test", "740312add88f781978c0658806c59bc2815b9866", 1319),
    "minerva_math": ("math-ai/minervamath", None, "test", "ee46ddc498933b1977577953250ca5c66be64f96", 272),
}


def _hub_row(name: str, i: int) -> dict:
    """A row laid out like the hub copy of each benchmark."""
    if name == "olympiadbench":
        return {"question": f"q{i}", "final_answer": [f"${i}$"]}
    if name == "gsm8k":
        return {"question": f"q{i}", "answer": f"so\n#### {i}"}
    return {"problem": f"q{i}", "answer": str(i)}


@pytest.fixture
def fake_hub(monkeypatch):
    """datasets.load_dataset answering from memory with `rows[name]` rows; the calls are recorded."""
    import datasets

    import meds_cli.core.hub

    calls, rows = [], {}
    by_id = {hub_id: name for name, (hub_id, *_rest) in HUB_PINS.items()}

    def load_dataset(path, name=None, *, split=None, revision=None, **kwargs):
        calls.append({"path": path, "name": name, "split": split, "revision": revision})
        count = rows.get(by_id[path], HUB_PINS[by_id[path]][4])
        return [_hub_row(by_id[path], i) for i in range(count)]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(meds_cli.core.hub, "offline_unless_reachable", lambda: False)
    return calls, rows


def test_hub_loaders_pin_a_revision(fake_hub):
    calls, _ = fake_hub
    for name, (hub_id, config, split, revision, count) in HUB_PINS.items():
        problems = BENCHMARKS.get(name).load(None, None)
        assert calls[-1] == {"path": hub_id, "name": config, "split": split, "revision": revision}
        assert len(problems) == count and problems.data["count_ok"] is True, name
        assert problems.data["source"] == f"{hub_id}@{revision}"
        assert problems[0].answer == "0"


def test_hub_copy_with_a_different_row_count_is_flagged(fake_hub, caplog):
    _, rows = fake_hub
    rows["aime25"] = 31  # the id moved to a copy with one more problem
    with caplog.at_level(logging.WARNING):
        problems = BENCHMARKS.get("aime25").load(None, None)
    assert problems.data["count_ok"] is False and problems.data["note"] == "31 problems where aime25 has 30"
    assert any("aime25" in r.getMessage() and "31 problems" in r.getMessage() for r in caplog.records)


def test_eval_report_shows_the_data_note():
    from rich.console import Console

    from benchmarks.eval_report import score_table

    scores = {"problems": 28, "pass@k": {"1": 0.5}, "maj@k": {"1": 0.5}, "mean_response_length": 10.0,
              "truncated_share": 0.0, "timeouts": 0}
    document = {"model": "m", "config": {"n": 1}, "average": scores,
                "benchmarks": {"aime24": {**scores, "data": {"note": "28 problems where aime24 has 30"}},
                               "amc23": {**scores, "data": {"note": ""}}}}
    console = Console(record=True, width=200)
    console.print(score_table(document))
    text = console.export_text()
    assert "warning: aime24: 28 problems where aime24 has 30" in text and "amc23:" not in text
