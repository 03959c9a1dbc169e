"""What the diversity diagnostics (engine/training/diversity.py) cost per step, for an algorithm
that records no logit-lens values of its own (GRPO):

1. the metrics themselves (answer classes, y* anchors, per-group eigen ratios), timed inside a
   GRPO run's steps, against the step's time;
2. the probe: this process's CPU time sampling one batch with and without the diversity probe's
   logit-lens values recorded in the decode loop (the same seeds, so the same responses; best of
   --repeats, interleaved so that load hits both alike: scripts/bench_meds.py sampling_ab);
3. the formulas alone at a larger batch (--prompts x --group responses, --layers features):
   answer classes and eigen ratios, no model.

    python scripts/bench_diversity.py --tiny --steps 5        # the in-memory tiny model (seconds)
    python scripts/bench_diversity.py --steps 3               # embedded SmolLM2-135M (minutes on CPU)
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("MEDS_CPU_FAST_PATHS", "default")


def timed(method, spent: list[tuple[float, float]]):
    """`method` wrapped so that each call appends its (wall, CPU) seconds to `spent`."""
    def wrapper(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return method(*args, **kwargs)
        finally:
            spent.append((time.perf_counter() - t0, time.process_time() - c0))

    return wrapper


def formulas_alone(prompts: int, group: int, layers: int, repeats: int) -> tuple[float, float]:
    """Best-of-`repeats` seconds of the answer classes and of the mean group eigen ratio on random
    answers and features of prompts x group responses."""
    import numpy as np

    from algorithms.answer_groups import answer_classes
    from algorithms.diversity import distinct_wrong_answers, mean_group_eigen_ratio, one_repeated_error
    from meds_cli.core.rollouts import group_slices

    rng = np.random.default_rng(0)
    answers = [[str(v) for v in rng.integers(0, 6, group)] for _ in range(prompts)]
    correct = [[v == "0" for v in g] for g in answers]
    features = rng.normal(size=(prompts * group, layers)).astype(np.float32)
    groups = group_slices(prompts * group, group)
    answer_time, eigen_time = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        labels = answer_classes(answers, "key")
        [distinct_wrong_answers(lab, ok) for lab, ok in zip(labels, correct)]
        [one_repeated_error(lab, ok) for lab, ok in zip(labels, correct)]
        answer_time.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mean_group_eigen_ratio(features, groups)
        eigen_time.append(time.perf_counter() - t0)
    return min(answer_time), min(eigen_time)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="use the in-memory tiny model on the copy task")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="responses per prompt")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip", type=int, default=1, help="first steps left out of the means")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of the sampling A/B (0: skip)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra section.key=value")
    args = parser.parse_args()

    import torch
    from bench_meds import sampling_ab

    torch.set_num_threads(args.threads)
    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    if args.tiny:
        base = ["model.name=tiny-llama", "task.name=copy", "model.lora.rank=8"]
    else:
        base = [f"model.name={args.model}", "task.name=arithmetic", "task.prompt_style=chat"]
    overrides = [*base, "algo.name=grpo", f"rollout.prompts_per_step={args.prompts}",
                 f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.new_tokens}",
                 "train.micro_batch_size=32", "optim.warmup_steps=0", f"train.steps={args.steps}",
                 "train.checkpoint_every=0", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(load_config(overrides=overrides), Path(tmp) / "grpo")
        probe = trainer.diversity.probe
        spent: list[tuple[float, float]] = []
        trainer.diversity.step_metrics = timed(trainer.diversity.step_metrics, spent)
        rows = []
        for step in range(args.steps):
            c0 = time.process_time()
            row = trainer.train_step()
            row["cpu_step_s"] = time.process_time() - c0
            rows.append(row)
            print(f"step {step + 1}: wall {row['time_step_s']:.3f} s, cpu {row['cpu_step_s']:.3f} s "
                  f"(generate {row['time_generate_s']:.3f}); diversity metrics {spent[-1][0] * 1000:.1f} ms wall, "
                  f"{spent[-1][1] * 1000:.1f} ms cpu; eigen ratio {row.get('diversity/eigen_ratio_top1')}",
                  flush=True)
        kept = slice(args.skip, None)
        step_cpu = statistics.mean(r["cpu_step_s"] for r in rows[kept])
        metrics_cpu = statistics.mean(c for _, c in spent[kept])
        metrics_wall = statistics.mean(w for w, _ in spent[kept])
        name = "tiny-llama" if args.tiny else args.model
        print(f"\n{name}, GRPO, {args.prompts} x {args.group} responses, up to {args.new_tokens} new tokens, "
              f"probe layers {list(probe.layers) if probe else None}; means over steps {args.skip + 1}..{args.steps}:")
        print(f"diversity metrics per step: {metrics_wall * 1000:.1f} ms wall, {metrics_cpu * 1000:.1f} ms CPU "
              f"= {metrics_cpu / step_cpu:.2%} of the step's CPU time ({step_cpu:.3f} s)")
        if args.repeats and trainer.lens_probe is not None:
            plain, probed = sampling_ab(trainer, args.repeats, time.process_time)
            print(f"sampling one batch, CPU time, best of {args.repeats} (interleaved): without the probe "
                  f"{plain:.3f} s, recording it {probed:.3f} s ({probed / plain - 1:+.1%})")
    answers, eigen = formulas_alone(64, 8, 14, 5)
    print(f"formulas alone, 64 x 8 responses, 14 layers (best of 5): answer classes and counts "
          f"{answers * 1000:.2f} ms, eigen ratios {eigen * 1000:.2f} ms")


if __name__ == "__main__":
    main()
