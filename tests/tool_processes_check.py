"""Run under `accelerate launch` with 2 CPU processes by tests/test_tool_engines.py (slow): two
steps of the tiny model with rollout.tools on through the hf-worker engine, whose pipeline agrees
with the other process at every call (a collective). The tiny model writes '.' often, the closing
tag here, so its responses pause at it, and the processes' responses take different numbers of turns.

    tool_processes_check.py OUT

OUT/calls<rank>.json: per engine call of the process (its pipeline's generate), the stop strings and
the number of requests; OUT/rows<rank>.json: the step rows; OUT/world.txt: the world size seen.
"""

import json
import sys
from pathlib import Path

from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.sharding import close_process_group
from tests.conftest import tiny_config


def main(out: Path) -> None:
    cfg = tiny_config("rollout.engine=hf-worker", "rollout.prompts_per_step=4", "rollout.group_size=2",
                      "rollout.max_new_tokens=24", "train.steps=2", "rollout.tools=[python]",
                      "rollout.code_tags=['=', '.']", "rollout.max_tool_calls=2", "rollout.tool_time_limit_s=5",
                      output_dir=out / "run")
    trainer = Trainer(cfg, out / "run")
    calls: list = []
    generate = trainer.engine.generate

    def recording(requests, settings):
        calls.append([list(settings.stop_strings), len(requests)])
        return generate(requests, settings)

    trainer.engine.generate = recording
    try:
        rows = [trainer.train_step() for _ in range(cfg.train.steps)]
    finally:
        trainer.close()
    (out / f"calls{trainer.rank}.json").write_text(json.dumps(calls))
    (out / f"rows{trainer.rank}.json").write_text(json.dumps(rows))
    if trainer.rank == 0:
        (out / "world.txt").write_text(str(trainer.world))
    close_process_group(trainer.acc)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
