"""eval.every: a quick greedy eval on the task's held-out problems lands in metrics.jsonl."""

from meds_cli.engine.run_folders.run_dir import MetricsLog
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config


def test_quick_eval_every_n_steps(tmp_path):
    trainer = Trainer(tiny_config("train.steps=2", "eval.every=2", "eval.problems=6"), tmp_path)
    trainer.train()
    first, second = MetricsLog(tmp_path / "metrics.jsonl").rows()
    assert "eval/accuracy" not in first
    assert second["eval/problems"] == 6 and 0.0 <= second["eval/accuracy"] <= 1.0
    # greedy decoding: the same weights give the same held-out accuracy
    assert trainer.quick_eval()["eval/accuracy"] == second["eval/accuracy"]


def test_quick_eval_grades_the_models_text_not_the_tools_output(monkeypatch):
    """A `\\boxed{}` a tool printed sits in an observation: the quick eval grades the text the model
    wrote (answer_texts), so a response whose only right answer is the tool's counts as wrong."""
    from contextlib import nullcontext

    from meds_cli.core.records import Problem, Verdict
    from meds_cli.engine.rollout import quick_eval
    from tests.rollout_factory import make_rollouts

    observation = "```output\n\\boxed{5}\n```\n"
    tool_only = "```python\nprint('\\\\boxed{%d}' % (2 + 3))\n```\n" + observation + "So it is 4."
    own = "```python\nprint(2 + 3)\n```\n```output\n5\n```\nSo it is \\boxed{5}."
    batch = make_rollouts([False, False], group_size=1)
    batch.response_texts = [tool_only, own]
    start = tool_only.index(observation)
    batch.observation_spans = [[(start, start + len(observation))], [(own.index("```output"), own.index("So"))]]
    monkeypatch.setattr(quick_eval, "sample_rollouts", lambda *args, **kwargs: batch)
    monkeypatch.setattr(quick_eval, "sampling_settings", lambda *args, **kwargs: None)
    graded = []

    class Task:
        held_out = [Problem("p0", "2 + 3", "5"), Problem("p1", "2 + 3", "5")]

        def prompt(self, problem, tokenizer):
            return problem.question

        def grade(self, pairs):
            graded.extend(text for _, text in pairs)
            return [Verdict("\\boxed{5}" in text, None, "") for _, text in pairs]

    cfg = tiny_config("eval.problems=2")
    result = quick_eval.held_out_accuracy(None, None, Task(), cfg, 0, 1, nullcontext(), lambda value: value)
    assert graded == batch.answer_texts and "\\boxed{5}" not in graded[0]
    assert result["eval/accuracy"] == 0.5 and result["eval/problems"] == 2
