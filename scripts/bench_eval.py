"""The eval harness's own cost: how much of an eval's wall time is NOT generation.

Runs the harness (benchmarks.harness.evaluate with the HF backend) on the embedded model and
splits the wall time into generation and everything else: loading the benchmark, building
prompts, grading (overlapped with generation in a background thread; only the part that is not
hidden counts), writing samples.jsonl, scoring. Goal: harness share below 5%. Model loading is
reported apart (it is the same for any harness).

Then grading throughput: the benchmark's grade function on the eval's own responses, and on a
larger synthetic workload (each gold answer boxed in a sentence, half of them replaced by
another problem's answer), graded synchronously.

Usage: python scripts/bench_eval.py [--benchmark math500] [--data-dir DIR (holds <benchmark>/test.jsonl)]
       [--limit 4] [--n 2] [--max-new-tokens 128] [--model smollm2-135m] [--threads N]
"""

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.generation import GenerationSettings  # noqa: E402
from benchmarks.harness import EvalSettings, evaluate, load_benchmarks  # noqa: E402
from meds_cli.engine.rollout.engines import make_backend  # noqa: E402
from meds_cli.engine.rollout.eval_backends import ModelSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def grading_rate(benchmark, pairs) -> tuple[float, int]:
    start = time.perf_counter()
    benchmark.grade(pairs)
    return len(pairs) / (time.perf_counter() - start), len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmark", default="math500")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt", default="chat")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--synthetic", type=int, default=500, help="responses in the synthetic grading workload")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = EvalSettings([args.benchmark], k=args.n, limit=args.limit, data_dir=str(args.data_dir),
                            prompt=args.prompt, temperature=0.6, top_p=0.95, max_new_tokens=args.max_new_tokens,
                            seed=0, backend="hf", model=args.model)
    t0 = time.perf_counter()
    backend = make_backend("hf", ModelSpec(args.model), GenerationSettings(0.6, 0.95, args.max_new_tokens, 64))
    load_model_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as folder:
        outcome = evaluate(backend, settings, Path(folder))
        samples = [line for line in (Path(folder) / "samples.jsonl").read_text().splitlines()]
    t = outcome.timing
    overhead = t["total_s"] - t["generate_s"]
    print(f"model {args.model}, {args.benchmark} --limit {args.limit} --n {args.n} --max-new-tokens "
          f"{args.max_new_tokens}, torch threads {torch.get_num_threads()}")
    print(f"  model load (apart):      {load_model_s:8.2f} s")
    print(f"  eval wall time:          {t['total_s']:8.2f} s   ({len(samples)} samples)")
    print(f"  generation:              {t['generate_s']:8.2f} s")
    print(f"  harness (all the rest):  {overhead:8.3f} s   = {100 * overhead / t['total_s']:.2f}% of the eval")
    print(f"    loading data:          {t['load_s']:8.3f} s")
    print(f"    waiting for grading:   {t['wait_for_grading_s']:8.3f} s   (grading not hidden by generation)")
    print(f"    grading (background):  {t['grade_s']:8.3f} s   writing samples: {t['write_s']:.3f} s")

    import json

    rows = [json.loads(s) for s in samples]
    [(benchmark, problems)] = load_benchmarks([args.benchmark], args.data_dir, None)
    by_id = {p.id: p for p in problems}
    rate, count = grading_rate(benchmark, [(by_id[r["problem_id"]], r["response"]) for r in rows])
    print(f"  grading, eval responses: {rate:8.1f} responses/s ({count})")
    rng = random.Random(0)
    chosen = [rng.choice(problems) for _ in range(args.synthetic)]
    pairs = [(p, f"So the answer is \\boxed{{{p.answer if rng.random() < 0.5 else rng.choice(problems).answer}}}.")
             for p in chosen]
    rate, count = grading_rate(benchmark, pairs)
    print(f"  grading, synthetic:      {rate:8.1f} responses/s ({count}: half right, half another problem's answer)")


if __name__ == "__main__":
    main()
