"""Paired statistics for comparing two evaluated policies on the same problems: pure functions.

The unit is the problem: both arms answered the same problems, so their difference is measured
problem by problem (d_i = a_i - b_i, a_i and b_i each arm's unbiased per-problem pass@k) and the
spread between problems, which is much larger than the difference the comparison is after,
cancels out. Where each arm was trained with several seeds, the data are groups: one group per
seed, holding that seed's per-problem differences (the two arms of a seed share its problems;
two seeds may draw different held-out problems). The statistic is then the mean over seeds of
each seed's mean difference, so every seed weighs the same whatever its number of problems.

- `bootstrap_replicates`: the statistic recomputed on resampled data, hierarchically: seeds are
  drawn with replacement, then within each drawn seed its problems with replacement (with one
  seed this is the ordinary bootstrap over problems). The percentile interval of the replicates
  is the confidence interval; their standard deviation the standard error.
- `sign_flip_p_value`: the paired randomization test. Under "no difference" each problem's two
  arms are exchangeable, so the sign of each d_i is a coin flip; the p-value is the share of sign
  patterns whose statistic is at least as far from zero as the observed one (every pattern when
  there are few, else a seeded sample of them). It makes no normality assumption, which matters
  for per-problem pass@k: bounded, often 0 or 1, with many ties at 0.
- `detectable_difference`: the smallest true difference the comparison would detect with 80%
  power at the 5% level, (z_0.975 + z_0.8) x standard error: what "no difference" rests on.

Every function that draws random numbers takes a seed, so a report is reproducible.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from benchmarks.passk import pass_at_k

CONFIDENCE = 0.95
RESAMPLES = 10_000
EXACT_FLIP_LIMIT = 16  # at most 2**16 sign patterns are enumerated; more are sampled


def per_problem_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> np.ndarray:
    """The unbiased pass@k of each problem from its (n samples, c correct): not 0/1 but the chance
    that k of its n samples include a correct one (exactly 1 when n - c < k, i.e. k close to n)."""
    return np.array([pass_at_k(n, c, k) for n, c in counts], dtype=float)


def _as_groups(groups: Sequence[Sequence[float]]) -> list[np.ndarray]:
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if not arrays or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("need at least one group (seed), each with at least one value (problem)")
    return arrays


def hierarchical_mean(groups: Sequence[Sequence[float]]) -> float:
    """The mean over groups of each group's mean."""
    return float(np.mean([a.mean() for a in _as_groups(groups)]))


def bootstrap_replicates(groups: Sequence[Sequence[float]], resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """`resamples` values of hierarchical_mean on data resampled with replacement: the groups
    first, then the values inside every drawn group (a group drawn twice is resampled twice,
    independently)."""
    arrays = _as_groups(groups)
    rng = np.random.default_rng(seed)
    count = len(arrays)
    chosen = rng.integers(count, size=(resamples, count))  # which group fills each slot of each replicate
    slot_means = np.empty((resamples, count))
    for slot in range(count):
        for group, values in enumerate(arrays):
            rows = np.flatnonzero(chosen[:, slot] == group)
            if rows.size:
                picks = rng.integers(values.size, size=(rows.size, values.size))
                slot_means[rows, slot] = values[picks].mean(axis=1)
    return slot_means.mean(axis=1)


def percentile_interval(replicates: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central `confidence` share of the replicates (the percentile bootstrap interval)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(np.asarray(replicates, dtype=float), [tail, 100 - tail])
    return float(low), float(high)


def mean_interval(groups: Sequence[Sequence[float]], confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                  seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of hierarchical_mean (e.g. of pass@k from its per-problem values)."""
    return percentile_interval(bootstrap_replicates(groups, resamples, seed), confidence)


def sign_flip_p_value(groups: Sequence[Sequence[float]], resamples: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip test of "mean difference 0" on the groups'
    per-problem differences, with hierarchical_mean as the statistic. Exact (every sign pattern)
    when at most EXACT_FLIP_LIMIT differences are non-zero (zeros do not change the statistic),
    else from `resamples` seeded patterns, counting the observed one: (hits + 1) / (resamples + 1)."""
    arrays = _as_groups(groups)
    # hierarchical_mean is linear: sum_i weight_i * d_i with weight 1 / (groups * size of i's group).
    weights = np.concatenate([np.full(a.size, 1.0 / (len(arrays) * a.size)) for a in arrays])
    terms = weights * np.concatenate(arrays)
    terms = terms[terms != 0]
    observed = abs(terms.sum())
    if terms.size == 0:
        return 1.0
    tolerance = 1e-12 * max(1.0, observed)  # the observed pattern must count itself despite rounding
    if terms.size <= EXACT_FLIP_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=terms.size)))
        return float(np.mean(np.abs(signs @ terms) >= observed - tolerance))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(resamples, terms.size))
    hits = int(np.sum(np.abs(signs @ terms) >= observed - tolerance))
    return (hits + 1) / (resamples + 1)


