"""Run under `accelerate launch`: build a fixed global rollout batch, train on this process's
share of its groups for two PPO epochs, and (rank 0) save the resulting trainable weights.

    ddp_update_check.py OUT [section.key=value ...]   (extra config overrides, e.g. train.sharding=fsdp2)

tests/test_multiprocess.py runs it with 1 and with 2 processes and compares the weights.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from meds_cli.engine.rollout.batch import sample_responses
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.scoring import score_rollouts
from meds_cli.engine.training.sharding import close_process_group, gathered_parameters, trainable_state
from tests.conftest import tiny_config


def main(out: Path, overrides: list[str]) -> None:
    cfg = tiny_config("rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=3",
                      "train.ppo_epochs=2", "train.micro_batch_size=4", "optim.lr=0.01", "algo.name=grpo",
                      "grpo.loss_agg=token-mean", *overrides, output_dir=out / "run")
    trainer = Trainer(cfg, out / "run")
    model, algo = trainer.unwrapped, trainer.algorithm
    problems = trainer.task.train[:4]
    # The same global batch on every process: identical weights and an identical seed.
    torch.manual_seed(1234)
    prompts = [trainer.task.prompt(p, trainer.tokenizer) for p in problems]
    with gathered_parameters(trainer.sharded):
        batch = sample_responses(model, trainer.tokenizer, prompts, problems, 4, temperature=1.0, top_p=1.0,
                                 max_new_tokens=3, batch_size=64)
    share = torch.zeros(batch.num_groups, dtype=torch.bool)
    per_rank = batch.num_groups // trainer.world
    share[trainer.rank * per_rank:(trainer.rank + 1) * per_rank] = True
    # Fixed advantages over the global batch: a random tiny model rarely answers right, and a
    # batch without a reward spread would make no update to compare.
    advantages = torch.linspace(-1.0, 1.0, batch.size)[share.repeat_interleave(4)]
    batch = batch.select_groups(share)
    score_rollouts(model, batch, 4, with_reference=False)
    batch.verdicts = trainer.task.grade(list(zip([p for p in batch.problems for _ in range(4)], batch.response_texts)))
    batch.reward_components = algo.reward_components(batch)
    batch.rewards = sum(batch.reward_components.values())
    batch.advantages = advantages
    stats = trainer.update(batch)
    weights = trainable_state(trainer.unwrapped, trainer.sharded, main=trainer.acc.is_main_process)  # every process
    if trainer.acc.is_main_process:
        save_file(weights, str(out / "weights.safetensors"))
        (out / "ratio.txt").write_text(str(stats["ratio_mean"]))
        (out / "world.txt").write_text(str(trainer.world))
        (out / "sharded.txt").write_text(str(trainer.sharded is not None))
    close_process_group(trainer.acc)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
