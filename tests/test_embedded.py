"""One real training step of each base algorithm on the embedded SmolLM2-135M default."""

import math

import pytest

from meds_cli.engine.config import load_config
from meds_cli.engine.run_folders.run_dir import list_checkpoints
from meds_cli.engine.trainer import Trainer
from tests.conftest import needs_embedded


@needs_embedded
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "dapo"])
def test_one_real_step_on_smollm2(tmp_path, algo):
    cfg = load_config(["configs/smollm2.yaml"], [
        f"algo.name={algo}", "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=24", "dapo.max_gen_batches=1", "train.checkpoint_every=1"])
    trainer = Trainer(cfg, tmp_path)
    rows = trainer.train()
    row = rows[0]
    assert row["step"] == 1 and row["response_length_mean"] > 0
    assert math.isfinite(row.get("loss", 0.0))
    assert list_checkpoints(tmp_path) == [1]
    assert (tmp_path / "checkpoints/step_1/adapter/adapter_config.json").is_file()