def detectable_difference(standard_error: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at level `alpha` detects with probability
    `power`, for an estimate with this standard error (normal approximation)."""
    z = NormalDist().inv_cdf
    return (z(1 - alpha / 2) + z(power)) * standard_error


def verdict_word(low: float, high: float, higher: str, lower: str) -> str:
    """What an interval of a difference (first arm minus second) lets one say."""
    if low > 0:
        return f"{higher} higher"
    if high < 0:
        return f"{lower} higher"
    return "no difference at this size"


def paired_difference(groups_a: Sequence[Sequence[float]], groups_b: Sequence[Sequence[float]], *,
                      confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """Everything a report says about arm A minus arm B: the groups hold per-problem values,
    paired position by position (same seed, same problem)."""
    if len(groups_a) != len(groups_b) or any(len(a) != len(b) for a, b in zip(groups_a, groups_b)):
        raise ValueError("the two arms must have the same seeds and, per seed, the same problems")
    deltas = [np.asarray(a, dtype=float) - np.asarray(b, dtype=float) for a, b in zip(groups_a, groups_b)]
    replicates = bootstrap_replicates(deltas, resamples, seed)
    low, high = percentile_interval(replicates, confidence)
    standard_error = float(np.std(replicates, ddof=1))
    return {
        "a": hierarchical_mean(groups_a), "b": hierarchical_mean(groups_b), "delta": hierarchical_mean(deltas),
        "ci": [low, high], "confidence": confidence, "p_value": sign_flip_p_value(deltas, resamples, seed),
        "standard_error": standard_error, "detectable": detectable_difference(standard_error),
        "problems": int(sum(d.size for d in deltas)), "seeds": len(deltas), "resamples": resamples, "seed": seed,
        "identical": all(not d.any() for d in deltas),  # no spread: nothing for an interval or a test to say
    }


def seed_paired_difference(values_a: Sequence[float], values_b: Sequence[float], *,
                           confidence: float = CONFIDENCE) -> dict:
    """Arm A minus arm B on one number per seed (e.g. a training diagnostic's mean over the last
    steps), paired seed by seed: the mean difference, its Student-t interval over the seeds
    (n - 1 degrees of freedom: with 5 seeds a sign-flip test cannot go below p = 1/16, so the t
    interval is the test that can say something), and how many seeds share the mean's sign."""
    from scipy.stats import t as student_t

    a, b = np.asarray(values_a, dtype=float), np.asarray(values_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError("need the same seeds in both arms, at least two")
    deltas = a - b
    delta = float(deltas.mean())
    standard_error = float(deltas.std(ddof=1) / np.sqrt(deltas.size))
    half = float(student_t.ppf(0.5 + confidence / 2, deltas.size - 1)) * standard_error
    return {"a": float(a.mean()), "b": float(b.mean()), "delta": delta, "ci": [delta - half, delta + half],
            "confidence": confidence, "seeds": int(deltas.size), "standard_error": standard_error,
            "same_sign": int(np.sum(np.sign(deltas) == np.sign(delta))) if delta else 0}


def verdict_line(label_a: str, label_b: str, metric: str, result: dict) -> str:
    """One line in words: 'A - B pass@1 +0.047, 95% CI [-0.030, +0.120], p=0.31 (20 problems,
    2 seeds): no difference at this size (could detect 0.080)'."""
    low, high = result["ci"]
    per_seed = "" if result["seeds"] == 1 else f" over {result['seeds']} seeds"
    if result.get("identical"):  # every pair equal: a zero-width interval and "could detect 0.000" say nothing
        return (f"{label_a} - {label_b} {metric} {result['delta']:+.3f}: identical on every problem "
                f"({result['problems']} problem pairs{per_seed}); no spread to test a difference with")
    word = verdict_word(low, high, label_a, label_b)
    if word.startswith("no difference"):
        word += f" (could detect {result['detectable']:.3f})"
    return (f"{label_a} - {label_b} {metric} {result['delta']:+.3f}, {100 * result['confidence']:.0f}% CI "
            f"[{low:+.3f}, {high:+.3f}], p={result['p_value']:.2g} ({result['problems']} problem pairs{per_seed}): "
            f"{word}")
