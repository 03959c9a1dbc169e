"""Run under `accelerate launch`: build a fixed global rollout batch, train on this process's
share of its groups for two PPO epochs, and (rank 0) save the resulting trainable weights.

    ddp_update_check.py OUT [--uneven] [--by-tokens] [section.key=value ...]
        (extra config overrides, e.g. train.sharding=fsdp2)
    --uneven: the first half of the groups cut to two tokens a row (the last prompt token, the first
              response token), so that the processes' rows differ in length
    --float64: the tiny model in float64 (tests/float64.py), to compare updates whose micro-batches
              differ (float32 rounding, amplified by Adam where a gradient is tiny, reaches ~1e-4)
    --by-tokens: micro-batches by tokens, a budget that holds the short half's rows in one, so
              the processes plan different numbers of micro-batches (each writes its count)

tests/test_multiprocess.py runs it with 1 and with 2 processes and compares the weights.
"""

import dataclasses
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout.batch import sample_responses
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.micro_batches import plan_micro_batches
from meds_cli.engine.training.scoring import score_rollouts
from meds_cli.engine.training.sharding import close_process_group, gathered_parameters, global_max, trainable_state
from tests.conftest import tiny_config
from tests.float64 import float64_norms


def shorten_first_half(batch) -> None:
    """Rows of the first half of the groups keep only their last prompt token and first response token."""
    rows = batch.size // 2
    width = batch.prompt_width
    batch.attention_mask[:rows, :width - 1] = 0
    batch.attention_mask[:rows, width + 1:] = 0
    batch.response_mask[:rows, 1:] = 0


def main(out: Path, args: list[str]) -> None:
    uneven, by_tokens = "--uneven" in args, "--by-tokens" in args
    overrides = [a for a in args if not a.startswith("--")]
    if "--float64" in args:
        model, tokenizer = tiny_model_and_tokenizer()
        with float64_norms():
            run(out, overrides, uneven, by_tokens, (model.double(), tokenizer))
    else:
        run(out, overrides, uneven, by_tokens, None)


def run(out: Path, overrides: list[str], uneven: bool, by_tokens: bool, model_and_tokenizer) -> None:
    cfg = tiny_config("rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3",
                      "train.ppo_epochs=2", "train.micro_batch_size=4", "optim.lr=0.01", "algo.name=grpo",
                      "grpo.loss_agg=token-mean", *overrides, output_dir=out / "run")
    trainer = Trainer(cfg, out / "run", model_and_tokenizer=model_and_tokenizer)
    model, algo = trainer.unwrapped, trainer.algorithm
    problems = trainer.task.train[:4]
    # The same global batch on every process: identical weights and an identical seed.
    torch.manual_seed(1234)
    prompts = [trainer.task.prompt(p, trainer.tokenizer) for p in problems]
    with gathered_parameters(trainer.sharded):
        batch = sample_responses(model, trainer.tokenizer, prompts, problems, 4, temperature=1.0, top_p=1.0,
                                 max_new_tokens=3, batch_size=64)
    if uneven:
        shorten_first_half(batch)
    share = torch.zeros(batch.num_groups, dtype=torch.bool)
    per_rank = batch.num_groups // trainer.world
    share[trainer.rank * per_rank:(trainer.rank + 1) * per_rank] = True
    # Fixed advantages over the global batch: a random tiny model rarely answers right, and a
    # batch without a reward spread would make no update to compare.
    advantages = torch.linspace(-1.0, 1.0, batch.size)[share.repeat_interleave(4)]
    batch = batch.select_groups(share)
    budget = 2 * batch.size if by_tokens else 0  # this process's rows at two tokens each
    if budget:
        trainer.update_settings = dataclasses.replace(trainer.update_settings, micro_batch_tokens=budget)
    packing = trainer.update_settings.packing
    if budget:  # this process's own plan, padded or packed as the update plans it
        planned = len(plan_micro_batches(batch, list(range(batch.size)), size=4, budget=budget, packed=packing.on,
                                         share_prompts=trainer.share_prompts and packing.masked))
        (out / f"planned{trainer.rank}.txt").write_text(str(planned))
    score_rollouts(model, batch, 4, with_reference=False, micro_batch_tokens=budget,
                   most_over_processes=lambda count: int(global_max(trainer.acc, count)),
                   share_prompts=trainer.share_prompts, packing=packing)
    batch.verdicts = trainer.task.grade(list(zip([p for p in batch.problems for _ in range(4)], batch.response_texts)))
    batch.reward_components = algo.reward_components(batch)
    batch.rewards = sum(batch.reward_components.values())
    batch.advantages = advantages
    calls = []  # the forwards of the update, through the wrapper (DDP) or the sharded module (FSDP2)
    hook = trainer.policy.model.register_forward_pre_hook(lambda *args: calls.append(1))
    stats = trainer.update(batch)
    hook.remove()
    (out / f"forwards{trainer.rank}.txt").write_text(str(len(calls)))
    weights = trainable_state(trainer.unwrapped, trainer.sharded, main=trainer.acc.is_main_process)  # every process
    if trainer.acc.is_main_process:
        save_file(weights, str(out / "weights.safetensors"))
        (out / "ratio.txt").write_text(str(stats["ratio_mean"]))
        (out / "world.txt").write_text(str(trainer.world))
        (out / "sharded.txt").write_text(str(trainer.sharded is not None))
        (out / "packed.txt").write_text(str(packing.on))
    close_process_group(trainer.acc)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
