"""Whether a program's output on one test input is right: EvalPlus's rules, and LiveCodeBench's.

EvalPlus (0.3.1, `evalplus.eval.unsafe_execute`) judges each input of a group (the base tests,
or the plus tests) in order, and this module follows its steps one by one, on outputs decoded
with their own types (code_values), so that every Python and numpy behaviour on the way is the
one EvalPlus meets:
1. `out == exp`;
2. per-task rules: on MBPP+, any output passes Mbpp/164 (`are_equivalent`), 0 also passes
   Mbpp/295 (`sum_div`), Mbpp/581 (`surface_Area`) and Mbpp/558 (`digit_distance_nums`) also
   accept the other reading of the task, eight tasks compare `set(out) == set(exp)`, and three
   whose reference returns a regex match object compare only "is not None" (a bool output is
   compared as it is); on HumanEval+, HumanEval/32 (`find_zero`) passes when
   |poly(xs, out)| <= atol;
3. a float expected value (`is_floats`) makes atol at least 1e-6, for this input and every later
   one of the group (EvalPlus changes its atol variable in place);
4. with atol 0 or an exact match, the (truth value of the) match decides; else the output must
   have the expected type (and length, for a list or tuple) and pass
   `np.allclose(out, exp, rtol=1e-7, atol=atol)`.
Any exception on the way fails the input (a numpy array compared with a list raises on its
truth value). NaN equals nothing, as in EvalPlus, where the expected value is never the very
object the solution returned.

One deliberate difference: EvalPlus 0.3.1 fails every HumanEval/32 solution, correct or not
(its `find_zero` branch skips the line that marks the input passed), a bug fixed upstream;
here HumanEval/32 is graded by the rule EvalPlus means.
"""

import math

# Task rules of EvalPlus's MBPP+ (evalplus/eval/_special_oracle.py), by entry point.
MBPP_SET_EQUAL = frozenset({
    "similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
    "intersection_array", "find_dissimilar", "Diff",
})  # fmt: skip
MBPP_NOT_NONE = frozenset({"check_str", "text_match_three", "text_starta_endb"})
MIN_FLOAT_ATOL = 1e-6  # EvalPlus compares float outputs with this tolerance when atol is 0
RTOL = 1e-7  # np.testing.assert_allclose's default, which EvalPlus passes to np.allclose


def is_floats(value) -> bool:
    """EvalPlus's test for a float output: a float, a non-empty list or tuple of floats, or a
    float32/float64 array."""
    if isinstance(value, float):
        return True
    if isinstance(value, (list, tuple)) and value:
        return all(isinstance(item, float) for item in value)
    if type(value).__module__ == "numpy":
        import numpy

        return isinstance(value, numpy.ndarray) and value.dtype in (numpy.float64, numpy.float32)
    return False


def pyramid_surface_area(base_edge, height):
    """Mbpp/581's other reading: `height` as the pyramid's height, not its slant height."""
    slant = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 4 * (base_edge * slant) / 2)


def digit_distance(a, b):
    """Mbpp/558's other reading: the shorter number padded with leading zeros."""
    first, second = str(a), str(b)
    width = max(len(first), len(second))
    return sum(abs(int(x) - int(y)) for x, y in zip(first.zfill(width), second.zfill(width)))


def poly(coefficients, x):
    """HumanEval/32's polynomial at x, evaluated as EvalPlus evaluates it (math.pow)."""
    return sum([coefficient * math.pow(x, i) for i, coefficient in enumerate(coefficients)])


class _Raises:
    """Stands for `set(out)` where computing it in the program raised."""


RAISED = _Raises()


def evalplus_input_ok(dataset: str, entry_point: str, args, out, exp, atol: float, out_set=None) -> tuple[bool, float]:
    """(whether out passes the input args, the group's atol from here on), by EvalPlus's steps.

    dataset: 'mbpp' or 'humaneval'; out_set: set(out) as the program computed it (an iterator
    can only be iterated there), RAISED where that raised; needed for the set-equal tasks."""
    try:
        exact = out == exp
        if dataset == "mbpp":
            if entry_point == "are_equivalent":
                exact = exact or True
            elif entry_point == "sum_div":
                exact = exact or out == 0
            elif entry_point == "surface_Area":
                exact = exact or abs(out - pyramid_surface_area(*args)) <= atol
            elif entry_point == "digit_distance_nums":
                exact = exact or out == digit_distance(*args)
            elif entry_point in MBPP_SET_EQUAL:
                if out_set is RAISED:
                    return False, atol
                exact = (set(out) if out_set is None else out_set) == set(exp)
            elif entry_point in MBPP_NOT_NONE:
                exact = out == exp if isinstance(out, bool) else exp == (out is not None)
        if dataset == "humaneval" and entry_point == "find_zero":
            return bool(abs(poly(*args, out)) <= atol), atol
        if atol == 0 and is_floats(exp):
            atol = MIN_FLOAT_ATOL
        if not exact and atol != 0:
            if type(out) is not type(exp):
                return False, atol
            if isinstance(exp, (list, tuple)) and len(out) != len(exp):
                return False, atol
            import numpy

            return bool(numpy.allclose(out, exp, rtol=RTOL, atol=atol)), atol
        return bool(exact), atol
    except Exception:  # noqa: BLE001  (EvalPlus fails the input on any exception here)
        return False, atol


def lines_match(out: str, exp: str) -> bool:
    """LiveCodeBench stdin/stdout problems: same lines once stripped, numbers equal within 1e-6."""
    got, want = out.strip().splitlines(), exp.strip().splitlines()
    if len(got) != len(want):
        return False
    for line_got, line_want in zip(got, want):
        tokens_got, tokens_want = line_got.split(), line_want.split()
        if tokens_got == tokens_want:
            continue
        if len(tokens_got) != len(tokens_want):
            return False
        try:
            if any(abs(float(a) - float(b)) > 1e-6 for a, b in zip(tokens_got, tokens_want)):
                return False
        except ValueError:
            return False
    return True


def as_json_lists(value):
    """LiveCodeBench's functional answers compare as JSON: tuples are lists."""
    if isinstance(value, (list, tuple)):
        return [as_json_lists(item) for item in value]
    return value
