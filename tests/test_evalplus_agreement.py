"""The grader against the `evalplus` package (0.3.1) itself: seeded candidates, identical base and
plus verdicts. Skips without the package (`pip install -e '.[evalplus]'`) or ../shared/data."""

from pathlib import Path

import pytest

from benchmarks import code_benchmarks as cb
from benchmarks import code_loaders
from benchmarks.code_expected import expected_for
from benchmarks.code_rows import read_json_lines
from benchmarks.evalplus_agreement import (
    VARIANTS,
    Candidate,
    _wrapped,
    agreement,
    evalplus_verdicts,
    project_verdict,
    seeded_candidates,
)  # fmt: skip

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "mbppplus").is_dir(), reason="needs ../shared/data")
LOADERS = {"humanevalplus": code_loaders.load_humanevalplus, "mbppplus": code_loaders.load_mbppplus}


def release_rows(name: str) -> dict[str, dict]:
    found = read_json_lines([DATA / code_loaders._FILES[name]], name)
    return {row["task_id"]: row for _, row in found.rows}


def both_verdicts(name: str, problems, candidates):
    by_id = {p.id: p for p in problems}
    ours = cb.grade([(by_id[c.problem_id], f"```python\n{c.solution}\n```") for c in candidates])
    theirs = evalplus_verdicts(problems, release_rows(name), candidates)
    return [project_verdict(v) for v in ours], theirs


def fixed_candidates(problems, variants) -> list[Candidate]:
    return [Candidate(p.id, kind,
                      _wrapped(p.answer["canonical_solution"], p.answer["entry_point"], VARIANTS[kind], None))
            for p in problems for kind in variants]  # fmt: skip


@pytest.fixture(scope="module")
def evalplus():
    return pytest.importorskip("evalplus.eval")


# EvalPlus's per-task rules, float tolerances, types and time limits: where the grader disagreed
# with EvalPlus before. (task, variants) per benchmark.
FAST_CASES = {
    "mbppplus": {"Mbpp/2": ["canonical", "tuple", "iterator", "numpy", "none"], "Mbpp/581": ["canonical", "off_by_one"],
                 "Mbpp/737": ["canonical", "none"], "Mbpp/124": ["float_noise_within", "numpy_noisy_float"],
                 "Mbpp/3": ["too_slow_on_one_input"]},
    "humanevalplus": {"HumanEval/4": ["canonical", "float_noise_within", "float_noise_beyond", "numpy_noisy_float",
                                      "numpy"], "HumanEval/32": ["canonical"]},
}  # fmt: skip


@pytest.mark.parametrize("name", ["mbppplus", "humanevalplus"])
def test_rules_types_and_time_limits_agree_with_evalplus(evalplus, name):
    cases = FAST_CASES[name]
    problems = [p for p in LOADERS[name](DATA) if p.id in cases]
    candidates = [c for p in problems for c in fixed_candidates([p], cases[p.id])]
    ours, theirs = both_verdicts(name, problems, candidates)
    result = agreement(candidates, ours, theirs)
    assert result["disagreements"] == [] and result["compared"] > 0
    if name == "humanevalplus":
        # EvalPlus 0.3.1's HumanEval/32 bug: the canonical solution fails there, passes here.
        canonical = next(i for i, c in enumerate(candidates)
                         if c.problem_id == "HumanEval/32" and c.variant == "canonical")
        assert theirs[canonical] == {"base": "fail", "plus": "fail"}
        assert ours[canonical] == {"base": "pass", "plus": "pass"}


@pytest.mark.slow
@pytest.mark.parametrize("name, count", [("humanevalplus", 20), ("mbppplus", 30)])
def test_seeded_candidates_agree_with_evalplus(evalplus, name, count):
    """`count` problems drawn with a fixed seed, eight candidates each; problems whose canonical
    solution takes over 0.3 s on an input are left out (their time limits sit near the slow
    variants' sleeps, where timing noise would decide)."""
    import random

    problems = random.Random(17).sample(LOADERS[name](DATA), count)
    cb.ensure_expected(problems)
    problems = [p for p in problems if max(expected_for(p).seconds, default=0.0) < 0.3]
    candidates = seeded_candidates(problems, per_problem=8, seed=17)
    ours, theirs = both_verdicts(name, problems, candidates)
    result = agreement(candidates, ours, theirs)
    assert result["disagreements"] == [], result["disagreements"]
    assert result["compared"] >= 6 * len(problems)
