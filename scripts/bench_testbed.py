"""Every figure the testbed's base must meet (docs/testbed.md), printed:

- the base's held-out figures, measured when it was built (base_figures.json in its cache folder):
  pass@1, pass@64 (the unbiased estimator), distinct wrong answers per group of 8;
- whether learning shows: a run of configs/testbed.yaml's defaults (DAPO, 16 prompts x 8
  responses) on one core (OMP_NUM_THREADS=1), training accuracy of steps 31-40 against steps 1-10
  (the normal `meds train` path, read back from its metrics.jsonl), and its median step time;
- one GRPO step of the same shape on one core: the median step time over a short run and where it
  goes (generate, scoring pass, update);
- MEDS's features mean something: the ARI of MEDS's clusters vs final answers over the memory of
  a short MEDS run (ablate_report.memory_ari, the figure `meds ablate` reports), and its step time.

    python scripts/bench_testbed.py [--steps 40] [--grpo-steps 10] [--meds-steps 10] [--keep DIR]

The base is built first when the cache has none (a few minutes). Each run is a subprocess of its
own, so the thread count is the one of the command line, as a grid task runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "testbed.yaml"


def train(folder: Path, steps: int, *options: str) -> list[dict]:
    """`meds train -c configs/testbed.yaml` for `steps` steps on one thread; its metrics rows."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "meds_cli", "train", "-c", str(CONFIG), "--steps", str(steps),
               "--output", str(folder), "--quiet", "--set", f"train.checkpoint_every={steps}", *options]
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def median(rows: list[dict], key: str, skip: int = 1) -> float:
    """The median of `key` over the rows after the first `skip` (imports and lazy set-up)."""
    return statistics.median(r[key] for r in rows[skip:] if key in r)


def mean(values: list[float]) -> float:
    return sum(values) / max(1, len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps of the defaults' run (the learning check)")
    parser.add_argument("--grpo-steps", type=int, default=10, help="GRPO steps (its step time)")
    parser.add_argument("--meds-steps", type=int, default=10, help="MEDS steps (the ARI of its memory)")
    parser.add_argument("--keep", default="", help="keep the three run folders under this folder")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from meds_cli.commands.ablate_report import memory_ari
    from meds_cli.engine.model_io.testbed_base import FIGURES_FILE, base_folder

    folder = base_folder()
    record = json.loads((folder / FIGURES_FILE).read_text())
    figures = record["figures"]
    k = figures["samples_per_problem"]
    print(f"base: {folder}")
    print(f"  built in {record['train_seconds']} s of training ({record['recipe']['steps']} steps, "
          f"{record['threads']} threads) + {record['measure_seconds']} s of measuring")
    print(f"  held-out, {figures['held_out_problems']} problems x {k} samples at temperature {figures['temperature']}:")
    print(f"  pass@1 {figures['pass@1']:.3f}   pass@{k} {figures[f'pass@{k}']:.3f}   "
          f"(gap {figures[f'pass@{k}'] - figures['pass@1']:+.3f})")
    print(f"  distinct wrong answers per group of 8: {figures['distinct_wrong_per_8']:.2f}")

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-testbed-"))
    rows = train(root / "defaults", args.steps)
    first, last = [r["accuracy"] for r in rows[:10]], [r["accuracy"] for r in rows[-10:]]
    print(f"the testbed defaults (configs/testbed.yaml's algorithm), {len(rows)} steps, OMP_NUM_THREADS=1:")
    print(f"  training accuracy: steps 1-10 {mean(first):.3f}, steps {len(rows) - 9}-{len(rows)} {mean(last):.3f} "
          f"(rise {mean(last) - mean(first):+.3f}; needs >= 0.05)")
    print(f"  median step {median(rows, 'time_step_s'):.2f} s (sampling rounds a step: "
          f"{mean([r['generation_rounds'] for r in rows]):.2f} on average)")
    print(f"  distinct wrong answers per group: first step {rows[0]['distinct_wrong_answers_per_group']:.2f}, "
          f"last {rows[-1]['distinct_wrong_answers_per_group']:.2f}")

    grpo_rows = train(root / "grpo", args.grpo_steps, "--algo", "grpo")
    print(f"GRPO, {len(grpo_rows)} steps of 16 prompts x 8 responses, OMP_NUM_THREADS=1:")
    print(f"  median step {median(grpo_rows, 'time_step_s'):.2f} s  "
          f"(generate {median(grpo_rows, 'time_generate_s'):.2f}, "
          f"scoring pass {median(grpo_rows, 'time_score_s'):.2f}, "
          f"update {median(grpo_rows, 'time_train_s'):.2f}; "
          f"mean response {median(grpo_rows, 'response_length_mean'):.1f} tokens)")

    meds_rows = train(root / "meds", args.meds_steps, "--algo", "meds", "--base", "grpo")
    ari = memory_ari(root / "meds")
    print(f"MEDS on GRPO, {len(meds_rows)} steps: median step {median(meds_rows, 'time_step_s'):.2f} s; "
          f"ARI of its clusters vs final answers {ari:.3f} (chance: 0)")
    print(f"runs: {root}" if args.keep else "")


if __name__ == "__main__":
    main()
