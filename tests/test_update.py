"""The update (meds_cli/engine/training/update.py): one optimizer step per mini-batch, gradient
checkpointing that recomputes layers without changing the update (LoRA and full weights), and the
warning for low-precision trainable weights."""

import pytest
import torch

from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.trainer import TIMING_KEYS, Trainer
from tests.conftest import tiny_config

SMALL = ("rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3", "optim.lr=0.05")


def trainable(trainer):
    return {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if p.requires_grad}


def test_one_optimizer_step_per_mini_batch(tmp_path):
    cfg = tiny_config(*SMALL, "train.mini_batch_size=8", "train.micro_batch_size=3", "train.ppo_epochs=2",
                      "train.steps=1")
    trainer = Trainer(cfg, tmp_path)
    calls = []
    trainer.optimizer.optimizer.register_step_post_hook(lambda *args: calls.append(1))  # inside Accelerate's wrapper
    row = trainer.train_step()
    assert len(calls) == 4 == row["optimizer_steps"]  # 16 sequences / 8 per mini-batch x 2 epochs
    assert trainer.scheduler.last_epoch == 4


@pytest.mark.parametrize("lora", [True, False])
def test_gradient_checkpointing_recomputes_and_changes_nothing(tmp_path, lora):
    # Prompts run with their responses in one call on both sides (checkpointing turns sharing off).
    common = (*SMALL, "train.ppo_epochs=2", "train.micro_batch_size=8", f"model.lora.enabled={str(lora).lower()}",
              "train.share_prompts=false")
    results = {}
    for checkpointing in (False, True):
        cfg = tiny_config(*common, f"train.gradient_checkpointing={str(checkpointing).lower()}")
        trainer = Trainer(cfg, tmp_path / str(checkpointing))
        layer = trainer.unwrapped.get_base_model().model.layers[0] if lora else trainer.unwrapped.model.layers[0]
        torch.manual_seed(0)
        batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
        calls, forward = [], layer.mlp.forward
        # runs inside the checkpoint; the defaults bind this iteration's list and forward
        layer.mlp.forward = lambda *a, _calls=calls, _forward=forward, **k: (_calls.append(1), _forward(*a, **k))[1]
        stats = trainer.update(batch)
        results[checkpointing] = (trainable(trainer), stats, len(calls))
    (plain, plain_stats, plain_calls), (ckpt, ckpt_stats, ckpt_calls) = results[False], results[True]
    micro_batches = 2 * 2  # 16 sequences in micro-batches of 8, two epochs
    assert plain_calls == micro_batches
    assert ckpt_calls == 2 * micro_batches  # every layer forward runs again in backward
    assert plain.keys() == ckpt.keys()
    for name in plain:
        assert torch.allclose(plain[name], ckpt[name], atol=1e-6), name
    assert ckpt_stats["loss"] == pytest.approx(plain_stats["loss"], abs=1e-6)
    assert ckpt_stats["grad_norm"] == pytest.approx(plain_stats["grad_norm"], rel=1e-5)


def test_training_bf16_weights_is_warned_about(tmp_path, capsys):
    model, tokenizer = tiny_model_and_tokenizer()
    cfg = tiny_config(*SMALL, "model.lora.enabled=false", "train.steps=1")
    Trainer(cfg, tmp_path / "bf16", model_and_tokenizer=(model.to(torch.bfloat16), tokenizer))
    assert "bfloat16 parameters with AdamW" in capsys.readouterr().err
    model, tokenizer = tiny_model_and_tokenizer()
    Trainer(cfg, tmp_path / "fp32", model_and_tokenizer=(model, tokenizer))
    Trainer(tiny_config(*SMALL, "train.steps=1"), tmp_path / "lora",
            model_and_tokenizer=(model.to(torch.bfloat16), tokenizer))
    assert "AdamW" not in capsys.readouterr().err  # fp32 weights, or fp32 LoRA over a frozen bf16 base


def test_timing_keys_cover_the_score_time():
    assert "time_score_s" in TIMING_KEYS
