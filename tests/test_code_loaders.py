"""Code benchmark loaders: the data folder and the hub copies' layouts, damaged files, LiveCodeBench's
pinned window, and the row counts checked against the known ones."""

import base64
import gzip
import json
import pickle
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import code_benchmarks as cb
from benchmarks import code_loaders
from benchmarks.code_rows import row_count_mismatch
from benchmarks.registry import BENCHMARKS
from meds_cli.core.errors import UserError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not (DATA / "mbppplus").is_dir(), reason="needs ../shared/data")


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def release_rows(name: str) -> list[dict]:
    with gzip.open(DATA / code_loaders._FILES[name], "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_gz(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    return path


# ----- the data folder ---------------------------------------------------------------------------


def test_benchmarks_are_registered_as_code():
    for name in ("humanevalplus", "mbppplus", "humaneval", "livecodebench"):
        assert BENCHMARKS.get(name).kind == "code"


@needs_data
@pytest.mark.parametrize("name, count", [("humanevalplus", 164), ("mbppplus", 378), ("humaneval", 164)])
def test_loaders_read_the_data_dir(name, count):
    problems = BENCHMARKS.get(name).load(DATA, None)
    assert len(problems) == count and len({p.id for p in problems}) == count
    assert BENCHMARKS.get(name).load(DATA, 3) == problems[:3]
    assert problems[0].meta["entry_point"] and problems[0].question
    assert problems[0].meta["rows"] == {"expected": count, "loaded": count, "skipped": 0}
    assert row_count_mismatch(problems) is None


@needs_data
def test_mbpp_inputs_are_tuples_where_evalplus_makes_them_tuples():
    problem = next(p for p in code_loaders.load_mbppplus(DATA) if p.id == "Mbpp/2")
    assert problem.answer["base_input"][0] == [(3, 4, 5, 6), (5, 7, 4, 10)]
    assert problem.answer["dataset"] == "mbpp" and problem.answer["mode"] == "call"


def test_mbpp_arguments_get_their_types_back_idempotently():
    cases = [(2, [[3, 4], [5]], [(3, 4), (5,)]), (63, [[[1, 2], [3, 4]]], [[(1, 2), (3, 4)]]),
             (124, ["0", "1j"], [0.0, 1j]), (252, [4], [4 + 0j]), (580, [[1, [2, [3]]]], ((1, (2, (3,))),)),
             (115, [[[1], []]], [[{1}, {}]]), (3, [[1, 2]], [[1, 2]])]  # fmt: skip
    for number, raw, restored in cases:
        assert code_loaders.mbpp_args(number, raw) == restored
        assert code_loaders.mbpp_args(number, code_loaders.mbpp_args(number, raw)) == restored


@needs_data
def test_mbpp_arguments_match_evalplus():
    mbpp = pytest.importorskip("evalplus.data.mbpp")
    for row in release_rows("mbppplus"):
        number = int(row["task_id"].split("/")[1])
        theirs = mbpp.mbpp_deserialize_inputs(row["task_id"], row["plus_input"])
        ours = [code_loaders.mbpp_args(number, args) for args in row["plus_input"]]
        assert [list(args) for args in ours] == [list(args) for args in theirs], row["task_id"]  # the call sees *args


def test_missing_data_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="humanevalplus/HumanEvalPlus.jsonl.gz"):
        code_loaders.load_humanevalplus(tmp_path)
    with pytest.raises(UserError, match="hub or a local copy"):
        code_loaders.load_livecodebench(tmp_path)


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


# ----- damaged files -----------------------------------------------------------------------------


@needs_data
def test_damaged_rows_are_skipped_and_counted(tmp_path, caplog):
    good = release_rows("humanevalplus")[:2]
    no_entry_point = {k: v for k, v in good[1].items() if k != "entry_point"}
    lines = [json.dumps(good[0]).encode(), b"\xff\xfe not utf-8", b"{not json", b"[1, 2]",
             json.dumps(no_entry_point).encode(), json.dumps({**good[1], "entry_point": None}).encode()]  # fmt: skip
    write_gz(tmp_path / "humanevalplus" / "HumanEvalPlus.jsonl.gz", lines)
    problems = code_loaders.load_humanevalplus(tmp_path)
    assert [p.id for p in problems] == ["HumanEval/0"]
    assert problems[0].meta["rows"] == {"expected": 164, "loaded": 1, "skipped": 5}
    assert row_count_mismatch(problems) == {"expected": 164, "loaded": 1, "skipped": 5}
    assert "skipped 5 unusable row(s)" in caplog.text and "line 2: not UTF-8" in caplog.text


