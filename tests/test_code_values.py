"""The wire format of values between the sandboxed harness and the grader: types kept, digests
of big outputs equal exactly when == holds."""

import json
import math

import numpy as np
import pytest

from benchmarks.code_values import Opaque, Unequal, decode_value, digest, encode_value, equality_form


def round_trip(value):
    return decode_value(json.loads(json.dumps(encode_value(value))))


@pytest.mark.parametrize(
    "value",
    [
        None, True, 3, -2.5, "text", [1, [2, 3]], (1, (2, "a")), {1: "a", (2, 3): [4]},
        {1, 2}, frozenset({"x"}), 1 + 2j, b"\x00\xff", 7**5000, -(7**5000), [float("inf")],
    ],
)  # fmt: skip
def test_codec_round_trips_through_json(value):
    decoded = round_trip(value)
    assert decoded == value and type(decoded) is type(value)


@pytest.mark.parametrize("value", [np.float64(0.5), np.int64(-3), np.bool_(True), np.float32(1.5), np.str_("ab")])
def test_numpy_scalars_keep_their_dtype(value):
    decoded = round_trip(value)
    assert type(decoded) is type(value) and decoded == value


@pytest.mark.parametrize("array", [np.array([1, 2, 3]), np.array([[1.5, 2.0], [3.0, 4.0]], dtype=np.float32),
                                   np.array(["a", "bc"]), np.array([], dtype=np.int64),
                                   np.array([[1, 2], 3], dtype=object)])
def test_numpy_arrays_keep_dtype_and_shape(array):
    decoded = round_trip(array)
    assert isinstance(decoded, np.ndarray) and decoded.dtype == array.dtype and decoded.shape == array.shape
    assert [str(x) for x in decoded.ravel()] == [str(x) for x in array.ravel()]


def test_nan_and_unknown_types():
    assert math.isnan(round_trip(float("nan")))
    assert round_trip(range(3)) == Opaque("range", "range(0, 3)")
    assert round_trip(np.datetime64("2024-01-01")).type_name == "datetime64"  # a dtype the codec keeps as repr


def test_equality_form_is_shared_exactly_when_values_are_equal():
    same = [(1, 1.0), (True, 1), ([1, 2.0], [1.0, 2]), ({1, 2}, frozenset({2, 1})),
            ({"a": 1, "b": 2}, {"b": 2, "a": 1}), (np.int64(3), 3), (2 + 0j, 2), (b"ab", bytearray(b"ab"))]  # fmt: skip
    for a, b in same:
        assert a == b and equality_form(a) == equality_form(b)
    different = [([1, 2], (1, 2)), (1, "1"), (0.5, 1), ([[1]], [1]), (9007199254740993, 9007199254740992.0)]
    for a, b in different:
        assert a != b and equality_form(a) != equality_form(b)


def test_values_without_an_equality_form_have_no_digest():
    for value in (float("nan"), [1, float("nan")], np.array([1, 2]), [object()]):
        assert equality_form(value) is None and digest(value) is None
    assert decode_value({"$": "digest", "v": None}) != decode_value({"$": "digest", "v": None})
    assert isinstance(decode_value({"$": "digest", "v": None}), Unequal)
    assert decode_value({"$": "digest", "v": "ab"}) == Opaque("digest", "ab")
    assert digest(list(range(5))) == digest([float(i) for i in range(5)]) != digest(tuple(range(5)))
