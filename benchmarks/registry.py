"""The registries of training tasks and evaluation benchmarks, and the records they deal in.

A training task (`--task`) yields prompts with gold answers and scores responses; a benchmark
(`meds eval --benchmarks`) loads a fixed problem set and grades responses. Both are registered
by name so that `meds list` and did-you-mean work the same way as for algorithms.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from meds_cli.core.records import Problem, Verdict
from meds_cli.core.registry import Registry


class ProblemSet(list):
    """A benchmark's problems as `Benchmark.load` returns them, with `data`: what the loader found
    in its source (where from, rows skipped and why, the row count against the known one), which
    the eval report shows beside the scores. A plain list of problems works as well."""

    def __init__(self, problems=(), data: dict | None = None):
        super().__init__(problems)
        self.data = data or {}


@dataclass
class Benchmark:
    name: str
    description: str
    kind: str  # "math" or "code"
    # load(data_dir, limit) -> problems; data_dir None means the dataset hub by name.
    load: Callable[[Path | None, int | None], list[Problem]]
    # grade(pairs of (problem, response)) -> verdicts, in order; batched so a worker pool can run them.
    grade: Callable[[Sequence[tuple[Problem, str]]], list[Verdict]]
    # prompt(problem, tokenizer) -> text, where the benchmark prompts its own way (a training
    # task's held-out split, prompted as in training); None: the eval's prompt style.
    prompt: Callable[[Problem, object], str] | None = None


TASKS: Registry = Registry("task")
BENCHMARKS: Registry[Benchmark] = Registry("benchmark")
