"""Training tasks: the arithmetic task's splits and its reward, which boxed expressions cannot game; the
math task's data file, whose bad rows are skipped and counted."""

import json
import logging

import pytest

from benchmarks.tasks import PromptSampler, build_task, grade_integer
from meds_cli.core.errors import UserError
from meds_cli.engine.config import TaskConfig, load_config


def test_arithmetic_splits_are_seeded_and_disjoint():
    cfg = TaskConfig(operations=["add", "mul"], digits=2, train_size=300, eval_size=40)
    a, b, c = build_task(cfg, 0), build_task(cfg, 0), build_task(cfg, 1)
    assert [p.question for p in a.train] == [p.question for p in b.train]
    assert [p.question for p in a.train] != [p.question for p in c.train]
    assert len(a.held_out) == 40 and len(a.train) == 300
    assert not {p.question for p in a.train} & {p.question for p in a.held_out}
    for p in a.train[:20]:
        x, op, y = p.question.removeprefix("What is ").removesuffix("?").split()
        assert p.answer == (int(x) + int(y) if op == "+" else int(x) * int(y))
        assert 10 <= int(x) <= 99


def test_arithmetic_rejects_unknown_operations():
    with pytest.raises(UserError, match="add, sub, mul"):
        load_config(overrides=["task.operations=[pow]"])


@pytest.mark.parametrize("response, gold, fmt, correct", [
    ("so the answer is \\boxed{109}", 109, "boxed", True),
    ("\\boxed{27 + 82}", 109, "boxed", False),          # an expression equal to the answer is not the answer
    ("\\boxed{109.0}", 109, "boxed", False),
    ("\\boxed{1,234}", 1234, "boxed", True),
    ("27 + 82 = 109", 109, "boxed", False),              # nothing boxed, and the format demands a box
    ("27 + 82 = 109", 109, "boxed_or_last_integer", True),
    ("27 + 82", 109, "boxed_or_last_integer", False),     # the last number is 82
    ("\\boxed{7} no wait 8", 7, "boxed_or_last_integer", True),  # a box wins over later numbers
    ("\\boxed{10 9}", 109, "boxed", False),               # a separator never joins two numbers
    ("\\boxed{1, 234}", 1234, "boxed", False),
    ("\\boxed{1,\\!234}", 1234, "boxed", True),          # a thousands separator as MATH writes it
    ("\\boxed{109.000000}", 109, "boxed", False),         # the integer reward wants an integer
    ("it is 10 9", 109, "boxed_or_last_integer", False),  # the last number is 9
])
def test_integer_reward(response, gold, fmt, correct):
    assert grade_integer(response, gold, fmt).correct is correct


def test_prompt_sampler_is_resumable():
    straight = PromptSampler(7, seed=3)
    first = straight.take(10) + straight.take(10)
    resumed = PromptSampler(7, seed=3)
    part = resumed.take(10)
    again = PromptSampler(7, seed=3, position=resumed.position)
    assert part + again.take(10) == first
    assert sorted(first[:7]) == list(range(7))  # every problem once per epoch


def test_math_task_skips_bad_rows_and_counts_them(tmp_path, caplog):
    path = tmp_path / "train.jsonl"
    good = [json.dumps({"problem": f"p{i}", "answer": str(i)}) for i in range(20)]
    path.write_bytes("\n".join(good[:10] + ['{"problem": "cut', '{"problem": "q", "answer": null}']).encode()
                     + b"\n\xff\xfe\n" + "\n".join(good[10:]).encode())
    with caplog.at_level(logging.WARNING):
        task = build_task(TaskConfig(name="math", path=str(path), eval_size=2), 0)
    assert len(task.train) + len(task.held_out) == 20 and len(task.held_out) == 2
    assert all(p.answer != "None" for p in task.train + task.held_out)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "skipped 3 of 23 rows" in warning and "1 not valid JSON (line 11)" in warning
    assert "1 without an answer (line 12)" in warning and "1 not UTF-8 text (line 13)" in warning


@pytest.mark.parametrize("content, message", [
    (b'[{"problem": "p", "answer": "1"},', "is not valid JSON (line 1, column 34"),
    (b'[{"problem": "caf\xe9", "answer": "1"}]', "is not UTF-8 text"),
    (b'{"problem": "p"}\n{"question": "q", "answer": ""}\n', "has no usable row: 2 without an answer (line 1, line 2)"),
    (b'{"answer": "1"}\n', "has no usable row: 1 without a problem text (line 1)"),
    (b"\x00\x01binary\n\xff", "has no usable row: 1 not valid JSON (line 1), 1 not UTF-8 text (line 2)"),
    (b"  \n", "is empty"),
    (b'{"rows": [1, 2]}', "has no usable row: 1 without a problem text (line 1)"),
])
def test_math_task_unusable_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "train.json"
    path.write_bytes(content)
    with pytest.raises(UserError) as error:
        _ = build_task(TaskConfig(name="math", path=str(path)), 0).train  # splits are made on first use
    assert message in str(error.value) and str(path) in str(error.value)
    assert "\n" not in str(error.value)
