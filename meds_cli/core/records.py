"""The records tasks, graders, algorithms and reports pass around: a problem, a graded verdict,
and the names of outcomes and reward channels they agree on."""

from dataclasses import dataclass, field
from typing import Any

# The reward channel holding graded correctness (reward.wrong .. reward.correct); algorithms that
# filter or shape on correctness read it by this name.
CORRECTNESS = "correctness"

# Verdict outcomes of math graders; any other outcome is a code run's outcome class.
MATH_OUTCOMES = frozenset({"correct", "wrong", "no_answer", "timeout"})


@dataclass
class Problem:
    """One problem: `question` is the bare problem text (no prompt template), `answer` the gold
    answer normalized to a string for math, or whatever the grader needs for code."""

    id: str
    question: str
    answer: Any
    meta: dict = field(default_factory=dict)


@dataclass
class Verdict:
    """A graded response. `outcome` is the error class EDAS and the reports use:
    math: 'correct', 'wrong', 'no_answer', 'timeout'; code: 'passed', 'WrongAnswer', an
    exception type name, 'Timeout', 'MemoryLimit', 'Killed'."""

    correct: bool
    extracted: str | None
    outcome: str
    detail: dict = field(default_factory=dict)
