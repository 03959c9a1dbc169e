"""Peak activation memory of the update on a long-tailed batch with one response at the limit
(4,096 tokens by default), padded against packed (`train.padding_free`), each in a fresh process.

The batch is scripts/bench_lengths.py's (seeded long-tailed response lengths, one row in eight at
the limit, random tokens after real task prompts), so every setting does the same work:
  fixed, padded:  micro_batch_size rows per micro-batch, each padded to the batch's longest row
  fixed, packed:  the same micro-batches, their rows laid end to end (no padding)
  tokens, padded: micro_batch_tokens (default: the longest row's tokens, the least that runs it)
  tokens, packed: the same budget, counted in real tokens

The model is the embedded SmolLM2-135M cut to its first --layers decoder layers (LoRA as
configured): activations grow with the layers and the tokens alike, so the ratio padded / packed
is the whole model's, and a full 30-layer update of 8 x 4,152 padded tokens would not fit a small
CPU machine. Memory is measured as scripts/bench_logprob_memory.py does (glibc serving large
allocations by mmap, the kernel's high-water mark reset after setup and a warm-up update; the
peak is VmHWM minus the resident set then).

    python scripts/bench_update_memory.py [--rows 8] [--max-len 4096] [--layers 2] [--micro-batch-size 2]
                                          [--budget 0] [--settings fixed-padded,fixed-packed,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench_logprob_memory import reset_peak, status_kib

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ("fixed-padded", "fixed-packed", "tokens-padded", "tokens-packed")


def measure(setting: str, args) -> dict:
    """Peak added memory (MiB) and seconds of one update under `setting`; runs in this process."""
    import copy
    import dataclasses
    import gc
    import tempfile
    import time

    import torch
    from bench_lengths import forced_batch, long_tailed_lengths

    from meds_cli.core.cpu_budget import configure_torch_threads
    from meds_cli.engine.config import load_config
    from meds_cli.engine.model_io.model import load_model_and_tokenizer
    from meds_cli.engine.trainer import Trainer
    from meds_cli.engine.training.packing import PADDED, Packing
    from meds_cli.engine.training.update import plan_update_micro_batches

    configure_torch_threads()
    cfg = load_config([args.config], ["train.checkpoint_every=0", "algo.name=grpo", "train.ppo_epochs=1",
                                      "train.mini_batch_size=0", f"rollout.max_new_tokens={args.max_len}",
                                      f"rollout.prompts_per_step={args.rows // 8}", "rollout.group_size=8",
                                      f"train.micro_batch_size={args.micro_batch_size}"])
    model, tokenizer = load_model_and_tokenizer(cfg.model.name, cfg.model.dtype)
    model.model.layers = model.model.layers[:args.layers]
    model.config.num_hidden_layers = args.layers
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, args.max_len + 256)
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-update-memory-")),
                      model_and_tokenizer=(model, tokenizer))
    lengths = long_tailed_lengths(args.rows, args.max_len)
    batch = forced_batch(trainer, lengths)
    prompts, responses = batch.attention_mask[:, :batch.prompt_width].sum(1), batch.response_mask.sum(1)
    budget = args.budget or int((prompts + responses).max())
    layout, by = setting.split("-")[1], setting.split("-")[0]
    packing = Packing.for_model(trainer.unwrapped, "true") if layout == "packed" else PADDED
    share = trainer.cfg.train.share_prompts and (packing.masked or not packing.on)
    settings = dataclasses.replace(trainer.update_settings, packing=packing, share_prompts=share,
                                   micro_batch_tokens=budget if by == "tokens" else 0)
    trainer.update_settings = settings
    planned = plan_update_micro_batches(batch, list(range(batch.size)), settings, trainer.acc)
    trainer.update(forced_batch(trainer, [4] * args.rows))  # warm-up: code paths, optimizer state
    gc.collect()
    exact = reset_peak()
    baseline = status_kib("VmRSS")
    start = time.perf_counter()
    trainer.update(copy.copy(batch))
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    return {"setting": setting, "peak_mib": (peak - baseline) / 1024, "seconds": seconds, "exact": exact,
            "micro_batches": len(planned), "budget": budget if by == "tokens" else 0,
            "real_tokens": int(prompts.sum() + responses.sum()), "lengths": sorted(lengths),
            "prompt_width": batch.prompt_width, "threads": torch.get_num_threads()}


def run_child(setting: str, args) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", setting, "--rows", str(args.rows),
           "--max-len", str(args.max_len), "--layers", str(args.layers), "--micro-batch-size",
           str(args.micro_batch_size), "--budget", str(args.budget), "--config", args.config]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{setting} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="rows of the batch (a multiple of 8)")
    parser.add_argument("--max-len", type=int, default=4096, help="the response limit (one row in eight at it)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the model kept")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--budget", type=int, default=0, help="micro_batch_tokens (0: the longest row's tokens)")
    parser.add_argument("--config", default="configs/meds_smollm2.yaml")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args)))
        return
    results = []
    for setting in args.settings.split(","):
        results.append(run_child(setting, args))
        r = results[-1]
        print(f"  {setting:<14} peak {r['peak_mib']:8.0f} MiB  {r['seconds']:7.1f} s  "
              f"{r['micro_batches']} micro-batches{'' if r['exact'] else '  (peak not reset)'}", flush=True)
    first = results[0]
    print(f"{args.rows} rows, response lengths {first['lengths']}, prompt width {first['prompt_width']}, "
          f"{first['real_tokens']} real tokens, {args.layers} layers, micro_batch_size {args.micro_batch_size}, "
          f"budget {max(r['budget'] for r in results)}, {first['threads']} threads")
    by_name = {r["setting"]: r for r in results}
    for by in ("fixed", "tokens"):
        if f"{by}-padded" in by_name and f"{by}-packed" in by_name:
            padded, packed = by_name[f"{by}-padded"], by_name[f"{by}-packed"]
            print(f"{by}: padded / packed peak {padded['peak_mib'] / max(packed['peak_mib'], 1e-9):.2f}x, "
                  f"time {padded['seconds'] / packed['seconds']:.2f}x")


if __name__ == "__main__":
    main()
