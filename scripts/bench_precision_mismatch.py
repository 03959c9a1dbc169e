"""The sampler/trainer mismatch at each precision: how far the `hf` engine's log-probs of its own
tokens are from the scoring pass's log-probs of the same tokens (the quantity
rollout.is_correction corrects for), in float32 and under bf16 on the CPU.

One meds training step's collection (sampling, then a forced scoring pass) on the embedded
SmolLM2-135M with a LoRA adapter whose B matrices are made non-zero (so the merged weights the
sampler multiplies differ from the base), arithmetic prompts, responses up to --tokens (lengths
are not forced: min_new_tokens masks the stop tokens in the sampler's distribution only, a
mismatch of its own).
Printed for each precision: mean and largest |sampler logp - scoring logp| over response tokens,
and the mean k1 estimate of KL(sampler || scorer) per token. Under bf16 both sides compute in
bf16 (decoding from bf16 weight copies, the scoring pass under bf16 autocast); the `cross` row
scores bf16 samples in float32, the mismatch a bf16 sampler would leave against a float32 trainer.

    python scripts/bench_precision_mismatch.py [--prompts 2] [--group 4] [--tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch


def collect(precision: str, args, seed_b: int = 0):
    from accelerate.state import AcceleratorState

    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    AcceleratorState._reset_state(True)
    cfg = load_config(overrides=[
        "algo.name=grpo", "model.name=smollm2-135m", "task.name=arithmetic", "task.prompt_style=chat",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.tokens}", "rollout.temperature=1.0",
        "grpo.kl_coef=0", "train.steps=1", "train.checkpoint_every=0", "train.scoring_pass=always",
        f"train.mixed_precision={precision}"])
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-mismatch-")))
    generator = torch.Generator().manual_seed(seed_b)
    with torch.no_grad():
        for name, p in trainer.unwrapped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.01)
    torch.manual_seed(0)
    batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
    return trainer, batch


def summary(sampler: torch.Tensor, scorer: torch.Tensor, mask: torch.Tensor) -> str:
    diff = (sampler - scorer)[mask]
    return (f"mean |d logp| {diff.abs().mean().item():.2e}, largest {diff.abs().max().item():.2e}, "
            f"k1 KL per token {diff.mean().item():+.2e} ({int(mask.sum())} tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    rows = {}
    for precision in ("no", "bf16"):
        trainer, batch = collect(precision, args)
        mask = batch.response_mask.bool()
        rows["float32" if precision == "no" else "bf16"] = summary(batch.sampler_logp, batch.old_logp, mask)
        if precision == "bf16":
            from meds_cli.engine.training.scoring import score_rollouts, scoring_temperature

            bf16_sampled = batch.sampler_logp.clone()
            trainer.unwrapped.eval()
            score_rollouts(trainer.unwrapped, batch, trainer.cfg.train.micro_batch_size, with_reference=False,
                           temperature=scoring_temperature(1.0))  # outside autocast: float32
            rows["cross"] = summary(bf16_sampled, batch.old_logp, mask)
    for name, text in rows.items():
        print(f"{name:>8}: {text}")


if __name__ == "__main__":
    main()
