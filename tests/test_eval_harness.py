"""The eval harness without a model: seeds, the samples file, scoring by hand, resume, settings.

A fake backend stands in for generation (its answers are a function of the request's seed), so
these tests pin down what the harness does around generation in milliseconds.
"""

import json
import random
from pathlib import Path

import pytest

from benchmarks.generation import Generated, Request
from benchmarks.harness import (
    SAMPLES_FILE,
    EvalSettings,
    SampleStore,
    average_scores,
    check_state,
    evaluate,
    problem_seed,
    score_benchmark,
)
from benchmarks.math_benchmarks import grade_math
from benchmarks.passk import pass_at_k
from benchmarks.prompts import code_prompt_text, problem_prompt
from benchmarks.registry import Benchmark
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem, Verdict
from meds_cli.engine.rollout.engines import resolve_backend


def exact_grade(pairs):
    """A grader needing no workers: the response must be exactly '\\boxed{gold}'."""
    out = []
    for problem, response in pairs:
        extracted = response[len("\\boxed{"):-1] if response.startswith("\\boxed{") else None
        ok = extracted == problem.answer
        out.append(Verdict(ok, extracted, "correct" if ok else ("wrong" if extracted else "no_answer")))
    return out


def toy_suite(count=5, name="toy"):
    problems = [Problem(f"{name}/{i}", f"what is {i} mod 3", str(i % 3)) for i in range(count)]
    benchmark = Benchmark(name, "toy", "math", lambda data_dir, limit: problems[:limit], exact_grade)
    return benchmark, problems


class FakeBackend:
    """Answers \\boxed{0..3} drawn from the request's own seed; records every request."""

    name = "fake"
    tokenizer = None

    def call_sizes(self, requests):
        return [1] * len(requests)

    def __init__(self):
        self.requests: list[Request] = []

    def generate(self, requests):
        out = []
        for request in requests:
            self.requests.append(request)
            rng = random.Random(request.seed)
            texts = [f"\\boxed{{{rng.randint(0, 3)}}}" if rng.random() < 0.9 else "no idea" for _ in range(request.n)]
            out.append(Generated(texts, [len(t) for t in texts], [t == "no idea" for t in texts]))
        return out


def settings(**kw):
    base = dict(benchmarks=["toy"], k=4, temperature=1.0, top_p=1.0, max_new_tokens=8, model="fake", backend="fake")
    return EvalSettings(**{**base, **kw})


def run(folder, suites, **kw):
    backend = FakeBackend()
    limit = kw.get("limit")
    limited = [(b, p[:limit] if limit else p) for b, p in suites]
    outcome = evaluate(backend, settings(**kw), folder, suites=limited)
    return backend, outcome


def read_samples(folder):
    return [json.loads(line) for line in (Path(folder) / SAMPLES_FILE).read_text().splitlines()]


# ---------------------------------------------------------------- seeds and prompts


def test_problem_seed_is_stable_and_distinct():
    assert problem_seed(0, "math500", "a", 0) == problem_seed(0, "math500", "a", 0)
    seeds = {problem_seed(s, b, p, f) for s in (0, 1) for b in ("x", "y") for p in ("a", "b") for f in (0, 4)}
    assert len(seeds) == 16
    assert all(0 <= s < 2**63 for s in seeds)


def test_prompts_math_boxed_and_code():
    math_bench, problems = toy_suite(1)
    assert problem_prompt(math_bench.kind, problems[0], None, "boxed").endswith("within \\boxed{}.")
    code = Problem("HumanEval/0", "def f(x):\n    \"\"\"doc\"\"\"\n", {"completes_prompt": True})
    text = code_prompt_text(code)
    assert "```python\ndef f(x):" in text and "\\boxed" not in text
    mbpp = Problem("Mbpp/2", "Write a function.", {"completes_prompt": False})
    assert code_prompt_text(mbpp).startswith("Write a function.") and "```python" in code_prompt_text(mbpp)


# ---------------------------------------------------------------- scoring by hand


