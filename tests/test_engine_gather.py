"""Under FSDP2 the trainer gathers the whole policy for sampling only for an engine that samples
from the training model itself (hf); vLLM is sent its weights one unit at a time (issue 37)."""

import meds_cli.engine.trainer as trainer_module
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config


def test_the_policy_is_gathered_only_for_an_engine_that_reads_it(tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(output_dir=tmp_path / "run"), tmp_path / "run")
    gathered = []
    monkeypatch.setattr(trainer_module, "gathered_parameters", lambda sharded: gathered.append(sharded))
    trainer.policy.sharded = "the FSDP2 units"  # as prepare_policy leaves it under FSDP2
    trainer._gathered_for_engine()  # the hf engine decodes with the training model
    trainer.engine = type("OwnCopyEngine", (), {"reads_policy_weights": False})()
    trainer._gathered_for_engine()
    assert gathered == ["the FSDP2 units", None]
