"""EvalPlus's comparison of one output, step by step; the expected values are worked out by hand
from EvalPlus 0.3.1's rules (and, where the package is installed, checked against its helpers)."""

import math

import numpy as np
import pytest

from benchmarks.code_compare import (
    MBPP_NOT_NONE,
    MBPP_SET_EQUAL,
    RAISED,
    as_json_lists,
    digit_distance,
    evalplus_input_ok,
    is_floats,
    lines_match,
    poly,
    pyramid_surface_area,
)  # fmt: skip
from benchmarks.code_values import Opaque


def ok(out, exp, atol=0.0, dataset="humaneval", entry_point="f", args=(), out_set=None):
    return evalplus_input_ok(dataset, entry_point, list(args), out, exp, atol, out_set)[0]


@pytest.mark.parametrize(
    "out, exp, atol, passes",
    [
        (3, 3, 0, True),
        (True, 1, 0, True),  # == as in EvalPlus
        (3.0, 3, 0, True),
        ([1, 2], (1, 2), 0, False),
        (0.1 + 0.2, 0.3, 0, True),  # a float expected: atol 1e-6
        (0.3001, 0.3, 0, False),
        (0.3001, 0.3, 1e-3, True),
        ([1.0, 2.0000001], [1.0, 2.0], 0, True),
        ((1.0, 2.0000001), [1.0, 2.0], 0, False),  # the approximate match needs the same type
        ([1.0], [1.0, 2.0], 1e-3, False),
        (3.00001, 3, 1e-4, False),  # an int expected: a float is not of its type
        (float("nan"), float("nan"), 0, False),  # NaN equals nothing
        ([float("nan")], [float("nan")], 0, False),
        ("a", 1.0, 0, False),
        (np.array([1, 2]), [1, 2], 0, False),  # the truth value of an array is ambiguous
        (np.array([5]), [5], 0, True),  # ... except for one item
        (np.float64(0.3), 0.3, 0, True),  # equal: exact
        (np.float64(0.1) + np.float64(0.2), 0.3, 0, False),  # approximate needs type float
        (np.int64(7), 7, 0, True),
        (Opaque("digest", "ab"), Opaque("digest", "ab"), 0, True),
        (Opaque("digest", "ab"), Opaque("digest", "cd"), 0, False),
    ],
)
def test_plain_comparison(out, exp, atol, passes):
    assert ok(out, exp, atol) is passes


def test_a_float_expected_value_makes_the_tolerance_stick_for_the_rest_of_the_group():
    # EvalPlus sets atol = 1e-6 in place: a later int within rtol 1e-7 then passes too.
    passed, atol = evalplus_input_ok("humaneval", "f", [], 0.5, 0.5, 0.0)
    assert passed and atol == 1e-6
    assert evalplus_input_ok("humaneval", "f", [], 1_000_000_001, 1_000_000_000, atol)[0]
    assert not evalplus_input_ok("humaneval", "f", [], 1_000_000_001, 1_000_000_000, 0.0)[0]


def test_set_equal_tasks():
    assert ok((5, 4), (4, 5), dataset="mbpp", entry_point="similar_elements")
    assert ok([4, 5, 5], (4, 5), dataset="mbpp", entry_point="similar_elements")
    assert not ok((4,), (4, 5), dataset="mbpp", entry_point="similar_elements")
    # An iterator: the program computed set(out) where it could iterate it.
    assert ok(Opaque("list_iterator", "<...>"), (4, 5), dataset="mbpp", entry_point="similar_elements", out_set={4, 5})
    assert not ok([4, 5], (4, 5), dataset="mbpp", entry_point="similar_elements", out_set=RAISED)
    assert not ok((5, 4), (4, 5), dataset="humaneval", entry_point="similar_elements")  # MBPP+ only


def test_match_object_tasks_compare_only_not_none():
    match = Opaque("Match", "<re.Match object; span=(0, 1), match='a'>")
    for out, exp, passes in [(match, True, True), (None, True, False), (None, False, True), (True, True, True),
                             (False, True, False), (match, False, False)]:  # fmt: skip
        assert ok(out, exp, dataset="mbpp", entry_point="text_match_three") is passes


def test_tasks_with_two_readings():
    # Mbpp/581 surface_Area(3, 4): slant height 4 gives 9 + 24 = 33 (the reference); height 4
    # gives slant sqrt(1.5**2 + 16) and 9 + 2 * 3 * 4.27200187 = 34.632, rounded 35.
    assert pyramid_surface_area(3, 4) == 35
    assert ok(35, 33, dataset="mbpp", entry_point="surface_Area", args=(3, 4))
    assert not ok(34, 33, dataset="mbpp", entry_point="surface_Area", args=(3, 4))
    # Mbpp/558 digit_distance_nums(123, 45): padded to 045: 1 + 2 + 2 = 5.
    assert digit_distance(123, 45) == 5
    assert ok(5, 4, dataset="mbpp", entry_point="digit_distance_nums", args=(123, 45))
    assert not ok(6, 4, dataset="mbpp", entry_point="digit_distance_nums", args=(123, 45))


def test_find_zero_accepts_any_root_within_atol():
    assert poly([-1, 0, 1], 1.0) == 0.0 and poly([-1, 0, 1], 0.5) == -0.75
    for out, passes in [(1.0, True), (-1.0, True), (1.00001, True), (0.5, False), ("1", False), (None, False)]:
        assert ok(out, 123.0, atol=1e-4, entry_point="find_zero", args=([-1, 0, 1],)) is passes


def test_is_floats():
    assert is_floats(1.5) and is_floats([1.0, 2.0]) and is_floats((1.0,)) and is_floats(np.float64(1))
    assert is_floats(np.array([1.0])) and is_floats(np.array([1.0], dtype=np.float32))
    assert not is_floats([]) and not is_floats([1.0, 2]) and not is_floats(np.array([1])) and not is_floats(1)
    assert not is_floats(np.float32(1.0))  # not a float subclass, and not an array


def test_stdout_lines_compare_stripped_with_number_tolerance():
    assert lines_match("1 2\n3\n\n", "1 2\n3")
    assert lines_match("0.3333333\n", "0.33333333\n")
    assert not lines_match("1 2\n", "1 3\n")
    assert not lines_match("1\n", "1\n2\n")
    assert as_json_lists((1, [2, (3,)])) == [1, [2, [3]]]


def test_rules_match_the_evalplus_package():
    oracle = pytest.importorskip("evalplus.eval._special_oracle")
    assert MBPP_SET_EQUAL == set(oracle.MBPP_OUTPUT_SET_EQ_TASKS)
    assert MBPP_NOT_NONE == set(oracle.MBPP_OUTPUT_NOT_NONE_TASKS)
    for base in range(1, 30):
        for height in range(0, 30, 3):
            assert pyramid_surface_area(base, height) == oracle._surface_Area(base, height)
    for a, b in [(123, 45), (0, 0), (9, 12345), (1000, 1)]:
        assert digit_distance(a, b) == oracle._digit_distance_nums(a, b)
    for xs, x in [([1, 2, 3], 0.5), ([-6, 11, -6, 1], 2.0), ([0.5, 0.25], -3.0)]:
        assert math.isclose(poly(xs, x), oracle._poly(xs, x), rel_tol=0, abs_tol=0)
