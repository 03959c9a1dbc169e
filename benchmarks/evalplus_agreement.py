"""The grader checked against the `evalplus` package: seeded candidates graded by both.

`seeded_candidates` makes, from each problem's canonical solution, the solution itself and
variants of it: wrappers that change the output's type (tuple, set, iterator, numpy array or
scalar), its value (off by one, NaN, float noise below and above the tolerance, None, a huge
list), its timing (slow on every input, too slow on one, endless, slow to load) or its manners
(printing, reading stdin, opening a file, exiting, raising now and then, keeping state across
calls, mutating its input). `evalplus_verdicts` grades them with evalplus 0.3.1's own code
(`trusted_exec` for the expected outputs and their times, `untrusted_check` for the base and
the plus tests, as `evalplus.evaluate.check_correctness` calls them), inside the sandbox, on the
same data rows. `agreement` counts the candidates whose base and plus verdicts match the
project's.

The `evalplus` package is an optional extra (`pip install -e '.[evalplus]'`); nothing else in
the project imports it. HumanEval/32 is left out of the comparison: EvalPlus 0.3.1 fails every
solution to it (code_compare).
"""

import json
import os
import random
from dataclasses import dataclass
from typing import Sequence

from benchmarks.sandbox import Job, run_many
from meds_cli.core.records import Problem, Verdict

KNOWN_EVALPLUS_BUGS = frozenset({"HumanEval/32"})
_REPORT = "evalplus_verdicts.json"

# Each variant: a body that turns `out` (the canonical output for `args`) into the candidate's
# answer; `calls` counts the calls since the solution was loaded, `np` is numpy.
VARIANTS = {
    "canonical": None,
    "tuple": "return tuple(out) if isinstance(out, list) else out",
    "list": "return list(out) if isinstance(out, tuple) else out",
    "set": "return set(out) if isinstance(out, (list, tuple)) else out",
    "iterator": "return iter(out) if isinstance(out, (list, tuple)) else out",
    "reversed": "return out[::-1] if isinstance(out, (list, tuple, str)) else out",
    "numpy": ("if isinstance(out, list):\n        return np.array(out)\n"
              "    if type(out) is float:\n        return np.float64(out)\n"
              "    return np.int64(out) if type(out) is int and abs(out) < 2**62 else out"),
    "numpy_noisy_float": "return np.float64(out) * (1 + 1e-9) if type(out) is float else out",
    "float_noise_within": "return out * (1 + 1e-9) if type(out) is float else out",
    "float_noise_beyond": "return out + 1e-3 if type(out) is float else out",
    "int_as_float": "return float(out) if type(out) is int and abs(out) < 2**52 else out",
    "off_by_one": "return out + 1 if type(out) is int else out",
    "negated_bool": "return (not out) if isinstance(out, bool) else out",
    "none": "return None",
    "nan": "return float('nan') if isinstance(out, float) else out",
    "always_nan": "return float('nan')",
    "huge_output": "return list(range(2_000_000)) if calls == 2 else out",
    "raises_on_third_call": "if calls == 3:\n        raise ValueError('third call')\n    return out",
    "stateful_wrong_after_five": "return None if calls > 5 else out",
    "slow_on_every_input": "time.sleep(0.004)\n    return out",
    "too_slow_on_one_input": "if calls == 1:\n        time.sleep(2.5)\n    return out",
    "endless_on_second_input": "while calls == 2:\n        pass\n    return out",
    "prints": "print('debug', args, out)\n    print('x' * 1000)\n    return out",
    "reads_stdin": "input()\n    return out",
    "opens_a_file": "open('/etc/hostname').close()\n    return out",
    "exits": "sys.exit(0) if calls == 2 else None\n    return out",
    "mutates_input_after": ("if args and isinstance(args[0], list):\n        args[0].append(None)\n"
                            "    return out"),
}
# Variants whose changes happen at load time, not per call.
LOAD_VARIANTS = {"slow_to_load": "time.sleep(2.5)", "fails_to_load": "raise ImportError('no such module')"}


def _wrapped(canonical: str, entry_point: str, body: str | None, load: str | None) -> str:
    if body is None and load is None:
        return canonical
    body = body or "return out"
    return (
        f"import sys, time\nimport numpy as np\n{canonical}\n\n"
        f"{load or ''}\n"
        f"_canonical_solution = {entry_point}\n_calls = [0]\n\n\n"
        f"def {entry_point}(*args):\n"
        f"    _calls[0] += 1\n    calls = _calls[0]\n"
        f"    out = _canonical_solution(*args)\n"
        f"    {body}\n"
    )


@dataclass(frozen=True)
class Candidate:
    problem_id: str
    variant: str
    solution: str  # the whole program, as EvalPlus's `solution` field


def seeded_candidates(problems: Sequence[Problem], per_problem: int, seed: int = 0) -> list[Candidate]:
    """For each problem, its canonical solution and per_problem - 1 variants drawn with seed."""
    rng = random.Random(seed)
    kinds = [k for k in VARIANTS if k != "canonical"] + list(LOAD_VARIANTS)
    candidates = []
    for problem in problems:
        entry_point, canonical = problem.answer["entry_point"], problem.answer["canonical_solution"]
        for kind in ["canonical"] + rng.sample(kinds, min(per_problem - 1, len(kinds))):
            body, load = VARIANTS.get(kind), LOAD_VARIANTS.get(kind)
            candidates.append(Candidate(problem.id, kind, _wrapped(canonical, entry_point, body, load)))
    return candidates


