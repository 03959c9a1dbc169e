"""Run under `accelerate launch`: two training steps of outcome-ucb on the tiny model; each
process writes its count table and the (question, answer) pairs it sampled itself.

    outcome_counts_check.py OUT

tests/test_outcome_ucb_processes.py runs it with 2 processes: the tables must be equal on both
and hold exactly the pairs both sampled (one table per question over all processes).
"""

import dataclasses
import json
import sys
from pathlib import Path

from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.sharding import close_process_group
from tests.conftest import tiny_config


def main(out: Path) -> None:
    cfg = tiny_config("algo.name=outcome-ucb", "rollout.prompts_per_step=4", "rollout.group_size=4",
                      "rollout.max_new_tokens=3", "model.lora.enabled=false", "train.steps=2",
                      output_dir=out / "run")
    trainer = Trainer(cfg, out / "run")
    algo, own = trainer.algorithm, []
    gather = algo.context.gather

    def spy(value):
        own.extend(value)
        return gather(value)

    algo.context = dataclasses.replace(algo.context, gather=spy)
    for _ in range(2):
        trainer.train_step()
    rank = trainer.rank
    (out / f"rank{rank}.json").write_text(json.dumps({
        "world": trainer.world, "own": own, "counts": {q: dict(c) for q, c in algo.counts.items()}}))
    close_process_group(trainer.acc)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
