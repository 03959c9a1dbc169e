"""pass@k against hand computations and an exact enumeration of k-subsets; maj@k rules."""

import itertools
import math

import pytest

from benchmarks.passk import ks_to_report, maj_at_k, mean_maj_at_k, mean_pass_at_k, pass_at_k


def enumerated_pass_at_k(n: int, c: int, k: int) -> float:
    """The definition itself: the share of k-subsets of the n samples holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_hand_computed_values():
    # n=5, c=2, k=2: C(3,2)/C(5,2) = 3/10, so pass@2 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # n=4, c=1, k=1: pass@1 is c/n = 1/4
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n=10, c=3, k=5: C(7,5)/C(10,5) = 21/252 = 1/12, so pass@5 = 11/12
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12)


def test_matches_exact_enumeration_for_small_n():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(enumerated_pass_at_k(n, c, k), abs=1e-12)


def test_edges():
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    # k = n: any correct sample makes the single n-subset pass.
    assert pass_at_k(8, 1, 8) == 1.0
    # n - c < k: every k-subset contains a correct sample.
    assert pass_at_k(8, 5, 4) == 1.0


def test_stable_for_large_n():
    # n=1024, c=1, k=512: 1 - C(1023,512)/C(1024,512) = 1 - 512/1024 = 0.5 (binomials ~1e306).
    assert pass_at_k(1024, 1, 512) == pytest.approx(0.5)
    assert pass_at_k(4096, 7, 100) == pytest.approx(1 - math.comb(4089, 100) / math.comb(4096, 100))


@pytest.mark.parametrize("n,c,k", [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1)])
def test_invalid_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_non_int_rejected():
    with pytest.raises(TypeError):
        pass_at_k(4.0, 1, 1)


def test_ks_to_report():
    assert ks_to_report(1) == [1]
    assert ks_to_report(8) == [1, 2, 4, 8]
    assert ks_to_report(10) == [1, 2, 4, 8, 10]
    assert ks_to_report(128)[-1] == 128 and len(ks_to_report(128)) == 8


def test_mean_pass_at_k():
    # Problem A: n=4, c=2 -> pass@1 = 0.5, pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6,
    # pass@4 = 1. Problem B: c=0 -> 0 everywhere. Means: 0.25, 5/12, 0.5.
    table = mean_pass_at_k([(4, 2), (4, 0)])
    assert table == pytest.approx({1: 0.25, 2: 5 / 12, 4: 0.5})


def test_maj_at_k_majority():
    answers = ["5", "7", "7", "5", "7"]
    correct = [True, False, False, True, False]
    # first 1: "5" wins -> correct; first 4: 2-2 tie, "5" came first -> correct; all 5: "7" wins.
    assert maj_at_k(answers, correct, 1) == 1
    assert maj_at_k(answers, correct, 4) == 1
    assert maj_at_k(answers, correct, 5) == 0


def test_maj_at_k_tie_goes_to_earliest():
    answers = ["7", "5", "5", "7"]
    correct = [False, True, True, False]
    assert maj_at_k(answers, correct, 4) == 0  # tie 2-2, "7" appeared first


def test_maj_at_k_none_never_wins():
    answers = [None, None, None, "3"]
    correct = [False, False, False, True]
    assert maj_at_k(answers, correct, 4) == 1
    assert maj_at_k(answers, correct, 3) == 0  # nothing but None


def test_maj_at_k_key_groups_equivalent_answers():
    answers = ["7", "0.5", "\\frac{1}{2}"]
    correct = [False, True, True]
    # Without a key: a 1-1-1 tie, "7" came first -> wrong.
    assert maj_at_k(answers, correct, 3) == 0
    # With a key merging 0.5 and 1/2: that group has 2 votes -> correct.
    half = {"0.5": "1/2", "\\frac{1}{2}": "1/2"}
    assert maj_at_k(answers, correct, 3, key=lambda a: half.get(a, a)) == 1


def test_maj_at_k_validation():
    with pytest.raises(ValueError):
        maj_at_k(["1"], [True, False], 1)
    with pytest.raises(ValueError):
        maj_at_k(["1", "2"], [True, False], 3)


def test_mean_maj_at_k():
    # Problem A: answers 1,2,2 with 2 correct: maj@1 = 0 (1 wrong), maj@2 = 0 (tie, "1" first),
    # maj@3 = 1. Problem B: all None -> 0. ks for n=3: 1, 2, 3. Means: 0, 0, 0.5.
    table = mean_maj_at_k([(["1", "2", "2"], [False, True, True]), ([None] * 3, [False] * 3)])
    assert table == {1: 0.0, 2: 0.0, 3: 0.5}
