"""What the testbed study (configs/testbed/study.yaml, or any grid) costs, from a few steps of each
arm and one eval at a reduced size, printed:

- per arm (seed 0 of the grid, `--steps` steps, one thread as each of `--jobs` grid tasks runs): CPU
  seconds per training step (the child's user + system time, less a process's start-up and model
  loading, measured as an eval of one problem once), and the median wall time of a step from its
  metrics.jsonl;
- one held-out eval of the base model at the grid's k (`--k`, 64) on `--eval-limit` problems, its
  CPU seconds, extrapolated linearly to the task's held-out split (task.eval_size);
- the grid's total: every task's start-up + steps x CPU per step + eval, over `--jobs` cores.

CPU time, not wall time: on a machine that others share, a step's wall time measures the load,
not the step; CPU time is close to what a quiet core takes (not equal: a shared core's caches
are shared too, so it is an upper bound of a quiet machine's).

    python scripts/estimate_study.py [--grid configs/testbed/study.yaml] [--steps 10] [--eval-limit 50]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child_cpu(command: list[str]) -> float:
    """Run `command` on one thread; the CPU seconds (user + system) it and its children took."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    from meds_cli.commands.ablate import make_plan, variant_sets
    from meds_cli.commands.ablate_grid import trains
    from meds_cli.engine.config import load_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default=str(REPO / "configs" / "testbed" / "study.yaml"))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-limit", type=int, default=50)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()

    plan = make_plan(config_files=[], sets=[], grid_file=args.grid, features=None, clusterer=None, layers=None,
                     seeds=None, steps=None, baseline=True, output=None)
    seeds = len({v.seed for v in plan.variants})
    first = {}
    for variant in plan.variants:
        first.setdefault(variant.group, variant)
    meds = [sys.executable, "-m", "meds_cli"]
    with tempfile.TemporaryDirectory() as tmp:
        def train_command(variant, steps: int, name: str) -> list[str]:
            sets = plan.base_sets + variant_sets(variant) + [f"train.steps={steps}", "train.checkpoint_every=0"]
            return [*meds, "train", *sum((["-c", c] for c in plan.config_files), []),
                    *sum((["--set", s] for s in sets), []), "--output", str(Path(tmp) / name), "--quiet"]

        cpus = {group: child_cpu(train_command(variant, args.steps, group)) for group, variant in first.items()
                if trains(variant.overrides)}
        trained_run = Path(tmp) / next(iter(cpus))
        # start-up and model loading: a process that loads the model and answers one problem once
        start_cpu = child_cpu([*meds, "eval", str(trained_run), "--benchmarks", "heldout", "--k", "1", "--limit", "1",
                               "--output", str(Path(tmp) / "start")])
        print(f"start-up and model loading: {start_cpu:.1f} CPU s (an eval of one problem once)")
        per_step = {}
        for group, cpu in cpus.items():
            rows = [json.loads(line) for line in (Path(tmp) / group / "metrics.jsonl").read_text().splitlines()]
            per_step[group] = max(cpu - start_cpu, 0.0) / args.steps
            wall = statistics.median(r["time_step_s"] for r in rows)
            rounds = statistics.mean(r.get("generation_rounds", 1) for r in rows)
            print(f"{group:12s} {per_step[group]:6.2f} CPU s/step  (median wall {wall:.2f} s/step, "
                  f"{rounds:.1f} generation rounds a step, {args.steps} steps)")
        eval_cpu = child_cpu([*meds, "eval", str(trained_run), "--benchmarks", "heldout", "--k", str(args.k),
                              "--limit", str(args.eval_limit), "--temperature", str(args.temperature),
                              "--output", str(Path(tmp) / "eval")])
        size = load_config(plan.config_files, plan.base_sets).task.eval_size
        full_eval = start_cpu + max(eval_cpu - start_cpu, 0.0) * size / args.eval_limit
        print(f"eval: {eval_cpu:.1f} CPU s for {args.eval_limit} problems x {args.k}; {size} problems: "
              f"{full_eval:.0f} CPU s")
    total = 0.0
    for group, variant in first.items():
        steps = plan.steps if trains(variant.overrides) else 0
        total += seeds * (start_cpu + steps * per_step.get(group, 0.0) + full_eval)
    print(f"grid: {len(plan.variants)} tasks ({len(first)} arms x {seeds} seeds), {plan.steps} steps: "
          f"{total / 60:.0f} CPU min; on {args.jobs} cores: {total / args.jobs / 60:.0f} min")


if __name__ == "__main__":
    main()
