"""`meds ablate` evaluates a run's held-out split at the length `meds eval RUN` gives it."""

from pathlib import Path

import pytest
import yaml

from benchmarks.harness import EvalSettings
from meds_cli.commands import ablate_eval
from meds_cli.commands.eval import heldout_max_new_tokens
from meds_cli.core.errors import UserError


def _run_folder(tmp_path: Path, task: str, max_new_tokens: int) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"task": {"name": task},
                                                     "rollout": {"max_new_tokens": max_new_tokens}}))
    return run


def _evaluated_length(monkeypatch, run: Path, benchmarks: list[str], given: int | None = None, seen=None) -> int:
    seen = {} if seen is None else seen

    def fake_run_eval(*, settings, length_option, **_):
        seen["max_new_tokens"] = settings.max_new_tokens
        seen["length_option"] = length_option
        return {}

    monkeypatch.setattr("meds_cli.commands.eval.run_eval", fake_run_eval)
    ablate_eval.evaluate_variant(run, EvalSettings(benchmarks=benchmarks, k=4), max_new_tokens=given)
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


def test_ablate_max_new_tokens_sets_every_eval_and_is_the_advice(monkeypatch, tmp_path):
    # issue 54: the truncation advice inside `meds ablate` named --max-new-tokens, which it lacked
    run = _run_folder(tmp_path, "arithmetic", 48)
    seen = {}
    assert _evaluated_length(monkeypatch, run, ["heldout"], given=1024, seen=seen) == 1024
    assert _evaluated_length(monkeypatch, run, ["math500"], given=700) == 700
    assert seen["length_option"] == "meds ablate --max-new-tokens"


def test_truncation_advice_names_the_running_commands_option():
    from benchmarks.eval_report import truncation_warning

    document = {"config": {"max_new_tokens": 64}, "benchmarks": {"math500": {"truncated_share": 0.5}}}
    assert truncation_warning(document).endswith("raise it with --max-new-tokens (e.g. --max-new-tokens 128)")
    inside = truncation_warning(document, ablate_eval.LENGTH_OPTION)
    assert inside.endswith("raise it with meds ablate --max-new-tokens (e.g. meds ablate --max-new-tokens 128)")


def test_ablate_keeps_its_eval_length_in_tasks_json(tmp_path):
    import json

    from meds_cli.commands.ablate import make_plan, variant_sets
    from meds_cli.commands.ablate_task import read_tasks, write_tasks
    from tests.conftest import TINY_COPY

    plan = make_plan(config_files=[], sets=list(TINY_COPY), grid_file=None, features=None, clusterer=None,
                     layers=None, seeds=None, steps=1, baseline=True, output=tmp_path / "abl", algos="grpo,dapo")
    plan.folder.mkdir()
    write_tasks(plan, EvalSettings(["heldout"], k=2), variant_sets, 512)
    assert read_tasks(plan.folder)["eval_max_new_tokens"] == 512
    record = json.loads((plan.folder / "tasks.json").read_text())
    record["eval_max_new_tokens"] = 0
    (plan.folder / "tasks.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match="eval_max_new_tokens"):
        read_tasks(plan.folder)