@needs_data
def test_a_cut_off_file_keeps_the_rows_before_the_cut(tmp_path):
    rows = release_rows("mbppplus")[:20]
    path = write_gz(tmp_path / "mbppplus" / "MbppPlus.jsonl.gz", [json.dumps(r).encode() for r in rows])
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) * 2 // 3])
    problems = code_loaders.load_mbppplus(tmp_path)
    assert 0 < len(problems) < 20 and [p.id for p in problems] == [r["task_id"] for r in rows[: len(problems)]]
    assert row_count_mismatch(problems)["loaded"] == len(problems)


@pytest.mark.parametrize("content, message", [
    (b"this is not gzip", "is not a gzip file"),
    (gzip.compress(b'{"task_id": "HumanEval/0"}\n\xff\n'), "no usable row"),
    (gzip.compress(b""), "no usable row"),
])  # fmt: skip
def test_a_file_without_usable_rows_is_one_line(tmp_path, content, message):
    (tmp_path / "humanevalplus").mkdir()
    (tmp_path / "humanevalplus" / "HumanEvalPlus.jsonl.gz").write_bytes(content)
    with pytest.raises(UserError, match=message) as error:
        code_loaders.load_humanevalplus(tmp_path)
    assert "\n" not in str(error.value)


def test_meds_eval_refuses_a_broken_file_with_exit_code_2(tmp_path):
    from meds_cli.app import app

    (tmp_path / "mbppplus").mkdir()
    (tmp_path / "mbppplus" / "MbppPlus.jsonl.gz").write_bytes(gzip.compress(b"[]\nnull\n"))
    result = CliRunner().invoke(app, ["eval", "--model", "tiny-llama", "--benchmarks", "mbppplus", "--data-dir",
                                      str(tmp_path), "--output", str(tmp_path / "out")])  # fmt: skip
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "no usable row" in lines[0], result.output
    assert "Traceback" not in result.output


# ----- the dataset hub's MBPP+ layout ------------------------------------------------------------

_HUB_TEST = '''import numpy as np
from math import inf

def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    return False

def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match

inputs = {inputs}
results = {results}
for i, (inp, exp) in enumerate(zip(inputs, results)):
    assertion({entry_point}(*inp), exp, {atol})
'''


def hub_layout(row: dict, inputs_text: str | None = None, results_text: str = "[]") -> dict:
    """A release row laid out as the hub copy (evalplus/mbppplus) lays it out."""
    number = int(row["task_id"].split("/")[1])
    inputs = [code_loaders.mbpp_args(number, args) for args in row["base_input"] + row["plus_input"]]
    test_list = [line for line in row["assertion"].strip().splitlines() if line.startswith("assert")]
    text = inputs_text if inputs_text is not None else repr(inputs)
    test = _HUB_TEST.format(inputs=text, results=results_text, entry_point=row["entry_point"], atol=row["atol"])
    task = row["prompt"].strip().strip('"').strip().splitlines()[0]
    return {"task_id": number, "code": row["canonical_solution"], "prompt": task, "source_file": "Benchmark Questions",
            "test_imports": [], "test_list": test_list, "test": test}  # fmt: skip


@needs_data
@pytest.mark.parametrize("task_id", ["Mbpp/2", "Mbpp/124", "Mbpp/581"])
def test_a_hub_row_loads_as_the_release_row(task_id):
    row = next(r for r in release_rows("mbppplus") if r["task_id"] == task_id)
    from_hub = code_loaders._evalplus_problem("mbppplus", hub_layout(row))
    release = code_loaders._evalplus_problem("mbppplus", row)
    assert from_hub.id == task_id and from_hub.answer["mode"] == "call"
    for key in ("entry_point", "base_input", "plus_input", "atol", "n_base", "dataset"):
        assert from_hub.answer[key] == release.answer[key], key
    assert from_hub.question.startswith('"""\n') and row["prompt"].splitlines()[1] in from_hub.question


@needs_data
def test_the_hub_loader_reads_the_hub_layout(monkeypatch):
    import datasets

    rows = [r for r in release_rows("mbppplus") if r["task_id"] in ("Mbpp/2", "Mbpp/3")]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: [hub_layout(r) for r in rows])
    monkeypatch.setattr("meds_cli.core.hub.offline_unless_reachable", lambda: True)
    problems = code_loaders.load_mbppplus(None)
    assert [p.id for p in problems] == ["Mbpp/2", "Mbpp/3"]
    assert row_count_mismatch(problems) == {"expected": 378, "loaded": 2, "skipped": 0}
    good = fenced(problems[0].answer["canonical_solution"])
    wrong = fenced("def similar_elements(a, b):\n    return tuple(a)")
    assert [v.correct for v in cb.grade([(problems[0], good), (problems[0], wrong)])] == [True, False]


