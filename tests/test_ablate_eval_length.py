"""`meds ablate` evaluates a run's held-out split at the length `meds eval RUN` gives it."""

from pathlib import Path

import yaml

from benchmarks.harness import EvalSettings
from meds_cli.commands import ablate_eval
from meds_cli.commands.eval import heldout_max_new_tokens


def _run_folder(tmp_path: Path, task: str, max_new_tokens: int) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"task": {"name": task},
                                                     "rollout": {"max_new_tokens": max_new_tokens}}))
    return run


def _evaluated_length(monkeypatch, run: Path, benchmarks: list[str]) -> int:
    seen = {}

    def fake_run_eval(*, settings, **_):
        seen["max_new_tokens"] = settings.max_new_tokens
        return {}

    monkeypatch.setattr("meds_cli.commands.eval.run_eval", fake_run_eval)
    ablate_eval.evaluate_variant(run, EvalSettings(benchmarks=benchmarks, k=4))
    return seen["max_new_tokens"]


def test_heldout_length_is_the_task_floor_or_the_run_limit():
    assert heldout_max_new_tokens("arithmetic", 48) == 256  # the demo's 48 would cut most answers
    assert heldout_max_new_tokens("arithmetic", 512) == 512
    assert heldout_max_new_tokens("copy", 2) == 2  # no floor for a toy task


def test_ablate_heldout_eval_takes_the_arithmetic_floor(monkeypatch, tmp_path):
    # Before, `meds ablate` evaluated at the run's rollout.max_new_tokens (48) while `meds eval RUN` used 256.
    run = _run_folder(tmp_path, "arithmetic", 48)
    assert _evaluated_length(monkeypatch, run, ["heldout"]) == 256


def test_ablate_benchmark_eval_keeps_the_run_length(monkeypatch, tmp_path):
    run = _run_folder(tmp_path, "arithmetic", 48)
    assert _evaluated_length(monkeypatch, run, ["math500"]) == 48