# ----- evalplus's verdicts, computed in the sandbox ----------------------------------------------

_PROGRAM = r'''
import json, sys

from evalplus.eval import untrusted_check
from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
from evalplus.gen.util import trusted_exec

payload = json.loads(sys.stdin.read())
dataset, verdicts = payload["dataset"], []
for task in payload["tasks"]:
    row = task["row"]
    base, plus = row["base_input"], row["plus_input"]
    if dataset == "mbpp":
        from evalplus.data.mbpp import mbpp_deserialize_inputs

        base = mbpp_deserialize_inputs(row["task_id"], base)
        plus = mbpp_deserialize_inputs(row["task_id"], plus)
    not_none = dataset == "mbpp" and row["entry_point"] in MBPP_OUTPUT_NOT_NONE_TASKS
    code = row["prompt"] + row["canonical_solution"]
    expected = {}
    for name, inputs in (("base", base), ("plus", plus)):
        expected[name] = trusted_exec(code, inputs, row["entry_point"], record_time=True, output_not_none=not_none)
    for solution in task["solutions"]:
        verdict = {}
        for name, inputs in (("base", base), ("plus", plus)):
            outputs, times = expected[name]
            status, _ = untrusted_check(dataset, solution, inputs, row["entry_point"], expected=outputs,
                                        atol=row["atol"], ref_time=times, fast_check=True,
                                        min_time_limit=1.0, gt_time_limit_factor=4.0)
            verdict[name] = status
        verdicts.append(verdict)
with open("''' + _REPORT + r'''", "w") as handle:
    json.dump(verdicts, handle)
'''


def _dataset(problem: Problem) -> str:
    return problem.answer["dataset"]


def evalplus_verdicts(problems: Sequence[Problem], rows: dict[str, dict], candidates: Sequence[Candidate],
                      timeout_s: float = 3600.0, programs: int | None = None) -> list[dict]:
    """{'base': status, 'plus': status} per candidate ('pass', 'fail' or 'timeout'), from evalplus
    0.3.1 run on the release rows (task id -> row) in the sandbox: `programs` programs per
    dataset (default: the CPU count), each taking its share of the problems in turn."""
    by_problem: dict[str, list[int]] = {}
    for index, candidate in enumerate(candidates):
        by_problem.setdefault(candidate.problem_id, []).append(index)
    shares: dict[tuple[str, int], list[Problem]] = {}
    programs = programs or os.cpu_count() or 1
    graded = [p for p in problems if p.id in by_problem]
    for position, problem in enumerate(graded):
        shares.setdefault((_dataset(problem), position % programs), []).append(problem)
    jobs, order = [], []
    for (dataset, _), share in shares.items():
        tasks = [{"row": rows[p.id], "solutions": [candidates[i].solution for i in by_problem[p.id]]} for p in share]
        stdin = json.dumps({"dataset": dataset, "tasks": tasks})
        jobs.append(Job(_PROGRAM, stdin=stdin, timeout_s=timeout_s, memory_mb=16384, collect=(_REPORT,)))
        order.append([i for p in share for i in by_problem[p.id]])
    verdicts: list[dict] = [{} for _ in candidates]
    for indices, result in zip(order, run_many(jobs)):
        try:
            found = json.loads(result.files.get(_REPORT, b"") or b"null")
        except ValueError:
            found = None
        if not isinstance(found, list) or len(found) != len(indices):
            raise RuntimeError(f"the evalplus reference run failed ({result.outcome}): {result.stderr[-2000:]}")
        for index, verdict in zip(indices, found):
            verdicts[index] = verdict
    return verdicts


def project_verdict(verdict: Verdict) -> dict:
    """The project's verdict in evalplus's terms: 'pass' or 'fail' for base and plus."""
    detail = verdict.detail
    plus = detail.get("plus_passed")
    return {"base": "pass" if detail.get("base_passed") else "fail",
            "plus": "pass" if plus or (plus is None and detail.get("base_passed")) else "fail"}  # fmt: skip


def _passed(status: str | None) -> bool:
    return status == "pass"


def agreement(candidates: Sequence[Candidate], ours: Sequence[dict], theirs: Sequence[dict]) -> dict:
    """How many base verdicts, plus verdicts, both, and "correct" verdicts (base and plus passed,
    what pass@k counts) agree, with the disagreements; KNOWN_EVALPLUS_BUGS problems left out."""
    compared, disagreements = 0, []
    same = {"base": 0, "plus": 0, "both": 0, "correct": 0}
    for candidate, mine, reference in zip(candidates, ours, theirs):
        if candidate.problem_id in KNOWN_EVALPLUS_BUGS:
            continue
        compared += 1
        base_same = _passed(mine["base"]) == _passed(reference["base"])
        plus_same = _passed(mine["plus"]) == _passed(reference["plus"])
        same["base"] += base_same
        same["plus"] += plus_same
        same["both"] += base_same and plus_same
        same["correct"] += (_passed(mine["base"]) and _passed(mine["plus"])) == (
            _passed(reference["base"]) and _passed(reference["plus"]))
        if not (base_same and plus_same):
            disagreements.append({"problem": candidate.problem_id, "variant": candidate.variant,
                                  "ours": mine, "evalplus": reference})  # fmt: skip
    return {"compared": compared, "same": same, "disagreements": disagreements}
