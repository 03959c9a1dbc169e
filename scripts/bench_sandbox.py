"""How fast the sandbox is: programs per second through the pool, and its fixed cost.

Usage: python scripts/bench_sandbox.py [--data-dir DIR (holds <benchmark>/test.jsonl)] [--workers N] [--limit N]

1. Fixed cost per program: a trivial program through `run_program`, against a bare
   `subprocess.run([python, "-c", "pass"])` (median of repeated runs, one at a time).
2. Throughput: the HumanEval+ canonical solutions graded on all their base + plus tests
   (one sandboxed program per problem) through the pool; the expected outputs are computed
   first (that run is timed too, it is the same work).
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import code_benchmarks, code_loaders  # noqa: E402
from benchmarks.sandbox import Job, isolation_mode, run_many, run_program  # noqa: E402


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fixed_cost(repeats: int) -> None:
    bare = median_seconds(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeats)
    sandboxed = median_seconds(lambda: run_program("pass"), repeats)
    print(f"bare subprocess.run(python -c pass): {bare * 1000:7.1f} ms")
    print(f"sandbox run_program('pass'):         {sandboxed * 1000:7.1f} ms  (+{(sandboxed - bare) * 1000:.1f} ms)")


def trivial_throughput(workers: int, count: int) -> None:
    start = time.perf_counter()
    run_many([Job("pass")] * count, workers=workers)
    elapsed = time.perf_counter() - start
    print(f"trivial programs through the pool:   {count / elapsed:7.1f} programs/s ({workers} workers)")


def humanevalplus_throughput(data_dir: Path, limit: int | None) -> None:
    problems = code_loaders.load_humanevalplus(data_dir, limit)
    tests = sum(p.answer["n_base"] + p.answer["n_plus"] for p in problems)
    start = time.perf_counter()
    code_benchmarks.ensure_expected(problems)
    expected_s = time.perf_counter() - start
    pairs = [(p, "```python\n" + p.answer["canonical_solution"] + "\n```") for p in problems]
    start = time.perf_counter()
    verdicts = code_benchmarks.grade(pairs)
    grade_s = time.perf_counter() - start
    passed = sum(v.correct for v in verdicts)
    print(f"HumanEval+ canonical, {len(problems)} programs, {tests} tests:")
    print(f"  expected outputs: {expected_s:6.1f} s  ({len(problems) / expected_s:.2f} programs/s)")
    print(f"  grading:          {grade_s:6.1f} s  ({len(problems) / grade_s:.2f} programs/s, "
          f"{tests / grade_s:.0f} tests/s); {passed}/{len(problems)} correct")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: CPU count)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N HumanEval+ problems")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    import os

    workers = args.workers or os.cpu_count() or 1
    print(f"isolation: {isolation_mode()}, workers: {workers}, CPUs: {os.cpu_count()}")
    fixed_cost(args.repeats)
    trivial_throughput(workers, 4 * args.repeats)
    humanevalplus_throughput(args.data_dir, args.limit)


if __name__ == "__main__":
    main()