def rows(correct, extracted, lengths=None, truncated=None, outcome=None):
    n = len(correct)
    return [{"correct": c, "extracted": e, "length": (lengths or [10] * n)[i],
             "truncated": (truncated or [False] * n)[i],
             "outcome": (outcome or ["correct" if c else "wrong" for c in correct])[i]}
            for i, (c, e) in enumerate(zip(correct, extracted))]


def test_score_benchmark_by_hand():
    # problem A: 1 of 4 correct; problem B: 2 of 4 correct, but the majority answer (7) is wrong.
    a = rows([True, False, False, False], ["1", "2", "3", None], lengths=[4, 8, 12, 16],
             truncated=[False, False, False, True])
    b = rows([False, True, True, False], ["7", "5", "5", "7"], outcome=["timeout", "correct", "correct", "wrong"])
    scores = score_benchmark("math", [a, b], [1, 2, 4])
    # pass@1 = mean(1/4, 2/4); pass@2: A = 1 - C(3,2)/C(4,2) = 1/2, B = 1 - C(2,2)/C(4,2) = 5/6
    assert scores["pass@k"]["1"] == pytest.approx((0.25 + 0.5) / 2)
    assert scores["pass@k"]["2"] == pytest.approx((0.5 + 5 / 6) / 2)
    assert scores["pass@k"]["4"] == pytest.approx(1.0)
    # maj@1: A's first answer "1" is right, B's "7" wrong; maj@2: A ties 1 vs 2 -> the earlier (right),
    # B ties 7 vs 5 -> 7 (wrong); maj@4: A has 1,2,3 once each -> "1" (right), B 7 vs 5 two each -> 7.
    assert scores["maj@k"] == {"1": 0.5, "2": 0.5, "4": 0.5}
    assert scores["mean_response_length"] == pytest.approx((4 + 8 + 12 + 16 + 40) / 8)
    assert scores["truncated_share"] == pytest.approx(1 / 8)
    assert scores["timeouts"] == 1 and scores["outcomes"]["timeout"] == 1
    assert scores["problems"] == 2 and scores["n"] == 4


def test_code_scores_have_no_majority_vote_and_average_skips_it():
    code = score_benchmark("code", [rows([True, False], [None, None])], [1, 2])
    math = score_benchmark("math", [rows([False, False], ["1", "1"])], [1, 2])
    assert code["maj@k"] is None
    average = average_scores({"c": code, "m": math})
    assert average["pass@k"]["1"] == pytest.approx(0.25)
    assert average["maj@k"] == {"1": 0.0, "2": 0.0}  # only the math benchmark votes


# ---------------------------------------------------------------- the loop


def test_evaluate_writes_every_sample_and_scores_match(tmp_path):
    suite = toy_suite(5)
    backend, outcome = run(tmp_path, [suite])
    samples = read_samples(tmp_path)
    assert len(samples) == 5 * 4 and len(backend.requests) == 5
    by_problem = {}
    for row in samples:
        by_problem.setdefault(row["problem_id"], []).append(row)
        assert row["correct"] == (row["extracted"] == row["gold"])
    expected = sum(pass_at_k(4, sum(r["correct"] for r in rs), 2) for rs in by_problem.values()) / 5
    assert outcome.scores["toy"]["pass@k"]["2"] == pytest.approx(expected)
    assert outcome.timing["generated_samples"] == 20 and outcome.timing["reused_samples"] == 0


def test_resume_reuses_samples_and_equals_an_uninterrupted_run(tmp_path):
    suite = toy_suite(5)
    _, straight = run(tmp_path / "straight", [suite])
    first, _ = run(tmp_path / "split", [suite], limit=2)
    second, resumed = run(tmp_path / "split", [suite])
    assert [r.seed for r in first.requests] == [problem_seed(0, "toy", f"toy/{i}", 0) for i in range(2)]
    # the first two problems are not generated again
    assert {r.seed for r in second.requests}.isdisjoint({r.seed for r in first.requests})
    assert len(second.requests) == 3 and resumed.timing["reused_samples"] == 8

    def key(rows_):
        return sorted((r["problem_id"], r["sample"], r["response"]) for r in rows_)

    assert key(read_samples(tmp_path / "split")) == key(read_samples(tmp_path / "straight"))
    assert resumed.scores == straight.scores


