"""Seconds of one update with and without shared prompt forwards (`train.share_prompts`), side by side.

One trainer samples one batch on the config (the demo by default), then updates on copies of it,
alternating the setting, so that load on a shared machine hits both alike. The update's work is
otherwise the same (same rows, micro-batches, loss); with sharing each distinct prompt of a
micro-batch runs once and its keys and values are copied to the rows of its group.

    python scripts/bench_shared_prompts.py [--repeats 3] [--config configs/meds_smollm2.yaml] [--set key=value ...]
"""

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from meds_cli.core.cpu_budget import configure_torch_threads
from meds_cli.engine.config import load_config
from meds_cli.engine.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", default="configs/meds_smollm2.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    configure_torch_threads()
    # One sampling round with every group kept: the update sees the config's whole batch.
    cfg = load_config([args.config], ["train.checkpoint_every=0", "dapo.dynamic_sampling=false", *args.overrides])
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-shared-")))
    torch.manual_seed(0)
    batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
    if batch is None:
        raise SystemExit("no group of the sampled batch can train; try another --set train.seed=N")
    prompt_tokens = int(batch.attention_mask[:, :batch.prompt_width].sum())
    print(f"model {cfg.model.name}, {batch.size} sequences ({batch.num_groups} prompts x {batch.group_size}), "
          f"micro-batch {cfg.train.micro_batch_size}, {prompt_tokens} prompt and {int(batch.response_mask.sum())} "
          f"response tokens, {torch.get_num_threads()} threads")
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for share in (False, True):
            trainer.share_prompts = share
            rows = copy.copy(batch)  # the update fills old log-probs in the batch it is given
            t0 = time.perf_counter()
            trainer.update(rows)
            times[share].append(time.perf_counter() - t0)
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    print(f"update, median of {args.repeats} (interleaved): whole rows {plain:.2f} s, prompts shared {shared:.2f} s, "
          f"ratio {shared / plain:.3f}")


if __name__ == "__main__":
    main()
