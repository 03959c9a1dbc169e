"""Code benchmarks through the same eval harness as math: pass@k and samples from sandboxed runs."""

import json
from pathlib import Path

import pytest

from benchmarks.generation import Generated
from benchmarks.harness import SAMPLES_FILE, EvalSettings, evaluate, load_benchmarks

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "humanevalplus").is_dir(), reason="needs ../shared/data")


class CanonicalOrBroken:
    """Sample i of a request is the problem's canonical solution when i is even, else a crash."""

    name = "fake"
    tokenizer = None

    def call_sizes(self, requests):
        return [1] * len(requests)

    def __init__(self, solutions: dict[str, str]):
        self.solutions = solutions

    def generate(self, requests):
        out = []
        for request in requests:
            solution = next(s for key, s in self.solutions.items() if key in request.prompt)
            texts = [f"```python\n{solution}\n```" if i % 2 == 0 else "```python\nraise TypeError('no')\n```"
                     for i in range(request.n)]
            out.append(Generated(texts, [10] * request.n, [False] * request.n))
        return out


def test_humanevalplus_and_mbppplus_through_the_harness(tmp_path):
    suites = load_benchmarks(["humanevalplus", "mbppplus"], DATA, 2)
    solutions = {p.question: p.answer["canonical_solution"] for _, problems in suites for p in problems}
    settings = EvalSettings(benchmarks=["humanevalplus", "mbppplus"], k=2, temperature=1.0, top_p=1.0,
                            max_new_tokens=8, model="fake", backend="fake")
    outcome = evaluate(CanonicalOrBroken(solutions), settings, tmp_path, suites=suites)
    for name in ["humanevalplus", "mbppplus"]:
        scores = outcome.scores[name]
        # each problem: 2 samples, 1 correct -> pass@1 = 1/2, pass@2 = 1
        assert scores["pass@k"]["1"] == pytest.approx(0.5) and scores["pass@k"]["2"] == pytest.approx(1.0)
    samples = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert len(samples) == 8
    assert {s["outcome"] for s in samples} == {"passed", "TypeError"}
