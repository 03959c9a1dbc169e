"""Final answers grouped into equivalence classes, per group of responses.

Used by EDAS (error classes of wrong answers; seed 003) and by multi-reward RLIF (answer
clusters for cluster voting; seed 002). Both papers call two answers one class when they are
mathematically equal, so `1/2` and `0.5` must share a class. Asking a symbolic checker about
every pair is slow (math-verify runs in worker processes), so the work is staged:

1. canonical key (`benchmarks.answer_extraction.answer_key`, the maj@k key): plain numbers map
   to their exact value, anything else to its text without spacing; equal keys are one class.
   The arithmetic task's integer answers are always settled here.
2. distinct keys are compared by rules that need no checker: two integers are equal only when
   their keys are (the grader's own rule), two numbers far apart are different, and two
   different one-character answers are never equal (single symbols such as the copy task's);
3. the remaining pairs of distinct keys go to the math grader in one batched call per step
   (non-strict: the reward's "gold must be a literal" rule protects rewards, not classes), with
   a cache of results across steps because the same answers recur for the same prompt.
Classes are the connected components of "equal" (union-find), numbered in order of first
appearance; an answer of None (nothing extractable) gets the label None and callers decide
what it means.
"""

from __future__ import annotations

from collections import OrderedDict
from fractions import Fraction
from typing import Hashable, Sequence

from benchmarks.answer_extraction import answer_key

EQUIVALENCE_MODES = ["grader", "key"]
_CACHE_SIZE = 100_000
_pair_cache: OrderedDict[tuple[str, str], bool] = OrderedDict()


def _number(key: str) -> Fraction | None:
    return Fraction(key[4:]) if key.startswith("num:") else None


def decided_without_grader(a: str, b: str) -> bool | None:
    """Whether two distinct canonical keys are equal when no checker is needed, else None."""
    if a == b:
        return True
    x, y = _number(a), _number(b)
    if x is not None and y is not None:
        if x.denominator == y.denominator == 1:
            return False  # two different integers: no checker makes them equal
        # The checker's rounding can only join near-equal values (0.333333 and 1/3); values
        # apart by more than a relative 1e-3 are different whatever its precision settings.
        if abs(x - y) > Fraction(1, 1000) * max(1, abs(x), abs(y)):
            return False
    if len(a) == 1 and len(b) == 1:
        return False
    return None


def _grader_equal(pairs: list[tuple[str, str]]) -> list[bool]:
    """The math grader's verdict on each (answer, answer) pair, cached; a time-out counts as different."""
    todo = [p for p in dict.fromkeys(pairs) if p not in _pair_cache]
    if todo:
        from benchmarks.math_grading import shared_grader  # lazy: starts worker processes on first use

        verdicts = shared_grader().grade_many(todo, strict=False)
        for pair, verdict in zip(todo, verdicts):
            _pair_cache[pair] = bool(verdict.correct)
            if len(_pair_cache) > _CACHE_SIZE:
                _pair_cache.popitem(last=False)
    return [_pair_cache[p] for p in pairs]


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        ri, rj = self.find(i), self.find(j)
        if ri != rj:
            self.parent[max(ri, rj)] = min(ri, rj)  # the earlier key stays the root


def answer_classes(groups: Sequence[Sequence[str | None]], equivalence: str = "grader") -> list[list[int | None]]:
    """For each group of final answers, a class label per answer (0, 1, ... in order of first
    appearance) or None where the answer is None or blank.

    equivalence 'grader': canonical keys, then the math grader for pairs the keys cannot settle;
    'key': canonical keys only (fast, conservative: equal expressions written differently split).
    """
    if equivalence not in EQUIVALENCE_MODES:
        raise ValueError(f"unknown equivalence {equivalence!r}; accepted: {', '.join(EQUIVALENCE_MODES)}")
    keyed, distinct, texts = [], [], []
    for answers in groups:
        keys = [answer_key(a) if a is not None else None for a in answers]
        keyed.append(keys)
        order: dict[str, str] = {}  # key -> the first answer text that produced it
        for k, a in zip(keys, answers):
            if k is not None and k not in order:
                order[k] = a.strip()
        distinct.append(list(order))
        texts.append(list(order.values()))
    # Every undecided pair of every group, so the grader sees one batch per call.
    asks: list[tuple[int, int, int]] = []
    pairs: list[tuple[str, str]] = []
    forests = [_UnionFind(len(d)) for d in distinct]
    for g, keys in enumerate(distinct):
        for i in range(len(keys)):
            for j in range(i + 1, len(keys)):
                decided = decided_without_grader(keys[i], keys[j])
                if decided is None and equivalence == "grader":
                    asks.append((g, i, j))
                    pairs.append((texts[g][i], texts[g][j]))
    if pairs:
        for (g, i, j), equal in zip(asks, _grader_equal(pairs)):
            if equal:
                forests[g].union(i, j)
    labels = []
    for keys, keys_distinct, forest in zip(keyed, distinct, forests):
        index = {k: i for i, k in enumerate(keys_distinct)}
        roots: dict[int, int] = {}
        out: list[int | None] = []
        for k in keys:
            if k is None:
                out.append(None)
                continue
            root = forest.find(index[k])
            out.append(roots.setdefault(root, len(roots)))
        labels.append(out)
    return labels


def class_sizes(labels: Sequence[Hashable | None]) -> dict[Hashable, int]:
    """How many members each non-None label has."""
    sizes: dict[Hashable, int] = {}
    for label in labels:
        if label is not None:
            sizes[label] = sizes.get(label, 0) + 1
    return sizes
