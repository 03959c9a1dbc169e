"""An interrupted `meds eval` that resumes draws exactly the samples an uninterrupted eval draws:
stopped between requests, killed in the middle of writing a problem's samples, and through the
command line with the real HF backend on the tiny model."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.harness import SAMPLES_FILE, evaluate, problem_seed, whole_draws
from meds_cli.app import app
from meds_cli.engine.rollout import eval_backends
from tests.test_eval_harness import FakeBackend, settings, toy_suite


def samples(folder) -> list[dict]:
    """The rows of samples.jsonl without their wall-clock time, in file order."""
    rows = [json.loads(line) for line in (Path(folder) / SAMPLES_FILE).read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]


class StopsAfter(FakeBackend):
    """Raises KeyboardInterrupt on request number `limit` (0-based), like a Ctrl-C mid-eval."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def generate(self, requests):
        if len(self.requests) >= self.limit:
            raise KeyboardInterrupt
        return super().generate(requests)


@pytest.mark.parametrize("stop_after", [0, 1, 3])
def test_stopped_eval_resumes_to_the_uninterrupted_samples(tmp_path, stop_after):
    suite = toy_suite(5)
    evaluate(FakeBackend(), settings(k=4), tmp_path / "straight", suites=[suite])
    with pytest.raises(KeyboardInterrupt):
        evaluate(StopsAfter(stop_after), settings(k=4), tmp_path / "split", suites=[suite])
    evaluate(FakeBackend(), settings(k=4), tmp_path / "split", suites=[suite])
    assert samples(tmp_path / "split") == samples(tmp_path / "straight")


@pytest.mark.parametrize("whole_rows", [0, 1, 3])
def test_a_kill_in_the_middle_of_a_problems_rows_redraws_that_problem_exactly(tmp_path, whole_rows):
    suite = toy_suite(3)
    evaluate(FakeBackend(), settings(k=4), tmp_path / "straight", suites=[suite])
    split = tmp_path / "split"
    evaluate(FakeBackend(), settings(k=4), split, suites=[suite])
    lines = (split / SAMPLES_FILE).read_bytes().splitlines(keepends=True)
    # The last problem's four rows went out in one write; the kill left `whole_rows` of them and
    # half of the next one.
    kept = lines[:8 + whole_rows] + [lines[8 + whole_rows][:20]]
    (split / SAMPLES_FILE).write_bytes(b"".join(kept))
    backend = FakeBackend()
    evaluate(backend, settings(k=4), split, suites=[suite])
    # the whole draw again, from the seed of its first sample
    assert [(r.n, r.seed) for r in backend.requests] == [(4, problem_seed(0, "toy", "toy/2", 0))]
    assert samples(split) == samples(tmp_path / "straight")


def test_whole_draws_keeps_complete_draws_and_rows_without_draw_info():
    def row(sample, draw=None, size=None, problem="p"):
        extra = {} if draw is None else {"draw": draw, "draw_size": size}
        return {"benchmark": "b", "problem_id": problem, "sample": sample, **extra}

    rows = [row(0), row(1),  # written before draws were recorded
            row(0, 0, 2, "q"), row(1, 0, 2, "q"),  # whole
            row(2, 2, 2, "q"),  # the first of two: cut short
            row(0, 0, 3, "r"), row(2, 0, 3, "r")]  # a hole: not whole
    assert whole_draws(rows) == rows[:4]


# ---------------------------------------------------------------- through the command line


ROWS = [{"problem": "compute 1+1", "answer": "2"}, {"problem": "compute 2*3", "answer": "6"},
        {"problem": "compute 9-4", "answer": "5"}]


@pytest.fixture
def data_dir(tmp_path):
    (tmp_path / "data" / "math500").mkdir(parents=True)
    (tmp_path / "data" / "math500" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path / "data"


def test_interrupted_cli_eval_with_the_hf_backend_resumes_to_the_same_samples(tmp_path, data_dir, monkeypatch):
    args = ["eval", "--model", "tiny-llama", "--benchmarks", "math500", "--k", "2", "--n", "3", "--max-new-tokens", "8",
            "--temperature", "1.0", "--top-p", "1.0", "--backend", "hf", "--data-dir", str(data_dir), "-q",
            "--batch-size", "3"]  # one problem (3 samples) per call, so the eval can stop between problems
    runner = CliRunner()
    straight = runner.invoke(app, [*args, "--output", str(tmp_path / "straight")])
    assert straight.exit_code == 0, straight.output

    real = eval_backends.HFBackend.generate
    calls = []

    def stops_on_the_second_problem(self, requests):
        calls.append(requests)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, requests)

    monkeypatch.setattr(eval_backends.HFBackend, "generate", stops_on_the_second_problem)
    stopped = runner.invoke(app, [*args, "--output", str(tmp_path / "split")])
    assert stopped.exit_code == 130
    assert len({r["problem_id"] for r in samples(tmp_path / "split")}) == 1
    monkeypatch.setattr(eval_backends.HFBackend, "generate", real)
    resumed = runner.invoke(app, [*args, "--output", str(tmp_path / "split")])
    assert resumed.exit_code == 0, resumed.output
    assert samples(tmp_path / "split") == samples(tmp_path / "straight")
    assert json.loads((tmp_path / "split" / "results.json").read_text())["benchmarks"] == \
        json.loads((tmp_path / "straight" / "results.json").read_text())["benchmarks"]


def test_problems_sharing_a_decode_batch_draw_the_samples_they_draw_alone(tmp_path, data_dir, monkeypatch):
    """By default the hf backend fills one decode batch with several problems; a sample depends on
    its own seed, not on the problems beside it: the same tokens. (torch's float32 matmul on CPU
    gives a row the same values whatever the rows beside it; the demo run's eval gave the same
    2,560 responses at 64 rows of one problem and at 1,024 rows of eight.)"""
    args = ["eval", "--model", "tiny-llama", "--benchmarks", "math500", "--k", "2", "--n", "3", "--max-new-tokens", "8",
            "--temperature", "1.0", "--top-p", "1.0", "--backend", "hf", "--data-dir", str(data_dir), "-q"]
    runner = CliRunner()
    sizes = []
    real = eval_backends.HFBackend.call_sizes

    def recorded(self, requests):
        sizes.append(real(self, requests))
        return sizes[-1]

    monkeypatch.setattr(eval_backends.HFBackend, "call_sizes", recorded)
    for name, extra in (("alone", ["--batch-size", "3"]), ("together", [])):
        result = runner.invoke(app, [*args, *extra, "--output", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    assert sizes == [[1, 1, 1], [3]]
    assert samples(tmp_path / "together") == samples(tmp_path / "alone")
