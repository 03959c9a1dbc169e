"""Seconds per training step of several CPU processes under DDP (train.sharding=none) and FSDP2
(train.sharding=fsdp2), same run otherwise, launched one after the other.

    python scripts/bench_sharding.py [--processes 2] [--steps 6] [--set section.key=value ...]

Each variant is a `meds train` run on the tiny model under `accelerate launch` (the multi-GPU
launcher with ACCELERATE_USE_CPU=1: `accelerate launch --cpu` starts a single process). The
first step is left out of the medians (lazy initialisation, first collectives).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = ["--model", "tiny-llama", "--task", "copy", "--algo", "grpo", "--quiet",
       "--set", "rollout.prompts_per_step=8", "--set", "rollout.group_size=8", "--set", "rollout.max_new_tokens=8",
       "--set", "train.ppo_epochs=2", "--set", "train.micro_batch_size=8", "--set", "train.checkpoint_every=0"]
KEYS = ["time_step_s", "time_generate_s", "time_score_s", "time_train_s"]


def run(sharding: str, processes: int, steps: int, extra: list[str], folder: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = folder / sharding
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
           "-m", "meds_cli", "train", *RUN, "--steps", str(steps), "--output", str(out),
           "--set", f"train.sharding={sharding}", *[a for kv in extra for a in ("--set", kv)]]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-sharding-"))
    medians = {}
    for sharding in ("none", "fsdp2"):
        rows = run(sharding, args.processes, args.steps, args.overrides, folder)[1:]
        medians[sharding] = {k: statistics.median(r[k] for r in rows) for k in KEYS}
    print(f"{args.processes} CPU processes, tiny Llama, {args.steps} steps (median of steps 2..{args.steps}), seconds:")
    print(f"{'sharding':>9} " + " ".join(f"{k.removeprefix('time_').removesuffix('_s'):>9}" for k in KEYS))
    for sharding, values in medians.items():
        print(f"{'DDP' if sharding == 'none' else 'FSDP2':>9} " + " ".join(f"{values[k]:>9.3f}" for k in KEYS))
    ratio = medians["fsdp2"]["time_train_s"] / max(medians["none"]["time_train_s"], 1e-9)
    print(f"FSDP2 / DDP update time: {ratio:.2f}")


if __name__ == "__main__":
    main()
