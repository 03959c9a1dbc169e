"""The registries of training tasks and evaluation benchmarks, and the records they deal in.

A training task (`--task`) yields prompts with gold answers and scores responses; a benchmark
(`meds eval --benchmarks`) loads a fixed problem set and grades responses. Both are registered
by name so that `meds list` and did-you-mean work the same way as for algorithms.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from meds_cli.registry import Registry


@dataclass
class Problem:
    """One problem: `question` is the bare problem text (no prompt template), `answer` the gold
    answer normalized to a string for math, or whatever the grader needs for code."""

    id: str
    question: str
    answer: Any
    meta: dict = field(default_factory=dict)


class ProblemSet(list):
    """A benchmark's problems as `Benchmark.load` returns them, with `data`: what the loader found
    in its source (where from, rows skipped and why, the row count against the known one), which
    the eval report shows beside the scores. A plain list of problems works as well."""

    def __init__(self, problems=(), data: dict | None = None):
        super().__init__(problems)
        self.data = data or {}


@dataclass
class Verdict:
    """A graded response. `outcome` is the error class EDAS and the reports use:
    math: 'correct', 'wrong', 'no_answer', 'timeout'; code: 'passed', 'WrongAnswer', an
    exception type name, 'Timeout', 'MemoryLimit', 'Killed'."""

    correct: bool
    extracted: str | None
    outcome: str
    detail: dict = field(default_factory=dict)


@dataclass
class Benchmark:
    name: str
    description: str
    kind: str  # "math" or "code"
    # load(data_dir, limit) -> problems; data_dir None means the dataset hub by name.
    load: Callable[[Path | None, int | None], list[Problem]]
    # grade(pairs of (problem, response)) -> verdicts, in order; batched so a worker pool can run them.
    grade: Callable[[Sequence[tuple[Problem, str]]], list[Verdict]]


TASKS: Registry = Registry("task")
BENCHMARKS: Registry[Benchmark] = Registry("benchmark")
