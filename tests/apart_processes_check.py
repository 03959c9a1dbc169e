"""Run under `accelerate launch` with 2 CPU processes by tests/test_apart_processes.py: the engines
that run apart from the trainer under several training processes, one run after another in the
same two processes (a launch costs more than a run of the tiny model).

    apart_processes_check.py OUT SERVER_URL

For each run of RUNS, OUT/<run>/ gets weights.safetensors (process 0: the trained weights) and
versions<rank>.json (per step, the policy version of each rollout the process trained on) and
seeds<rank>.json (every per-sample seed the process sent its engine apart). Then
process 1 kills its hf worker after a step, both try the next step, and each writes the line it
ended with to OUT/gone<rank>.txt (and process 1 the worker's pid to OUT/killed.txt). OUT/world.txt:
the world size seen.
"""

import json
import os
import signal
import sys
from pathlib import Path

from safetensors.torch import save_file

from meds_cli.engine.rollout.pipeline import RolloutEngineGone
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.sharding import close_process_group, trainable_state
from tests.conftest import tiny_config

STEPS = 3
RUNS = {
    "hf": ["rollout.engine=hf"],
    "worker-k0": ["rollout.engine=hf-worker"],
    "worker-k1": ["rollout.engine=hf-worker", "rollout.max_staleness=1"],
    "server-k1": ["rollout.engine=vllm-server", "rollout.max_staleness=1"],
}


def trainer_for(folder: Path, overrides: list[str]) -> Trainer:
    # DAPO: the copy task's rewards have a spread in a few groups only, so it takes extra rounds,
    # which the processes line up (and the update is not zero, as GRPO's is there)
    cfg = tiny_config("algo.name=dapo", "rollout.prompts_per_step=4", "rollout.group_size=4", "optim.lr=0.01",
                      f"train.steps={STEPS}", *overrides, output_dir=folder)
    return Trainer(cfg, folder)


def record_versions(trainer: Trainer, versions: list) -> None:
    """Keep, per step, the policy version of each rollout this process sampled."""
    collect = trainer.collect

    def recording(timing):
        batch, sampled, info = collect(timing)
        versions.append(sampled.sampler_version.tolist() if sampled.sampler_version is not None else None)
        return batch, sampled, info

    trainer.collect = recording


def record_seeds(trainer: Trainer, seeds: list) -> None:
    """Keep every seed this process sends its engine apart."""
    engine = trainer.engine.engine
    submit = engine.submit

    def recording(requests, settings):
        seeds.extend(seed for request in requests for seed in request.seeds)
        return submit(requests, settings)

    engine.submit = recording


def train(out: Path, name: str, overrides: list[str]) -> None:
    folder = out / name
    trainer = trainer_for(folder, overrides)
    versions: list = []
    record_versions(trainer, versions)
    seeds: list = []
    if name != "hf":
        record_seeds(trainer, seeds)
    try:
        for _ in range(STEPS):
            trainer.train_step()
    finally:
        trainer.close()
    weights = trainable_state(trainer.unwrapped, trainer.sharded, main=trainer.acc.is_main_process)
    if trainer.acc.is_main_process:
        save_file(weights, str(folder / "weights.safetensors"))
    (folder / f"versions{trainer.rank}.json").write_text(json.dumps(versions))
    (folder / f"seeds{trainer.rank}.json").write_text(json.dumps(seeds))


def kill_a_worker(out: Path) -> None:
    trainer = trainer_for(out / "killed", ["rollout.engine=hf-worker"])
    try:
        trainer.train_step()
        if trainer.rank == 1:
            worker = trainer.engine.engine.process
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(timeout=10)
            (out / "killed.txt").write_text(str(worker.pid))
        try:
            trainer.train_step()
            line = "no error"
        except RolloutEngineGone as gone:
            line = str(gone)
    finally:
        trainer.close()
    (out / f"gone{trainer.rank}.txt").write_text(line)
    if trainer.rank == 0:
        (out / "world.txt").write_text(str(trainer.world))
    close_process_group(trainer.acc)


def main(out: Path, server_url: str) -> None:
    for name, overrides in RUNS.items():
        extra = [f"rollout.server.url={server_url}"] if name.startswith("server") else []
        train(out, name, [*overrides, *extra])
    kill_a_worker(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
