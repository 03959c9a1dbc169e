"""Step time of synchronous (rollout.max_staleness=0) against one-step off-policy (k=1) training
with the sampler in a process of its own (rollout.engine=hf-worker), side by side in one run:
the trainer pinned to one core and the worker to another (taskset's placement, set here with
sched_setaffinity), and the same work colocated today (rollout.engine=hf on both cores).

Prints, per setting, the mean step time (the first step, which starts the worker and warms up,
left out), the overlap share, the time waiting for rollouts and tokens/s (generated tokens over
the step time). The target: k=1 at most 0.65 of k=0's step time with the same placement.

    .venv/bin/python scripts/bench_async.py --steps 6 --new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("MEDS_CPU_FAST_PATHS", "default")


def run(engine: str, k: int, cores: set[int], worker_cores: str, args) -> dict:
    import torch

    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    folder = Path(tempfile.mkdtemp(prefix="bench-async-"))
    cfg = load_config(overrides=[
        "algo.name=grpo", f"model.name={args.model}", "task.name=arithmetic", f"train.steps={args.steps}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.new_tokens}", f"rollout.min_new_tokens={args.new_tokens}",
        f"rollout.engine={engine}", f"rollout.max_staleness={k}", f"rollout.worker.cores={worker_cores}",
        "train.checkpoint_every=0", "optim.warmup_steps=0", "model.lora.rank=8", "train.mixed_precision=no",
        f"train.micro_batch_size={args.prompts * args.group}", f"train.output_dir={folder}"])
    trainer = Trainer(cfg, folder)
    rows = []
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            row = trainer.train_step()
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
    finally:
        trainer.close()
    timed = rows[1:] or rows
    tokens = args.prompts * args.group * args.new_tokens
    step = statistics.mean(r["wall_s"] for r in timed)
    return {"step_s": step, "tokens_per_s": tokens / step,
            "overlap": statistics.mean(r.get("overlap_share", 0.0) for r in timed),
            "wait_s": statistics.mean(r.get("time_wait_rollouts_s", r["time_generate_s"]) for r in timed),
            "staleness": max(r.get("rollout/staleness_max", 0.0) for r in timed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores: one for the trainer, one for the worker")
    trainer_core, worker_core = cores[0], cores[1]
    settings = [("hf-worker k=0", "hf-worker", 0, {trainer_core}, str(worker_core)),
                ("hf-worker k=1", "hf-worker", 1, {trainer_core}, str(worker_core)),
                ("hf colocated, 2 cores", "hf", 0, {trainer_core, worker_core}, "")]
    results = {name: run(engine, k, placement, worker, args) for name, engine, k, placement, worker in settings}
    os.sched_setaffinity(0, set(cores))
    print(f"{args.model}, {args.prompts}x{args.group} samples x {args.new_tokens} forced tokens, "
          f"{args.steps} steps (first left out); trainer core {trainer_core}, worker core {worker_core}")
    print(f"{'setting':24} {'step s':>8} {'vs k=0':>7} {'overlap':>8} {'wait s':>7} {'tok/s':>8} {'stale':>6}")
    base = results["hf-worker k=0"]["step_s"]
    for name, r in results.items():
        print(f"{name:24} {r['step_s']:8.3f} {r['step_s'] / base:7.2f} {r['overlap']:8.2f} {r['wait_s']:7.3f} "
              f"{r['tokens_per_s']:8.1f} {r['staleness']:6.0f}")


if __name__ == "__main__":
    main()
