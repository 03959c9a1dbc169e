"""Agreement of the project's HumanEval+/MBPP+ grader with the evalplus package (0.3.1).

Draws --problems problems of each benchmark (seeded), makes --per-problem candidates of each
(the canonical solution and seeded variants of it: benchmarks/evalplus_agreement.py), grades them
with evalplus's own code in the sandbox and with the grader of --grader-root (default: this tree;
give another checkout, e.g. of main, to measure an older grader), and prints how many base, plus
and overall verdicts agree, with the disagreements by variant. Problems whose canonical solution
takes 0.3 s or more on some input are left out (timing noise decides near their limits), and so
is HumanEval/32 (EvalPlus 0.3.1 fails every solution to it). evalplus's verdicts are kept in
--cache and reused while the candidates are the same.

Usage: python scripts/bench_evalplus_agreement.py [--data-dir DIR (holds <benchmark>/test.jsonl)] [--problems 30]
           [--per-problem 8] [--seed 0] [--grader-root PATH] [--cache FILE]
Needs: pip install evalplus==0.3.1 (the project's `evalplus` extra).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import code_loaders  # noqa: E402
from benchmarks.code_benchmarks import ensure_expected  # noqa: E402
from benchmarks.code_expected import expected_for  # noqa: E402
from benchmarks.code_rows import read_json_lines  # noqa: E402
from benchmarks.evalplus_agreement import (  # noqa: E402
    KNOWN_EVALPLUS_BUGS,
    Candidate,
    agreement,
    evalplus_verdicts,
    seeded_candidates,
)  # fmt: skip

LOADERS = {"humanevalplus": code_loaders.load_humanevalplus, "mbppplus": code_loaders.load_mbppplus}
SLOW_CANONICAL_S = 0.3

# Grades (benchmark, problem id, response) triples with the grader of the tree it runs in, through
# the registry API that every version of the project has; prints base/plus verdicts as JSON.
_GRADE_WITH_ANOTHER_TREE = r"""
import json, sys
from pathlib import Path
from benchmarks import load_all
from benchmarks.registry import BENCHMARKS
load_all()
request = json.load(sys.stdin)
verdicts = [None] * len(request["items"])
for name in sorted({item["benchmark"] for item in request["items"]}):
    benchmark = BENCHMARKS.get(name)
    problems = {p.id: p for p in benchmark.load(Path(request["data_dir"]), None)}
    chosen = [i for i, item in enumerate(request["items"]) if item["benchmark"] == name]
    graded = benchmark.grade([(problems[request["items"][i]["problem_id"]], request["items"][i]["response"])
                              for i in chosen])
    for i, verdict in zip(chosen, graded):
        verdicts[i] = {"base_passed": verdict.detail.get("base_passed"),
                       "plus_passed": verdict.detail.get("plus_passed")}
print(json.dumps(verdicts))
"""


def draw(data_dir: Path, count: int, per_problem: int, seed: int) -> tuple[dict, dict, list[Candidate], int]:
    """Problems per benchmark, their release rows, the candidates, how many problems were left out."""
    problems, rows, candidates, left_out = {}, {}, [], 0
    for name, load in LOADERS.items():
        drawn = random.Random(seed).sample(load(data_dir), count)
        ensure_expected(drawn)
        kept = [p for p in drawn if p.id not in KNOWN_EVALPLUS_BUGS
                and max(expected_for(p).seconds, default=0.0) < SLOW_CANONICAL_S]  # fmt: skip
        left_out += len(drawn) - len(kept)
        problems[name] = kept
        found = read_json_lines([data_dir / code_loaders._FILES[name]], name)
        rows[name] = {row["task_id"]: row for _, row in found.rows}
        candidates += seeded_candidates(kept, per_problem, seed)
    return problems, rows, candidates, left_out


def reference(problems: dict, rows: dict, candidates: list[Candidate], cache: Path) -> list[dict]:
    key = [[c.problem_id, c.variant, c.solution] for c in candidates]
    if cache.is_file():
        stored = json.loads(cache.read_text())
        if stored.get("candidates") == key:
            return stored["evalplus"]
    verdicts: list[dict] = [{} for _ in candidates]
    for name, chosen in problems.items():
        ids = {p.id for p in chosen}
        indices = [i for i, c in enumerate(candidates) if c.problem_id in ids]
        found = evalplus_verdicts(chosen, rows[name], [candidates[i] for i in indices])
        for i, verdict in zip(indices, found):
            verdicts[i] = verdict
    cache.write_text(json.dumps({"candidates": key, "evalplus": verdicts}))
    return verdicts


def benchmark_of(candidate: Candidate) -> str:
    return "humanevalplus" if candidate.problem_id.startswith("HumanEval/") else "mbppplus"


def project(candidates: list[Candidate], data_dir: Path, grader_root: Path) -> list[dict]:
    items = [{"benchmark": benchmark_of(c), "problem_id": c.problem_id, "response": f"```python\n{c.solution}\n```"}
             for c in candidates]  # fmt: skip
    request = json.dumps({"data_dir": str(data_dir.resolve()), "items": items})
    env = dict(os.environ, PYTHONPATH=str(grader_root.resolve()))
    done = subprocess.run([sys.executable, "-c", _GRADE_WITH_ANOTHER_TREE], input=request, capture_output=True,
                          text=True, env=env, cwd=grader_root, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"grading with {grader_root} failed:\n{done.stderr[-3000:]}")
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    return [{"base": "pass" if v["base_passed"] else "fail",
             "plus": "pass" if v["plus_passed"] or (v["plus_passed"] is None and v["base_passed"]) else "fail"}
            for v in verdicts]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--problems", type=int, default=30, help="problems drawn per benchmark")
    parser.add_argument("--per-problem", type=int, default=8, help="candidates per problem, the canonical one included")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grader-root", type=Path, default=ROOT, help="the project checkout whose grader is measured")
    parser.add_argument("--cache", type=Path, default=Path("evalplus_reference_verdicts.json"))
    args = parser.parse_args()

    start = time.perf_counter()
    problems, rows, candidates, left_out = draw(args.data_dir, args.problems, args.per_problem, args.seed)
    theirs = reference(problems, rows, candidates, args.cache)
    reference_s = time.perf_counter() - start
    ours = project(candidates, args.data_dir, args.grader_root)
    result = agreement(candidates, ours, theirs)
    n, same = result["compared"], result["same"]
    grader_s = time.perf_counter() - start - reference_s
    print(f"grader: {args.grader_root}  ({sum(len(p) for p in problems.values())} problems, {left_out} left out "
          f"as slow; {n} candidates; evalplus {reference_s:.0f} s, grader {grader_s:.0f} s)")
    for what in ("base", "plus", "both", "correct"):
        print(f"  {what:7s} verdicts agree: {same[what]:4d} / {n}  ({100 * same[what] / n:.1f}%)")
    by_variant = Counter(d["variant"] for d in result["disagreements"])
    for variant, count in by_variant.most_common():
        print(f"  disagree on {variant}: {count}")
    for d in result["disagreements"][:20]:
        print(f"    {d['problem']:14s} {d['variant']:26s} ours {d['ours']}  evalplus {d['evalplus']}")


if __name__ == "__main__":
    main()
