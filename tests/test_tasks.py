"""Training tasks: the arithmetic task's splits and its reward, which boxed expressions cannot game."""

import pytest

from benchmarks.tasks import PromptSampler, build_task, grade_integer
from meds_cli.engine.config import TaskConfig, load_config
from meds_cli.core.errors import UserError


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
