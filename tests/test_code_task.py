"""The code training task: MBPP+ problems from the data folder, rewards from the sandbox."""

from pathlib import Path

import pytest

from benchmarks.tasks import build_task
from meds_cli.engine.training.algorithm_setup import build_algorithm
from tests.conftest import tiny_config
from tests.rollout_factory import make_rollouts

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "mbppplus").is_dir(), reason="needs ../shared/data")


def test_mbppplus_task_splits_prompts_and_rewards():
    cfg = tiny_config("task.name=mbppplus", f"task.path={DATA}", "task.eval_size=20", "task.prompt_style=boxed",
                      "task.code_reward=pass_rate")
    task = build_task(cfg.task, seed=0)
    assert len(task.train) + len(task.held_out) == 378 and len(task.held_out) == 20
    assert not {p.id for p in task.train} & {p.id for p in task.held_out}
    problem = next(p for p in task.train if p.id == "Mbpp/2")
    assert "```python" in task.prompt(problem, None)
    good = f"```python\n{problem.answer['canonical_solution']}\n```"
    wrong = "```python\ndef similar_elements(a, b):\n    return (1,)\n```"
    crash = "```python\ndef similar_elements(a, b):\n    return 1 / 0\n```"
    verdicts = task.grade([(problem, good), (problem, wrong), (problem, crash), (problem, "no code here")])
    assert [v.correct for v in verdicts] == [True, False, False, False]
    assert verdicts[0].detail["credit"] == 1.0 and 0.0 <= verdicts[1].detail["credit"] < 1.0
    assert verdicts[2].outcome == "ZeroDivisionError" and verdicts[2].detail["credit"] == 0.0
    assert verdicts[3].outcome == "no_program"  # no code at all: its own class, not a SyntaxError
    batch = make_rollouts([v.correct for v in verdicts], 4)
    batch.verdicts = verdicts
    rewards = build_algorithm(cfg).reward_components(batch)["correctness"]
    assert rewards.tolist() == pytest.approx([1.0, verdicts[1].detail["credit"], 0.0, 0.0])
