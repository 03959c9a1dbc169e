"""benchmarks/paired_stats.py against hand-computed values and against scipy.stats."""

import numpy as np
import pytest

from benchmarks import paired_stats as ps

scipy_stats = pytest.importorskip("scipy.stats")


def test_per_problem_pass_at_k_by_hand_and_k_close_to_n():
    # n=4, k=2: c=1 -> 1 - C(3,2)/C(4,2) = 1 - 3/6; c=0 -> 0; c=4 -> 1; c=3 -> n-c=1 < k -> 1
    assert ps.per_problem_pass_at_k([(4, 1), (4, 0), (4, 4), (4, 3)], 2) == pytest.approx([0.5, 0.0, 1.0, 1.0])
    # k = n: solved at all or not
    assert ps.per_problem_pass_at_k([(4, 1), (4, 0)], 4) == pytest.approx([1.0, 0.0])
    # k = 1 is the share of correct samples
    assert ps.per_problem_pass_at_k([(8, 3)], 1) == pytest.approx([3 / 8])


def test_hierarchical_mean_weighs_seeds_equally():
    assert ps.hierarchical_mean([[1, 0], [1, 1, 1, 0]]) == pytest.approx((0.5 + 0.75) / 2)
    with pytest.raises(ValueError):
        ps.hierarchical_mean([[1.0], []])


def test_bootstrap_of_constant_groups_resamples_the_seeds():
    # Within a group nothing varies, so a replicate is the mean of two group draws from {1, 0}:
    # 0, 0.5 and 1 with probabilities 1/4, 1/2, 1/4.
    replicates = ps.bootstrap_replicates([[1, 1, 1], [0, 0, 0]], resamples=20_000, seed=3)
    for value, share in ((0.0, 0.25), (0.5, 0.5), (1.0, 0.25)):
        assert np.mean(np.isclose(replicates, value)) == pytest.approx(share, abs=0.015)


def test_hierarchical_bootstrap_variance_by_hand():
    # Groups [0, 1] and [2, 3]: a slot picks a group (means 0.5 or 2.5: variance 1) and then
    # resamples its two values (variance 0.25 / 2): 1.125; the replicate averages two slots: 0.5625.
    replicates = ps.bootstrap_replicates([[0, 1], [2, 3]], resamples=40_000, seed=1)
    assert np.var(replicates) == pytest.approx(0.5625, rel=0.03)
    assert np.mean(replicates) == pytest.approx(1.5, abs=0.01)


def test_one_group_interval_agrees_with_scipy_bootstrap():
    values = np.random.default_rng(0).binomial(1, 0.4, size=40).astype(float)
    mine = ps.mean_interval([values], resamples=20_000, seed=0)
    theirs = scipy_stats.bootstrap((values,), np.mean, confidence_level=0.95, n_resamples=20_000,
                                   method="percentile", random_state=np.random.default_rng(1)).confidence_interval
    assert mine[0] == pytest.approx(theirs.low, abs=0.015)
    assert mine[1] == pytest.approx(theirs.high, abs=0.015)


def test_bootstrap_is_reproducible_from_its_seed():
    groups = [[0.1, 0.5, 0.9], [0.2, 0.3]]
    assert np.array_equal(ps.bootstrap_replicates(groups, 500, seed=7), ps.bootstrap_replicates(groups, 500, seed=7))
    other = ps.bootstrap_replicates(groups, 500, seed=8)
    assert not np.array_equal(ps.bootstrap_replicates(groups, 500, seed=7), other)


def test_sign_flip_exact_by_hand():
    # d = 1, 2, 3: the 8 signed sums are +-6, +-4, +-2, 0, 0; |sum| >= 6 in 2 of 8; zeros change nothing.
    assert ps.sign_flip_p_value([[1, 2, 3]]) == pytest.approx(0.25)
    assert ps.sign_flip_p_value([[1, 2, 3, 0, 0]]) == pytest.approx(0.25)
    assert ps.sign_flip_p_value([[0, 0]]) == 1.0


