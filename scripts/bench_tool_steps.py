"""Seconds per training step with and without tools: the same small run of the embedded SmolLM2
(configs/smollm2.yaml), with rollout.tools [] and with [python], one after the other in one
sitting, so that the columns share the machine's load.

Usage: OMP_NUM_THREADS=1 python scripts/bench_tool_steps.py [--steps 3] [--engine hf] [--algo grpo]

The model seldom writes a ```python block, so the tool run uses the tag pair '=' / '.' that it
writes all the time on the arithmetic task (as tests/test_tool_engines.py's slow runs do): "3 + 4 = 7."
runs " 7" as Python. The blocks are trivial; what is measured is the path: sampling turn by turn
with stop strings, the sandbox, observations, the scoring pass over longer responses. Both runs
sample from the same seeds; their responses part at the first pause. A third column runs tools
[python] with the default tags, which this model does not write: the stop strings are watched but
responses seldom pause, so it shows what watching costs apart from sampling turn by turn.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meds_cli.engine.config import load_config  # noqa: E402
from meds_cli.engine.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FORCED = ["rollout.tools=[python]", "rollout.code_tags=['=', '.']", "rollout.max_tool_calls=2",
          "rollout.tool_time_limit_s=5"]
RUNS = {"tools []": ["rollout.tools=[]"], "tools [python]": FORCED,
        "[python], tags unused": ["rollout.tools=[python]", "rollout.tool_time_limit_s=5"]}
COLUMNS = ("time_step_s", "time_generate_s", "time_score_s", "time_train_s", "engine_calls", "engine_requests",
           "response_length_mean",
           "tools/calls_mean", "tools/observation_tokens_mean", "tools/seconds")


def run(steps: int, engine: str, algo: str, overrides: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        cfg = load_config([str(ROOT / "configs" / "smollm2.yaml")], [
            f"train.steps={steps}", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=48", f"algo.name={algo}", f"rollout.engine={engine}",
            "train.checkpoint_every=100", *overrides])
        trainer = Trainer(cfg, Path(folder))
        calls, generate = [], trainer.engine.generate

        def counted(requests, settings):  # one per turn round (two where responses passed the call limit)
            calls.append(len(requests))
            return generate(requests, settings)

        trainer.engine.generate = counted
        rows = []

        def step_done(row):
            row["engine_calls"], row["engine_requests"] = len(calls), sum(calls)
            calls.clear()
            rows.append(row)

        trainer.train(on_step=step_done)
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--algo", default="grpo")
    args = parser.parse_args()
    results = {label: run(args.steps, args.engine, args.algo, overrides) for label, overrides in RUNS.items()}
    print(f"SmolLM2-135M, {args.algo}, engine {args.engine}, 2 prompts x 4 responses x 48 tokens, "
          f"{args.steps} steps each")
    print(f"{'mean of the steps':32}" + "".join(f"{label:>24}" for label in results))
    for column in COLUMNS:
        cells = []
        for rows in results.values():
            values = [row[column] for row in rows if column in row]
            cells.append(f"{statistics.mean(values):24.3f}" if values else f"{'-':>24}")
        print(f"{column:32}" + "".join(cells))
    for label, rows in results.items():
        print(f"{label}: time_step_s per step " + ", ".join(f"{row['time_step_s']:.2f}" for row in rows))


if __name__ == "__main__":
    main()
