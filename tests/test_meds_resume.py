"""MEDS memory survives checkpoint and resume: 4 steps straight == 2 steps, resume, 2 steps."""

import pytest
import torch

from meds_cli.engine.run_folders.run_dir import MetricsLog
from meds_cli.engine.trainer import TIMING_KEYS, Trainer
from tests.conftest import tiny_config

# One sampling round a step (no dynamic sampling) keeps the test fast; the memory still grows.
COMMON = ("algo.name=meds", "train.checkpoint_every=2", "optim.lr=0.01", "rollout.prompts_per_step=4",
          "rollout.group_size=8", "rollout.max_new_tokens=3", "dapo.dynamic_sampling=false")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: one thread is faster than two fighting for a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def recording(trainer):
    """Record the shaped rewards of every step (the trainer only logs their mean)."""
    shaped, shape = [], trainer.algorithm.shape_rewards

    def shape_and_record(rollouts):
        shape(rollouts)
        shaped.append(rollouts.rewards.clone())

    trainer.algorithm.shape_rewards = shape_and_record
    return shaped


def learning_rows(path):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in MetricsLog(path).rows()]


def test_meds_resume_is_bit_for_bit(tmp_path):
    straight = Trainer(tiny_config(*COMMON, "train.steps=4"), tmp_path / "straight")
    straight_shaped = recording(straight)
    straight.train()

    first = Trainer(tiny_config(*COMMON, "train.steps=2"), tmp_path / "split")
    first.train()
    torch.manual_seed(123)  # resume must not depend on the global RNG
    second = Trainer(tiny_config(*COMMON, "train.steps=4"), tmp_path / "split")
    second.load_checkpoint(tmp_path / "split" / "checkpoints" / "step_2")
    assert second.algorithm.memory.entries() > 0  # the memory came back from the checkpoint
    split_shaped = recording(second)
    second.train()

    assert len(straight_shaped) == 4 and len(split_shaped) == 2
    for a, b in zip(straight_shaped[2:], split_shaped):
        assert torch.equal(a, b)
    a, b = learning_rows(tmp_path / "straight/metrics.jsonl"), learning_rows(tmp_path / "split/metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b
    assert any(r.get("meds/wrong_penalty_mean", 0) > 0 for r in a)  # the shaping did something
    mem_a, mem_b = straight.algorithm.memory.state_dict(), second.algorithm.memory.state_dict()
    assert mem_a.keys() == mem_b.keys()
    for pid in mem_a:
        for kind in mem_a[pid]:
            x, y = mem_a[pid][kind], mem_b[pid][kind]
            assert torch.equal(x["features"], y["features"])
            assert {k: v for k, v in x.items() if k != "features"} == {k: v for k, v in y.items() if k != "features"}
