"""Throughput of the math grader (answers per second) on MATH500 answers.

Four workloads, each graded once by a warm pool:
  identical   each gold answer against itself (the parent's identical-text shortcut)
  rewritten   each gold answer written differently (27 as 27.0, 3/4 as 0.75 or \\frac{6}{8},
              \\frac as \\dfrac, \\left( as a bare parenthesis, a \\displaystyle in front):
              numbers take the exact path,
              the rest reach math-verify
  shuffled    every gold answer against another problem's gold answer (wrong answers)
  symbolic    shuffled answers among the non-number golds only: every pair reaches math-verify

Usage: python scripts/bench_grading.py [--data-dir DIR (holds <benchmark>/test.jsonl)] [--workers N] [--timeout-s 5]
"""

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.math_benchmarks  # noqa: E402,F401  (registers the benchmarks)
from benchmarks.answer_extraction import number_literal_value  # noqa: E402
from benchmarks.math_grading import MathGrader  # noqa: E402
from benchmarks.registry import BENCHMARKS  # noqa: E402


def rewrite(gold: str) -> str:
    """An equivalent spelling of a gold answer that is not the same text."""
    value = number_literal_value(gold)
    if value is not None:
        if value.denominator == 1:
            return f"{value.numerator}.0"
        return f"\\frac{{{2 * value.numerator}}}{{{2 * value.denominator}}}"
    return "\\displaystyle " + gold.replace("\\left", "").replace("\\right", "").replace("\\frac", "\\dfrac")


def workloads(data_dir: Path, seed: int) -> dict[str, list[tuple[str, str]]]:
    problems = BENCHMARKS.get("math500").load(data_dir, None)
    golds = [p.answer for p in problems]
    rng = random.Random(seed)
    shuffled = golds[:]
    rng.shuffle(shuffled)
    symbolic = [g for g in golds if number_literal_value(g) is None]
    symbolic_shuffled = symbolic[1:] + symbolic[:1]  # a rotation: no answer meets itself
    return {
        "identical": [(g, g) for g in golds],
        "rewritten": [(rewrite(g), g) for g in golds],
        "shuffled": list(zip(shuffled, golds)),
        "symbolic": list(zip(symbolic_shuffled, symbolic)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="folder holding <benchmark>/test.jsonl")
    parser.add_argument("--workers", type=int, default=None, help="pool size (default: CPU count)")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    loads = workloads(args.data_dir, args.seed)
    with MathGrader(workers=args.workers, timeout_s=args.timeout_s) as grader:
        start = time.monotonic()
        grader.grade_many([("x+1", "1+x")] * grader.workers)  # start every worker before timing
        print(f"pool of {grader.workers} workers, timeout {args.timeout_s:g} s; "
              f"warm-up {time.monotonic() - start:.1f} s")
        print(f"{'workload':<10} {'pairs':>6} {'seconds':>8} {'answers/s':>10}  outcomes / decided by")
        for name, pairs in loads.items():
            start = time.monotonic()
            verdicts = grader.grade_many(pairs)
            seconds = time.monotonic() - start
            outcomes = Counter(v.outcome for v in verdicts)
            by = Counter(v.detail.get("by", "-") for v in verdicts)
            print(f"{name:<10} {len(pairs):>6} {seconds:>8.2f} {len(pairs) / seconds:>10.1f}  "
                  f"{dict(outcomes)} / {dict(by)}")
        print(f"worker restarts: {grader.restarts}")


if __name__ == "__main__":
    main()
