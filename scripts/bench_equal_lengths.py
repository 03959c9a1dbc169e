"""Update and scoring-pass seconds at equal response lengths (bench_vs_trl.py's shapes), padded
against packed, side by side in one process (`train.padding_free`, docs/long-tailed-batches.md).

At equal lengths packing removes no padding; what differs is how a group's prompt is shared:
  padded shared:  the prompt runs once and its keys and values are copied to the group's rows
                  (train.share_prompts, padded)
  packed shared:  one copy of the prompt per run of responses under a prefix-sharing mask, runs
                  as long as pay for their copy (engine/training/packing.py, shared_response_tokens)
  packed whole:   one copy for the whole group (the layout before the runs: its dense mask costs
                  (P + G R)^2 attention pairs where the responses need G R (P + R))
Responses are random tokens after real task prompts, forced to the shape's length; the settings
alternate within each repeat (the first repeat warms up and is not counted).

    python scripts/bench_equal_lengths.py [--shape 2x4x128] [--repeats 4] [--config configs/meds_smollm2.yaml]
"""

import argparse
import copy
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_lengths  # noqa: E402  (this folder's sibling: forced_batch, score)

from meds_cli.core.cpu_budget import configure_torch_threads  # noqa: E402
from meds_cli.engine.config import load_config  # noqa: E402
from meds_cli.engine.trainer import Trainer  # noqa: E402
from meds_cli.engine.training import packing as packing_module  # noqa: E402
from meds_cli.engine.training.packing import PADDED, Packing  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2x4x128", help="prompts x responses x tokens")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=8, help="train.micro_batch_size (bench_vs_trl's 8)")
    parser.add_argument("--config", default="configs/meds_smollm2.yaml")
    args = parser.parse_args()
    prompts, group, length = (int(x) for x in args.shape.lower().split("x"))
    configure_torch_threads()
    bench_lengths.GROUP = group
    cfg = load_config([args.config], ["train.checkpoint_every=0", "algo.name=grpo", "train.ppo_epochs=1",
                                      "train.mini_batch_size=0", f"rollout.max_new_tokens={length}",
                                      f"rollout.prompts_per_step={prompts}", f"rollout.group_size={group}",
                                      f"train.micro_batch_size={args.micro_batch}", "model.lora.rank=16"])
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-equal-")))
    batch = bench_lengths.forced_batch(trainer, [length] * (prompts * group))
    padded = dataclasses.replace(trainer.update_settings, micro_batch_tokens=0, packing=PADDED, share_prompts=True)
    packed = dataclasses.replace(padded, packing=Packing.for_model(trainer.unwrapped, "true"))
    runs = {"padded shared": padded, "packed shared": packed, "packed whole": packed}
    split = packing_module.split_shared_unit
    print(f"shape {args.shape}, prompt width {batch.prompt_width}, micro_batch_size {args.micro_batch}, "
          f"{torch.get_num_threads()} threads, pairs per token {packed.packing.pairs_per_token:.0f}", flush=True)
    times = {(which, name): [] for which in ("update", "scoring") for name in runs}
    for repeat in range(args.repeats + 1):
        for name, settings in runs.items():
            trainer.update_settings = settings
            packing_module.split_shared_unit = (lambda rows, *rest: [rows]) if name == "packed whole" else split
            for which in ("update", "scoring"):
                rows = copy.copy(batch)  # the update fills old log-probs in the batch it is given
                t0 = time.perf_counter()
                trainer.update(rows) if which == "update" else bench_lengths.score(trainer, rows, settings)
                if repeat:
                    times[which, name].append(time.perf_counter() - t0)
    packing_module.split_shared_unit = split
    for which in ("update", "scoring"):
        reference = statistics.median(times[which, "padded shared"])
        for name in runs:
            seconds = statistics.median(times[which, name])
            print(f"{which:8} {name:14} {seconds:7.2f} s  {seconds / reference:5.2f}x  "
                  f"(each: {', '.join(f'{t:.2f}' for t in times[which, name])})")


if __name__ == "__main__":
    main()
