"""Resume is exact: 4 steps straight equal 2 steps, a checkpoint, a fresh process state, 2 more."""

import json

import torch
from safetensors.torch import load_file

from meds_cli.engine.run_folders.run_dir import MetricsLog, list_checkpoints
from meds_cli.engine.trainer import TIMING_KEYS, Trainer
from tests.conftest import tiny_config


def learning_metrics(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def test_resume_matches_uninterrupted_run(tmp_path):
    common = ("train.checkpoint_every=2", "optim.lr=0.01", "train.ppo_epochs=2", "rollout.prompts_per_step=4",
              "rollout.group_size=8")
    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    straight = Trainer(tiny_config(*common, "train.steps=4"), straight_dir)
    straight.train()

    first = Trainer(tiny_config(*common, "train.steps=2"), split_dir)
    first.train()
    assert list_checkpoints(split_dir) == [2]
    # an extra row as if the process died after step 3 but before its checkpoint: resume must drop it
    MetricsLog(split_dir / "metrics.jsonl").append({"step": 3, "reward": 123.0})
    torch.manual_seed(999)  # disturb global RNG state: resume must not depend on it
    second = Trainer(tiny_config(*common, "train.steps=4"), split_dir)
    second.load_checkpoint(split_dir / "checkpoints" / "step_2")
    assert second.step == 2
    second.train()

    a = learning_metrics(MetricsLog(straight_dir / "metrics.jsonl").rows())
    b = learning_metrics(MetricsLog(split_dir / "metrics.jsonl").rows())
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b
    wa = load_file(str(straight_dir / "checkpoints/step_4/weights.safetensors"))
    wb = load_file(str(split_dir / "checkpoints/step_4/weights.safetensors"))
    assert wa.keys() == wb.keys() and len(wa) > 0
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    state = json.loads((split_dir / "checkpoints/step_4/state.json").read_text())
    assert state["step"] == 4 and state["sampler_position"] == 16


def test_checkpoint_is_written_atomically(tmp_path):
    trainer = Trainer(tiny_config("train.steps=1"), tmp_path)
    trainer.train()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_1"]  # no leftover temporary folder
    contents = {p.name for p in (tmp_path / "checkpoints/step_1").iterdir()}
    states = {f"{name}.{ext}" for name in ("optimizer", "scheduler", "rng_0", "algorithm_0")
              for ext in ("json", "safetensors")}
    assert {"weights.safetensors", "adapter", "state.json", "manifest.json"} | states == contents
    assert not list((tmp_path / "checkpoints/step_1").rglob("*.pt"))
    assert not list((tmp_path / "checkpoints/step_1").rglob("*.bin"))
