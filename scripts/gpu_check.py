"""GPU check: three DAPO+MEDS training steps of the Qwen2.5-Math-1.5B architecture at the
paper's response length, to see time and memory on a GPU before a real run.

    bash scripts/gpu_check.sh                   # one GPU, no network; a few minutes
    python scripts/gpu_check.py --tiny          # the same path on CPU with a 2-layer model
    python scripts/gpu_check.py --tokenizer DIR # a saved tokenizer folder instead of the embedded GGUF's

The model is built from configs/gpu_check/qwen2.5-math-1.5b/config.json with random weights
(throughput and memory do not depend on the values) in fp32 master weights under bf16 autocast,
with gradient checkpointing and full fine-tuning as in the paper. Prompts come from the embedded
SmolLM2 tokenizer on the synthetic arithmetic task, so nothing is downloaded. Every response is
forced to the full length (rollout.min_new_tokens holds the stop ids back until then), and dynamic
sampling is off: a random model answers nothing correctly, so every group would otherwise be
dropped and nothing trained.
Prints seconds per step split into generate / score / train, tokens per second, and peak memory.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARCHITECTURE = ROOT / "configs" / "gpu_check" / "qwen2.5-math-1.5b"
TINY_SHAPE = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 49152}  # the SmolLM2 tokenizer's ids fit


def settings(tiny: bool, steps: int) -> dict:
    if tiny:
        return {"prompts": 2, "group": 4, "tokens": 8, "micro": 4, "steps": steps, "precision": "no"}
    return {"prompts": 8, "group": 8, "tokens": 1024, "micro": 8, "steps": steps, "precision": "bf16"}


def build_model(tiny: bool, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(ARCHITECTURE)
    if tiny:
        for key, value in TINY_SHAPE.items():
            setattr(config, key, value)
        if getattr(config, "layer_types", None):  # one per layer: saving checks the count
            config.layer_types = config.layer_types[:config.num_hidden_layers]
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def overrides(s: dict) -> list[str]:
    return ["algo.name=meds", "algo.base=dapo", "dapo.dynamic_sampling=false", "task.name=arithmetic",
            "model.lora.enabled=false", "optim.lr=1e-6", "optim.warmup_steps=0", "meds.layers=last_half",
            f"rollout.prompts_per_step={s['prompts']}", f"rollout.group_size={s['group']}",
            f"rollout.max_new_tokens={s['tokens']}", f"rollout.min_new_tokens={s['tokens']}",
            f"rollout.hf.generation_batch_size={s['prompts'] * s['group']}",
            f"train.micro_batch_size={s['micro']}", f"train.steps={s['steps']}", "train.checkpoint_every=0",
            "train.gradient_checkpointing=true", f"train.mixed_precision={s['precision']}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true",
                        help="a 2-layer model on CPU, 8 tokens: checks the script itself")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tokenizer", default="",
                        help="a tokenizer folder (the GPU kit's, extracted from the embedded GGUF); default: the "
                             "embedded model's own")
    args = parser.parse_args(argv)
    from meds_cli.engine.config import load_config
    from meds_cli.engine.model_io.model import EMBEDDED, load_tokenizer, resolve_model
    from meds_cli.engine.trainer import Trainer

    device = "cpu" if args.tiny else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no GPU visible (use --tiny to check the script on CPU)", file=sys.stderr)
        return 2
    s = settings(args.tiny, args.steps)
    started = time.perf_counter()
    tokenizer = load_tokenizer(args.tokenizer or resolve_model(EMBEDDED))
    model = build_model(args.tiny, device)
    cfg = load_config(overrides=overrides(s))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="gpu-check-")), model_and_tokenizer=(model, tokenizer))
    setup_s = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    print(f"{'tiny ' if args.tiny else ''}Qwen2.5-Math-1.5B architecture, {params / 1e9:.2f}B parameters (random), "
          f"{device}, autocast {trainer.acc.mixed_precision}, gradient checkpointing, full fine-tuning; "
          f"{s['prompts']} prompts x {s['group']} responses x {s['tokens']} tokens; setup {setup_s:.1f} s")
    print(f"{'step':>4} {'generate s':>11} {'score s':>8} {'train s':>8} {'total s':>8} {'gen tok/s':>10} "
          f"{'train tok/s':>12} {'resp len':>9}")
    rows = []
    for _ in range(s["steps"]):
        row = trainer.train_step()
        rows.append(row)
        sequences = s["prompts"] * s["group"]
        trained_tokens = sequences * (row["response_length_mean"] + 40)  # responses plus about 40 prompt tokens
        print(f"{row['step']:>4} {row['time_generate_s']:>11.2f} {row['time_score_s']:>8.2f} "
              f"{row['time_train_s']:>8.2f} {row['time_step_s']:>8.2f} {row['tokens_per_s']:>10.1f} "
              f"{trained_tokens / row['time_train_s']:>12.1f} {row['response_length_mean']:>9.1f}")
    if device == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated, "
              f"{torch.cuda.max_memory_reserved() / 2**30:.1f} GiB reserved")
    else:
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"peak resident memory of the process: {peak_gib:.2f} GiB")
    if any(row["response_length_mean"] != s["tokens"] for row in rows):
        print(f"warning: responses were not all {s['tokens']} tokens long", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