@needs_data
def test_a_hub_row_with_inputs_that_are_not_literals_runs_its_test_script():
    row = next(r for r in release_rows("mbppplus") if r["task_id"] == "Mbpp/3")  # is_not_prime(n)
    hub = hub_layout(row, inputs_text="[[n] for n in range(2, 30)]",
                     results_text="[not all(n % d for d in range(2, n)) for n in range(2, 30)]")
    problem = code_loaders._evalplus_problem("mbppplus", hub)
    assert problem.answer["mode"] == "script" and problem.answer["entry_point"] == "is_not_prime"
    verdicts = cb.grade([(problem, fenced(row["canonical_solution"])),
                         (problem, fenced("def is_not_prime(n):\n    return n % 2 == 0"))])  # fmt: skip
    assert [(v.correct, v.outcome) for v in verdicts] == [(True, "passed"), (False, "WrongAnswer")]


def test_a_hub_row_naming_no_function_is_skipped():
    hub = {"task_id": 9, "code": "x = 1\n", "prompt": "p", "test_list": ["assert True"], "test": "pass\n"}
    with pytest.raises(KeyError):
        code_loaders._evalplus_problem("mbppplus", hub)


# ----- LiveCodeBench ----------------------------------------------------------------------------


def _packed(tests: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def lcb_rows():
    stdio = {
        "question_id": "abc001_a", "question_content": "Print a+b.", "platform": "atcoder",
        "contest_date": "2024-09-14T00:00:00",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _packed([{"input": "5 7\n", "output": "12\n", "testtype": "stdin"}]),
        "metadata": "{}", "starter_code": "",
    }  # fmt: skip
    method = {
        "question_id": "two-sum", "question_content": "Add.", "platform": "leetcode",
        "contest_date": "2025-01-31T00:00:00",
        "public_test_cases": json.dumps([{"input": "[1, 2]\n3", "output": "[1, 2, 3]", "testtype": "functional"}]),
        "private_test_cases": _packed([]), "metadata": json.dumps({"func_name": "extend"}),
        "starter_code": "class Solution:\n    def extend(self, xs, x):\n        ",
    }  # fmt: skip
    too_old = dict(stdio, question_id="abc000_a", contest_date="2024-07-31T00:00:00")
    too_new = dict(stdio, question_id="abc999_a", contest_date="2025-02-01T00:00:00")
    return [stdio, method, too_old, too_new]


def test_livecodebench_keeps_the_pinned_window_and_reports_its_count(tmp_path):
    folder = tmp_path / "livecodebench"
    folder.mkdir()
    (folder / "test5.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lcb_rows()) + "{broken\n")
    problems = code_loaders.load_livecodebench(tmp_path)
    assert [p.id for p in problems] == ["abc001_a", "two-sum"]
    assert row_count_mismatch(problems) == {"expected": 279, "loaded": 2, "skipped": 1}
    args, kwargs = code_loaders._hub_load_args("livecodebench")
    assert all(f"@{code_loaders.LCB_REVISION}/test" in f for f in kwargs["data_files"])
    assert len(kwargs["data_files"]) == 5


def test_livecodebench_stdin_and_functional_problems():
    stdio, method = (code_loaders._lcb_problem(row) for row in lcb_rows()[:2])
    assert (stdio.answer["n_base"], stdio.answer["n_plus"]) == (1, 1)
    pairs = [
        (stdio, fenced("a, b = map(int, input().split())\nprint(a + b)")),
        (stdio, fenced("a, b = map(int, input().split())\nprint(a * b)")),
        (stdio, fenced("def main():\n    print(sum(map(int, input().split())))\n"
                       "if __name__ == '__main__':\n    main()")),
        (method, fenced("class Solution:\n    def extend(self, xs, x):\n        return tuple(xs + [x])")),
        (method, fenced("class Solution:\n    def extend(self, xs, x):\n        return xs")),
    ]
    verdicts = cb.grade(pairs)
    assert [v.outcome for v in verdicts] == ["passed", "WrongAnswer", "passed", "passed", "WrongAnswer"]
    assert verdicts[1].detail["base_passed"] is False
