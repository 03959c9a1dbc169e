"""Seconds per step of MEDS's clustering at the paper's scale, serial against parallel.

A step of the paper's setting shapes 512 prompts x 16 responses (14 logit-lens layers). This
script builds that batch from synthetic features (each prompt's responses drawn around a few
modes of its own, a random share of them wrong, as DAPO's dynamic sampling keeps mixed groups
only), fills every prompt's memory with `--memory` past wrong responses, and times MEDS's own
hooks, shape_rewards (the clustering) and on_step_end (memory update; the knn mode's refits),
with `meds.cluster_workers` 1 (serial) and N (worker processes). The first parallel step, which
starts the worker pool, is timed apart. It checks that both give the same cluster sizes.

    python scripts/bench_meds_clustering.py                      # 512 x 16, memory 64, 2 workers
    python scripts/bench_meds_clustering.py --memory 256 --assign knn --workers 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def synthetic_step(rng, prompts: int, group: int, layers: int, modes: np.ndarray):
    """A Rollouts of `prompts` groups with features around each prompt's modes, and verdicts."""
    from algorithms.meds import FEATURES
    from meds_cli.core.records import Problem, Verdict
    from meds_cli.engine.rollout.batch import Rollouts

    size = prompts * group
    which = rng.integers(0, modes.shape[1], size=size)
    centres = modes[np.repeat(np.arange(prompts), group), which]  # [B, L]
    features = centres + 0.05 * rng.standard_normal((size, layers))
    wrong_per_group = rng.integers(1, group, size=prompts)  # mixed groups only, as after dynamic sampling
    correct = np.concatenate([np.arange(group) >= w for w in wrong_per_group])
    rollouts = Rollouts(
        problems=[Problem(id=f"p{p}", question="q", answer="1") for p in range(prompts)], group_size=group,
        input_ids=torch.zeros(size, 2, dtype=torch.long), attention_mask=torch.ones(size, 2, dtype=torch.long),
        prompt_width=1, response_ids=torch.zeros(size, 1, dtype=torch.long), response_mask=torch.ones(size, 1),
        response_texts=["r"] * size, truncated=torch.zeros(size, dtype=torch.bool),
        verdicts=[Verdict(bool(c), "7", "wrong") for c in correct])
    rollouts.extras = {FEATURES: torch.from_numpy(features).float(), "meds_anchor": ["boxed"] * size}
    rollouts.reward_components = {"correctness": torch.from_numpy(correct.astype(np.float32))}
    rollouts.rewards = rollouts.reward_components["correctness"].clone()
    return rollouts


def fill_memory(algorithm, rng, prompts: int, entries: int, layers: int, modes: np.ndarray) -> None:
    from algorithms.meds_memory import Bank

    for p in range(prompts):
        points = modes[p, rng.integers(0, modes.shape[1], size=entries)] + 0.05 * rng.standard_normal((entries, layers))
        bank = Bank.empty(layers)
        labels = algorithm.settings.labels(points) if algorithm.config.assign == "knn" else None
        bank.extend(torch.from_numpy(points).float(), [None] * entries, [""] * entries, 0, labels, limit=0)
        algorithm.memory.put(f"p{p}", "wrong", bank)


def time_steps(workers: int, args) -> tuple[list[float], list[float], list[torch.Tensor]]:
    """Wall and CPU seconds (of this process) of shape_rewards + on_step_end per step, and the
    cluster sizes of every step."""
    from algorithms.meds import CLUSTER_SIZE
    from meds_cli.engine.config import load_config
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    cfg = load_config(overrides=["algo.name=meds", f"meds.cluster_workers={workers}", f"meds.assign={args.assign}",
                                 f"meds.memory_size={args.memory_size}", f"meds.target={args.target}"])
    algorithm = build_algorithm(cfg)
    rng = np.random.default_rng(args.seed)  # the same data for every worker count
    modes = rng.standard_normal((args.prompts, 3, args.layers)) + 3.0
    fill_memory(algorithm, rng, args.prompts, args.memory, args.layers, modes)
    seconds, cpu, sizes = [], [], []
    for step in range(1, args.steps + 1):
        rollouts = synthetic_step(rng, args.prompts, args.group, args.layers, modes)
        start, start_cpu = time.perf_counter(), time.process_time()
        algorithm.shape_rewards(rollouts)
        algorithm.on_step_end(rollouts, step)
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
        sizes.append(rollouts.extras[CLUSTER_SIZE].clone())
    return seconds, cpu, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--memory", type=int, default=64, help="past wrong responses per prompt at the start")
    parser.add_argument("--memory-size", type=int, default=256, help="meds.memory_size (the paper config's bound)")
    parser.add_argument("--assign", default="refit", choices=["refit", "knn"])
    parser.add_argument("--target", default="wrong", choices=["wrong", "both"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.prompts} prompts x {args.group} responses, {args.layers} layers, memory {args.memory} "
          f"(bound {args.memory_size}), assign {args.assign}, target {args.target}; "
          f"{os.cpu_count()} CPUs, load average {load:.2f} before the run")
    serial, serial_cpu, serial_sizes = time_steps(1, args)
    parallel, parallel_cpu, parallel_sizes = time_steps(args.workers, args)
    same = all(torch.equal(a, b) for a, b in zip(serial_sizes, parallel_sizes))
    # On a busy machine wall time depends on the other load; the serial CPU time is what one
    # idle core would take, and that divided by the workers is the ideal parallel time.
    print(f"serial:              {statistics.mean(serial):6.2f} s/step wall, {statistics.mean(serial_cpu):.2f} s CPU "
          f"(steps: {', '.join(f'{s:.2f}' for s in serial)})")
    print(f"parallel, {args.workers} workers: {statistics.mean(parallel[1:] or parallel):6.2f} s/step wall, "
          f"{statistics.mean(parallel_cpu[1:] or parallel_cpu):.2f} s CPU in this process "
          f"(first step, starting the pool: {parallel[0]:.2f} s; steps: {', '.join(f'{s:.2f}' for s in parallel)})")
    print(f"cluster sizes identical: {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
