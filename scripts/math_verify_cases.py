"""Where meds's math grader disagrees with Math-Verify's own test cases (docs/grading.md).

Math-Verify's test files (github.com/huggingface/Math-Verify, tests/) hold (gold, prediction,
expected) cases in `pytest.mark.parametrize` lists. This script reads them with `ast` (it runs
none of Math-Verify's tests, only its public `parse` to read answers out of prose), hands each
pair of answer strings (prediction_text, gold_text) to meds's grader
(benchmarks.math_grading.MathGrader, strict as for rewards) and prints every case where the
grader's verdict differs from the expected one: the file, the test, the test's options, the
grader's reason, and whether meds's own reading of the prediction (the last \\boxed{}) finds an
answer at all ('unboxed': it does not; meds reads only boxed answers).

Usage: python scripts/math_verify_cases.py PATH/TO/Math-Verify [--lenient] [--all]
"""

import argparse
import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.answer_extraction import extract_answer  # noqa: E402
from benchmarks.math_grading import MathGrader  # noqa: E402

NAMES = {"expected": "expected", "result": "expected"}  # test_yujianll calls it `result`


def parametrized_cases(path: Path):
    """(test name, dict of argument -> literal value) for every literal case of every
    parametrized test in a file; cases that are not literals (pytest.param(...)) are skipped."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "parametrize"):
                continue
            names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
            for row in decorator.args[1].elts:
                try:
                    values = ast.literal_eval(row)
                except ValueError:
                    continue
                yield node.name, {NAMES.get(k, k): v for k, v in zip(names, values)}


MATH_SPAN = re.compile(r"^\s*(?:\$\$(.*)\$\$|\$(.*)\$|\\\((.*)\\\)|\\\[(.*)\\\])\s*$", re.S)


def _math_verify_reading(text: str) -> str | None:
    """What Math-Verify's readers extract from a text (its LaTeX then expression configs, as its
    tests configure them), or None when they find nothing."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    found = parse(text, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])
    return found[1] if len(found) > 1 else None


def _span_inside(text: str) -> str | None:
    span = MATH_SPAN.match(text)
    return next(group for group in span.groups() if group is not None).strip() if span else None


def prediction_text(text: str) -> str | None:
    """The answer meds's grader is given for a Math-Verify test prediction: meds's own reading
    (the last \\boxed{}), else the inside of a text that is one math span ($...$, \\(...\\)),
    else what Math-Verify extracts from the prose (meds itself would find no answer there: the
    report marks such cases 'unboxed')."""
    return extract_answer(text, "boxed") or _span_inside(text) or _math_verify_reading(text)


def gold_text(text: str) -> str:
    """A test's gold answer as a dataset would give it: the inside of one math span, else what
    Math-Verify extracts (several boxes, prose), else the text."""
    inside = _span_inside(text)
    if inside is not None and "\\boxed" not in inside:
        return inside
    return _math_verify_reading(text) or text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--lenient", action="store_true", help="the grader without its strict number rule")
    parser.add_argument("--all", action="store_true", help="print agreeing cases too")
    args = parser.parse_args()
    cases = []
    for path in sorted((args.repo / "tests").glob("test_*.py")):
        for test, case in parametrized_cases(path):
            if {"gold", "pred", "expected"} <= case.keys():
                cases.append((path.name, test, case))
    pairs = [(prediction_text(c["pred"]), gold_text(c["gold"])) for _, _, c in cases]
    grader = MathGrader(strict=not args.lenient)
    verdicts = grader.grade_many(pairs)
    disagree = 0
    for (file, test, case), (pred, gold), verdict in zip(cases, pairs, verdicts):
        same = verdict.correct == bool(case["expected"])
        disagree += not same
        if same and not args.all:
            continue
        boxed = "boxed" if extract_answer(case["pred"], "boxed") else "unboxed"
        options = {k: v for k, v in case.items() if k not in ("gold", "pred", "expected")}
        print(f"{'ok ' if same else 'DIFF'} {file}::{test} {options or ''} expected={int(bool(case['expected']))} "
              f"meds={int(verdict.correct)} ({verdict.outcome} {verdict.detail.get('by', '')} "
              f"{verdict.detail.get('reason', '')}) [{boxed}]\n     gold {case['gold']!r} -> {gold!r}\n"
              f"     pred {case['pred']!r} -> {pred!r}")
    print(f"{len(cases)} cases, {disagree} disagreements")


if __name__ == "__main__":
    main()