def test_sign_flip_agrees_with_scipy_permutation_test():
    rng = np.random.default_rng(2)
    small = rng.normal(0.3, 1.0, size=10)  # exact on both sides
    theirs = scipy_stats.permutation_test((small,), np.mean, permutation_type="samples", n_resamples=np.inf,
                                          alternative="two-sided").pvalue
    assert ps.sign_flip_p_value([small]) == pytest.approx(theirs, abs=1e-9)
    large = rng.normal(0.25, 1.0, size=60)  # sampled on both sides
    theirs = scipy_stats.permutation_test((large,), np.mean, permutation_type="samples", n_resamples=40_000,
                                          alternative="two-sided", random_state=np.random.default_rng(0)).pvalue
    assert ps.sign_flip_p_value([large], resamples=40_000, seed=0) == pytest.approx(theirs, abs=0.01)


def test_sign_flip_weighs_seeds_like_the_statistic():
    # Groups [4] and [1, 1]: the statistic is (±4 + (±1 ±1)/2) / 2; |.| >= 2.5 (observed) for
    # signs (+,+,+) and (-,-,-) only: 2 of 8.
    assert ps.sign_flip_p_value([[4], [1, 1]]) == pytest.approx(0.25)


def test_detectable_difference_by_hand():
    # z_0.975 = 1.959964, z_0.8 = 0.841621
    assert ps.detectable_difference(0.1) == pytest.approx(0.2801585, rel=1e-5)


def test_paired_difference_and_verdicts():
    a = [[1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0]]
    b = [[0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0]]
    result = ps.paired_difference(a, b, resamples=2000, seed=0)
    assert result["delta"] == pytest.approx(7 / 8)
    assert result["a"] == pytest.approx(7.5 / 8) and result["b"] == pytest.approx(0.5 / 8)
    assert result["ci"][0] > 0 and result["problems"] == 8 and result["seeds"] == 1
    assert result["p_value"] == pytest.approx(2 / 2 ** 7)  # 7 non-zero differences, all positive
    line = ps.verdict_line("MEDS", "DAPO", "pass@1", result)
    assert line.startswith("MEDS - DAPO pass@1 +0.875, 95% CI [") and line.endswith(": MEDS higher")
    flat = ps.paired_difference([[1.0, 0.0, 1.0, 0.0]], [[0.0, 1.0, 0.0, 1.0]], resamples=2000, seed=0)
    assert flat["delta"] == 0.0
    assert "no difference at this size (could detect" in ps.verdict_line("A", "B", "pass@1", flat)
    assert ps.verdict_word(-0.2, -0.1, "A", "B") == "B higher"
    # no spread at all (every pair equal): said so, not "95% CI [+0.000, +0.000] ... could detect 0.000"
    same = ps.paired_difference([[1.0, 0.0, 0.5], [1.0, 1.0, 0.0]], [[1.0, 0.0, 0.5], [1.0, 1.0, 0.0]],
                                resamples=200, seed=0)
    line = ps.verdict_line("A", "B", "pass@1", same)
    assert line == ("A - B pass@1 +0.000: identical on every problem (6 problem pairs over 2 seeds); no spread to "
                    "test a difference with")
    assert not flat["identical"] and same["identical"]
    with pytest.raises(ValueError):
        ps.paired_difference([[1.0]], [[1.0, 0.0]])


def test_seed_paired_difference_by_hand():
    # deltas [1, 2, 3]: mean 2, sd 1, se 1/sqrt(3); t(0.975, 2 df) = 4.302653 -> half-width 2.484138
    result = ps.seed_paired_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert result["delta"] == pytest.approx(2.0)
    assert result["ci"] == pytest.approx([-0.484138, 4.484138], abs=1e-6)
    assert result["same_sign"] == 3 and result["seeds"] == 3
    # deltas [.2, .4, .3, .5, .1]: mean .3, sd sqrt(.025), se .0707107; t(0.975, 4 df) = 2.776445
    result = ps.seed_paired_difference([0.5, 0.7, 0.6, 0.8, 0.4], [0.3] * 5)
    assert result["ci"] == pytest.approx([0.103676, 0.496324], abs=1e-6)
    assert ps.verdict_word(*result["ci"], "a", "b") == "a higher"


def test_seed_paired_difference_needs_paired_seeds():
    with pytest.raises(ValueError):
        ps.seed_paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        ps.seed_paired_difference([1.0], [2.0])
