"""pass@k and maj@k: the two ways the eval harness scores n samples per problem.

pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", section 2.1): draw n >= k samples, count the c correct ones, and estimate the chance
that at least one of k samples drawn without replacement is correct,

    pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i),

the product form avoiding the huge binomials of n = 128 or more. It is NOT "any of the first k
is correct" (the biased count some codebases report), which has a higher variance.

maj@k (self-consistency, Wang et al. 2022) takes a majority vote over the first k final answers
and scores the winning answer.
"""

from collections.abc import Callable, Hashable, Sequence


def _check_counts(n: int, c: int, k: int) -> None:
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if n < 1:
        raise ValueError(f"n (samples per problem) must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c (correct samples) must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct (1 <= k <= n)."""
    _check_counts(n, c, k)
    if n - c < k:
        # Every k-subset contains a correct sample: C(n-c, k) = 0.
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i): each factor lies in (0, 1], so the
    # product neither overflows nor loses precision the way the binomials' ratio would.
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def maj_at_k(
    answers: Sequence[Hashable | None],
    correct: Sequence[bool],
    k: int,
    key: Callable[[Hashable], Hashable] | None = None,
) -> int:
    """1 when the majority answer among the first k samples is correct, else 0.

    `answers[i]` is sample i's final answer (None: it gave none), `correct[i]` its verdict.
    Answers are grouped by `key(answer)` (identity when None), so the harness can pass a
    canonical key that merges `0.5` and `\\frac{1}{2}`. Rules:
      - None never wins; when all k answers are None the result is 0.
      - ties go to the tied group whose first member came earliest among the k samples
        (deterministic, and it favours what the model said first).
      - the group's first member stands for the group: its `correct` is the result.
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers ({len(answers)}) and correct ({len(correct)}) differ in length")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(answers):
        raise ValueError(f"k must be in [1, {len(answers)}], got {k!r}")
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    for i in range(k):
        if answers[i] is None:
            continue
        group = key(answers[i]) if key is not None else answers[i]
        if group is None:
            continue
        counts[group] = counts.get(group, 0) + 1
        first.setdefault(group, i)
    if not counts:
        return 0
    winner = max(counts, key=lambda g: (counts[g], -first[g]))
    return int(bool(correct[first[winner]]))


def ks_to_report(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n, plus n itself when it is not a power of two."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def mean_pass_at_k(counts: Sequence[tuple[int, int]], ks: Sequence[int] | None = None) -> dict[int, float]:
    """Mean pass@k over problems given (n, c) per problem; ks default to ks_to_report(min n)."""
    if not counts:
        raise ValueError("no problems to average over")
    if ks is None:
        ks = ks_to_report(min(n for n, _ in counts))
    return {k: sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks}


def mean_maj_at_k(
    samples: Sequence[tuple[Sequence[Hashable | None], Sequence[bool]]],
    ks: Sequence[int] | None = None,
    key: Callable[[Hashable], Hashable] | None = None,
) -> dict[int, float]:
    """Mean maj@k over problems given (answers, correct) per problem."""
    if not samples:
        raise ValueError("no problems to average over")
    if ks is None:
        ks = ks_to_report(min(len(a) for a, _ in samples))
    return {k: sum(maj_at_k(a, c, k, key) for a, c in samples) / len(samples) for k in ks}
