"""Time the training loop on the embedded default: seconds per step split into generate /
score / train, generated tokens per second, and peak memory.

    python scripts/bench_train.py [--steps 3] [--config configs/meds_smollm2.yaml] [--set key=value ...]
"""

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch

from meds_cli.engine.config import load_config
from meds_cli.engine.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--config", default="configs/meds_smollm2.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    cfg = load_config([args.config], [f"train.steps={args.steps}", "train.checkpoint_every=0", *args.overrides])
    start = time.perf_counter()
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-train-")))
    load_s = time.perf_counter() - start
    rows = [trainer.train_step() for _ in range(args.steps)]
    print(f"model {cfg.model.name}, algorithm {cfg.algo.name}, {cfg.rollout.prompts_per_step} prompts x "
          f"{cfg.rollout.group_size} samples, max {cfg.rollout.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads")
    print(f"setup (model load + LoRA): {load_s:.1f} s")
    print(f"{'step':>4} {'generate s':>11} {'score s':>8} {'train s':>8} {'total s':>8} {'tokens/s':>9} "
          f"{'mean len':>9}")
    for row in rows:
        print(f"{row['step']:>4} {row['time_generate_s']:>11.2f} {row['time_score_s']:>8.2f} "
              f"{row['time_train_s']:>8.2f} {row['time_step_s']:>8.2f} {row['tokens_per_s']:>9.1f} "
              f"{row['response_length_mean']:>9.1f}")
    n = len(rows)
    mean = {k: sum(r[k] for r in rows) / n
            for k in ["time_generate_s", "time_score_s", "time_train_s", "time_step_s", "tokens_per_s"]}
    print(f"mean {mean['time_generate_s']:>11.2f} {mean['time_score_s']:>8.2f} {mean['time_train_s']:>8.2f} "
          f"{mean['time_step_s']:>8.2f} {mean['tokens_per_s']:>9.1f}")
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory: {peak_rss_mb:.0f} MiB resident" +
          (f", {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB GPU" if torch.cuda.is_available() else ""))


if __name__ == "__main__":
    main()