def test_more_samples_extend_the_existing_ones(tmp_path):
    suite = toy_suite(3)
    run(tmp_path, [suite], k=2)
    before = read_samples(tmp_path)
    backend, outcome = run(tmp_path, [suite], k=2, n=4)
    assert [r.n for r in backend.requests] == [2, 2, 2]  # only samples 2 and 3 are drawn
    assert read_samples(tmp_path)[: len(before)] == before
    assert outcome.scores["toy"]["n"] == 4 and list(outcome.scores["toy"]["pass@k"]) == ["1", "2"]


def test_partial_last_line_is_dropped(tmp_path):
    suite = toy_suite(2)
    run(tmp_path, [suite])
    path = tmp_path / SAMPLES_FILE
    text = path.read_text()
    path.write_text(text + '{"benchmark": "toy", "problem_id": "toy/')  # killed mid-write
    store = SampleStore(tmp_path)
    assert path.read_text() == text
    assert len(store.existing("toy", "toy/1")) == 4


def test_interrupted_problem_keeps_the_graded_ones(tmp_path):
    suite = toy_suite(4)

    class Dies(FakeBackend):
        def generate(self, requests):
            if len(self.requests) == 2:
                raise KeyboardInterrupt
            return super().generate(requests)

    with pytest.raises(KeyboardInterrupt):
        evaluate(Dies(), settings(), tmp_path, suites=[suite])
    assert {r["problem_id"] for r in read_samples(tmp_path)} == {"toy/0", "toy/1"}
    second, _ = run(tmp_path, [suite])
    assert len(second.requests) == 2


def test_settings_that_shape_samples_must_match_on_resume(tmp_path):
    run(tmp_path, [toy_suite(2)])
    with pytest.raises(UserError, match="temperature=1.0, not 0.5"):
        check_state(tmp_path, settings(temperature=0.5))
    check_state(tmp_path, settings(k=8, limit=1))  # n, k, limit, benchmarks may change


def test_real_math_grader_through_the_harness(tmp_path):
    problems = [Problem("m/0", "1+1", "2"), Problem("m/1", "half", "\\frac{1}{2}")]
    bench = Benchmark("m", "m", "math", lambda d, n: problems, grade_math)

    class Answers(FakeBackend):
        def generate(self, requests):
            texts = {0: ["so \\boxed{2}", "\\boxed{3}"], 1: ["\\boxed{0.5}", "\\boxed{1/2}"]}[len(self.requests)]
            self.requests.extend(requests)
            return [Generated(texts, [5, 5], [False, False])]

    outcome = evaluate(Answers(), settings(benchmarks=["m"], k=2), tmp_path, suites=[(bench, problems)])
    samples = read_samples(tmp_path)
    assert [r["correct"] for r in samples] == [True, False, True, True]
    assert samples[0]["extracted"] == "2" and samples[2]["gold"] == "\\frac{1}{2}"
    # the question once per problem's draw (issue 54): on its first row, not repeated n times
    assert [r.get("question") for r in samples] == ["1+1", None, "half", None]
    assert outcome.scores["m"]["pass@k"]["1"] == pytest.approx(0.75)


@pytest.mark.parametrize("kw, message", [
    (dict(k=4, n=2), "--n (2) must be at least --k (4)"),
    (dict(prompt="fancy"), "unknown --prompt 'fancy'"),
    (dict(top_p=0.0), "--top-p"),
    (dict(benchmarks=[]), "--benchmarks is empty"),
])
def test_bad_settings_are_user_errors(kw, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        settings(**kw).validate()


def test_backend_choice():
    assert resolve_backend("hf") == "hf"
    assert resolve_backend("auto") in ("hf", "vllm")
    with pytest.raises(UserError, match="unknown --backend 'tgi'"):
        resolve_backend("tgi")
