"""Expected outputs of the EvalPlus benchmarks, and the time limits they set, cached per problem.

The expected output of a test input is what the problem's canonical solution returns on it, as in
EvalPlus (`get_groundtruth`): the canonical solution runs once per problem (in the sandbox, with
generous limits, unguarded: it is the benchmark's own code), each group of inputs from a fresh
load, and the time of every call is measured as EvalPlus measures it (the call alone, its input
deep-copied before the clock starts). A candidate then gets, per input,
max(MIN_TIME_LIMIT_S, TIME_LIMIT_FACTOR x the canonical time on that input), EvalPlus's
defaults. An input the canonical solution gives no usable output for (an error, a time-out, an
output too big to ship) is left out of the tests, with a warning.

The cache lives for the process: an eval or a training run computes each problem's expected
outputs once.
"""

import logging
import threading
from dataclasses import dataclass
from typing import Sequence

from benchmarks.code_compare import MBPP_NOT_NONE
from benchmarks.code_harness import REPORT_FILE, harness_source, payload, read_records
from benchmarks.code_values import decode_value, encode_value
from benchmarks.sandbox import Job, run_many
from meds_cli.core.records import Problem

log = logging.getLogger(__name__)

MIN_TIME_LIMIT_S = 1.0  # EvalPlus's DEFAULT_MIN_TIME_LIMIT
TIME_LIMIT_FACTOR = 4.0  # EvalPlus's DEFAULT_GT_TIME_LIMIT_FACTOR
GROUP_TIME_CAP_S = 60.0  # EvalPlus's EVALPLUS_TIMEOUT_PER_TASK default: a group's budget at most
GROUP_SLACK_S = 2.0  # EvalPlus waits 1 s past the budget, then 1 s more before killing the process
CANONICAL_TIMEOUT_S = 300.0  # the whole canonical program (Mbpp/599's plus tests take ~60 s)
CANONICAL_MEMORY_MB = 8192  # EvalPlus runs the canonical solutions unlimited, in its own process


@dataclass
class Expected:
    outputs: list  # decoded expected values, one per base+plus input (None where skipped)
    seconds: list  # the canonical solution's time on each input (0.0 where skipped)
    skipped: frozenset[int] = frozenset()  # inputs left out: no usable canonical output
    # The canonical program's time beyond its calls: loading, and encoding its outputs (seconds
    # for outputs of millions of items). A candidate's program is given as much on top of its
    # groups' budgets, which do not count the encoding (code_harness).
    overhead_s: float = 0.0

    def kept(self, indices: range) -> list[int]:
        return [index for index in indices if index not in self.skipped]


_EXPECTED: dict[tuple[str, str], Expected] = {}
_ENCODED: dict[tuple[str, str], list] = {}
_LOCK = threading.Lock()


def cache_key(problem: Problem) -> tuple[str, str]:
    return (problem.meta.get("benchmark", ""), problem.id)


def all_inputs(problem: Problem) -> list:
    return list(problem.answer["base_input"]) + list(problem.answer["plus_input"])


def encoded_inputs(problem: Problem) -> list:
    """Every input of the problem in the wire format, encoded once per process."""
    key = cache_key(problem)
    with _LOCK:
        if key not in _ENCODED:
            _ENCODED[key] = encode_value(all_inputs(problem))
        return _ENCODED[key]


def group_ranges(problem: Problem) -> tuple[range, range]:
    """Indices of the base inputs and of the plus inputs among all inputs."""
    n_base, n_plus = problem.answer["n_base"], problem.answer["n_plus"]
    return range(n_base), range(n_base, n_base + n_plus)


def time_limit(canonical_seconds: float) -> float:
    """EvalPlus's limit for one input: max(1 s, 4 x the canonical solution's time on it)."""
    return max(MIN_TIME_LIMIT_S, TIME_LIMIT_FACTOR * canonical_seconds)


def group_budget(limits: Sequence[float]) -> float:
    """EvalPlus's wall-clock budget of a group (one process there): its limits summed, capped."""
    return min(GROUP_TIME_CAP_S, sum(limits)) + GROUP_SLACK_S


def _expected_form(problem: Problem, output):
    """EvalPlus keeps only `output is not None` for the MBPP+ tasks whose reference returns a
    regex match object (evaluate.get_groundtruth with output_not_none)."""
    if problem.answer.get("dataset") == "mbpp" and problem.answer["entry_point"] in MBPP_NOT_NONE:
        return output is not None
    return output


def _canonical_job(problem: Problem) -> Job:
    inputs = encoded_inputs(problem)
    base, plus = group_ranges(problem)
    groups = [{"inputs": inputs[r.start:r.stop], "limits": None, "budget": None} for r in (base, plus)]
    stdin = payload("call", problem.answer["canonical_solution"], entry_point=problem.answer["entry_point"],
                    groups=groups)  # fmt: skip
    return Job(harness_source(), stdin=stdin, timeout_s=CANONICAL_TIMEOUT_S, memory_mb=CANONICAL_MEMORY_MB,
               collect=(REPORT_FILE,))  # fmt: skip


def _from_canonical_run(problem: Problem, result) -> Expected:
    records, outputs, seconds, skipped = read_records(result), [], [], set()
    for index in range(len(all_inputs(problem))):
        record = records.get(index, {})
        if "ok" in record:
            outputs.append(_expected_form(problem, decode_value(record["ok"])))
            seconds.append(float(record.get("t", 0.0)))
        else:
            outputs.append(None)
            seconds.append(0.0)
            skipped.add(index)
    if skipped:
        first = records.get(min(skipped))
        why = first.get("exc", "output too big") if first else result.outcome
        log.warning("%s: %d test input(s) left out: the canonical solution gave no usable output "
                    "(first: input %d, %s)", problem.id, len(skipped), min(skipped), why)  # fmt: skip
    return Expected(outputs, seconds, frozenset(skipped), max(0.0, result.duration_s - sum(seconds)))


def ensure_expected(problems: Sequence[Problem]) -> None:
    """Compute (in parallel, in the sandbox) the expected outputs of the problems not cached yet."""
    missing = {cache_key(p): p for p in problems if p.answer["mode"] == "call" and cache_key(p) not in _EXPECTED}
    todo = list(missing.values())
    for problem, result in zip(todo, run_many([_canonical_job(p) for p in todo])):
        _EXPECTED[cache_key(problem)] = _from_canonical_run(problem, result)


def expected_for(problem: Problem) -> Expected:
    """The cached expected outputs (ensure_expected first)."""
    return _EXPECTED[cache_key(problem)]
