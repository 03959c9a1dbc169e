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
