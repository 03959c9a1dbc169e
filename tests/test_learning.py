"""The loop learns: the tiny in-memory model, trained by the real Trainer on the copy task
(chance reward about 1/53), reaches a mean reward of 0.9. A sign error in the advantage, the
surrogate or the aggregation makes reward fall instead, and this test fail."""

import pytest

from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config

MAX_STEPS = 200


def learn(tmp_path, *overrides) -> list[float]:
    # At lr 0.003 GRPO collapsed on some digits (all 16 samples wrong, so no signal) for about
    # half the seeds; at 0.002 it reached 0.9 within 110 steps for 5 of seeds 0-5, DAPO for 0-1.
    cfg = tiny_config("model.lora.enabled=false", "optim.lr=0.002", f"train.steps={MAX_STEPS}", *overrides,
                      output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    rewards = []
    for _ in range(MAX_STEPS):
        rewards.append(trainer.train_step()["reward"])
        if len(rewards) >= 3 and sum(rewards[-3:]) / 3 >= 0.9:
            break
    return rewards


@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_tiny_model_learns_copy_task(tmp_path, algo):
    rewards = learn(tmp_path, f"algo.name={algo}", "grpo.loss_agg=token-mean")
    assert rewards[0] < 0.2, "the task must start hard"
    assert sum(rewards[-3:]) / 3 >= 0.9, f"{algo} did not learn: last rewards {rewards[-5:]}"
