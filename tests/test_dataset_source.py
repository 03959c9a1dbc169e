"""The user's own training data: local JSON/JSONL/Parquet files, hub datasets (faked), column mapping, prompt limits."""

import json

import pytest

from benchmarks import dataset_source
from benchmarks.data_files import Row, Skipped
from benchmarks.dataset_source import map_columns, prompt_token_counts, read_local, read_source
from benchmarks.math_benchmarks import load_math_source
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem

ROWS = [{"question": "What is 2 + 2?", "final_answer": "4", "level": 1},
        {"question": "What is 3 * 3?", "final_answer": "9", "level": 2}]


def _data(rows):
    return [row.data for row in rows]


def test_local_json_list_jsonl_and_parquet_read_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "c.parquet")
    for name in ("a.json", "b.jsonl", "c.parquet"):
        skipped = Skipped(name)
        assert _data(read_local(tmp_path / name, skipped)) == ROWS and skipped.total == 0, name


def test_bad_local_files_are_one_line(tmp_path):
    (tmp_path / "broken.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="not a readable Parquet file"):
        read_local(tmp_path / "broken.parquet", Skipped("x"))
    with pytest.raises(UserError, match="not found"):
        read_source(str(tmp_path / "missing.parquet"), Skipped("x"))
    with pytest.raises(UserError, match="not found"):
        read_source(str(tmp_path / "missing.jsonl"), Skipped("x"))
    (tmp_path / "data.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(UserError, match="task.subset and task.revision choose a hub dataset"):
        read_source(str(tmp_path / "data.jsonl"), Skipped("x"), subset="main")
    with pytest.raises(UserError, match="task.path is empty"):
        read_source("", Skipped("x"))


def test_columns_are_mapped_onto_the_task_fields_and_the_rest_kept(tmp_path):
    rows = [Row(i, f"row {i}", r) for i, r in enumerate(ROWS)] + [Row(2, "row 2", "not an object")]
    mapped = map_columns(rows, {"problem": "question", "answer": "final_answer"}, "x")
    assert _data(mapped) == [{"level": 1, "problem": "What is 2 + 2?", "answer": "4"},
                             {"level": 2, "problem": "What is 3 * 3?", "answer": "9"}, "not an object"]
    assert [row.where for row in mapped] == ["row 0", "row 1", "row 2"]
    # through the math task's loader: a JSONL file with a bad line, which is skipped and counted
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "{broken\n")
    problems = load_math_source(str(tmp_path / "data.jsonl"), columns={"problem": "question", "answer": "final_answer"})
    assert [(p.question, p.answer, p.meta) for p in problems] == [("What is 2 + 2?", "4", {"level": 1}),
                                                                 ("What is 3 * 3?", "9", {"level": 2})]


def test_column_mistakes_name_the_columns_there_are():
    rows = [Row(i, f"row {i}", r) for i, r in enumerate(ROWS)]
    with pytest.raises(UserError, match="task.columns.answer is 'answer_text', which is not a column of data.jsonl; "
                                        "its columns: question, final_answer, level"):
        map_columns(rows, {"answer": "answer_text"}, "data.jsonl")
    with pytest.raises(UserError, match="task.columns maps 'prompt', which is not a task field; accepted: problem"):
        map_columns(rows, {"prompt": "question"}, "x")
    with pytest.raises(UserError, match="task.columns.problem must name a column"):
        map_columns(rows, {"problem": 3}, "x")


def test_hub_datasets_are_read_with_subset_split_and_revision(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(name, subset=None, *, split=None, revision=None):
        calls.append((name, subset, split, revision))
        return ROWS

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    problems = load_math_source("someone/math-set", "hard", "test", "abc123",
                                {"problem": "question", "answer": "final_answer"})
    assert calls == [("someone/math-set", "hard", "test", "abc123")]
    assert [(p.question, p.answer) for p in problems] == [("What is 2 + 2?", "4"), ("What is 3 * 3?", "9")]
    read_source("someone/math-set", Skipped("x"))
    assert calls[-1] == ("someone/math-set", None, "train", None)


def test_a_hub_dataset_that_cannot_load_is_one_line(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'someone/math-set' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as err:
        read_source("someone/math-set", Skipped("x"), subset="hard", revision="v1")
    assert "cannot load dataset 'someone/math-set subset hard split train revision v1'" in str(err.value)
    assert "Couldn't reach" in str(err.value) and "\n" not in str(err.value)


def test_prompt_tokens_are_counted_as_the_engines_receive_them():
    from meds_cli.engine.model_io.tiny import tiny_tokenizer

    problems = [Problem(str(i), "1" * length, "1") for i, length in enumerate([3, 8, 5, 12] * 100)]
    counts = prompt_token_counts(problems, lambda p: p.question + "=", tiny_tokenizer())  # 2 chunks of 256
    assert counts == [4, 9, 6, 13] * 100  # one token a character, no special tokens


def test_local_names_and_hub_names_are_told_apart(tmp_path):
    assert dataset_source.is_local("data/train.parquet") and dataset_source.is_local("x.jsonl")
    assert not dataset_source.is_local("openai/gsm8k")
