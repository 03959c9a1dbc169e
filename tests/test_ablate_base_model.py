"""The base-model arm of `meds ablate` (train.steps 0: the base model evaluated as is, compared with
every trained arm) and the testbed study grid that uses it."""

import json
from pathlib import Path

import numpy as np
import pytest

from meds_cli.app import app
from meds_cli.commands.ablate import variant_sets
from meds_cli.commands.ablate_grid import BASE_MODEL_ARM, trains
from meds_cli.commands.eval import default_output, model_for_run
from meds_cli.core.errors import UserError
from meds_cli.engine.config import dump_yaml, load_config
from tests.conftest import tiny_config
from tests.test_ablate import ROOT, TINY_SETS, plan, runner

STUDY = ROOT / "configs" / "testbed" / "study.yaml"


def test_study_grid_expands_to_the_arms_of_issue_52():
    p = plan(grid_file=STUDY, sets=[], steps=None)
    groups = list(dict.fromkeys(v.group for v in p.variants))
    assert groups == ["base-model", "dapo", "grpo", "meds", "edas", "passk", "nsr", "meds-random"]
    seeds = sorted({v.seed for v in p.variants})
    assert seeds == [0, 1, 2, 3, 4] and len(p.variants) == len(groups) * 5
    assert p.steps >= 300
    by_group = {v.group: v.overrides for v in p.variants if v.seed == 0}
    assert by_group["base-model"] == {"train.steps": 0, "train.seed": 0}
    assert by_group["meds-random"] == {"algo.name": "meds", "meds.features": "random", "train.seed": 0}
    assert by_group["passk"]["dapo.adv_estimator"] == "passk" and by_group["nsr"]["w-reinforce.mode"] == "nsr"
    configs = {v.group: load_config(p.config_files, p.base_sets + variant_sets(v)) for v in p.variants if v.seed == 3}
    assert configs["base-model"].train.steps == 0 and configs["grpo"].train.steps == p.steps
    assert {c.model.name for c in configs.values()} == {"testbed-base"}
    assert all(c.task.eval_size >= 300 for c in configs.values())  # pass@k on at least 300 held-out problems
    for name in ("meds", "edas", "nsr", "meds-random"):  # the shaping arms sit on the baseline, DAPO
        assert configs[name].algo.base in ("", "dapo"), name
    assert configs["meds"].section("meds").features == "logits"
    # one probe for every arm's eigen ratio: MEDS's own layers, so MEDS's arms log it too
    assert all(c.train.diversity_layers == configs["meds"].section("meds").layers for c in configs.values())
    assert configs["grpo"].train.seed == 3 and configs["base-model"].train.seed == 3  # same held-out split


def test_base_model_flag_and_bad_grid_value(tmp_path):
    p = plan(algos="grpo,dapo", base_model=True, seeds="0")
    assert [v.name for v in p.variants] == ["base-model_seed-0", "grpo_seed-0", "dapo_seed-0"]
    assert [trains(v.overrides) for v in p.variants] == [False, True, True]
    assert BASE_MODEL_ARM[1] == {"train.steps": 0}
    grid = tmp_path / "g.yaml"
    grid.write_text("algos: [grpo]\nbase_model: yes please\n")
    with pytest.raises(UserError, match="base_model must be true or false"):
        plan(grid_file=grid)
    grid.write_text("algos: [grpo, dapo]\ncompare: [[dapo, grpoo]]\n")
    with pytest.raises(UserError, match="compare: no arm named 'grpoo'.*did you mean 'grpo'"):
        plan(grid_file=grid)
    grid.write_text("algos: [grpo, dapo]\ncompare: [dapo, grpo]\n")
    with pytest.raises(UserError, match="compare must be a list of pairs"):
        plan(grid_file=grid)


def test_a_run_of_zero_steps_is_its_base_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dump_yaml(tiny_config("train.steps=0"), run / "config.yaml")
    spec = model_for_run(run, None, None)
    assert spec.checkpoint is None and spec.name == "tiny-llama"
    assert default_output(run, spec) == run / "eval" / "step_0"
    dump_yaml(tiny_config("train.steps=2"), run / "config.yaml")  # a trained run without checkpoints: an error
    with pytest.raises(UserError):
        model_for_run(run, None, None)


def test_base_model_arm_end_to_end(tmp_path):
    folder = tmp_path / "abl"
    grid = tmp_path / "grid.yaml"
    grid.write_text("algos: [grpo, w-reinforce, nsr]\nbase_model: true\ncompare: [[nsr, w-reinforce]]\nseeds: [0]\n")
    sets = sum((["--set", s] for s in TINY_SETS + ["algo.base=grpo"]), [])
    args = ["ablate", *sets, "--grid", str(grid), "--steps", "2", "--output", str(folder), "--k", "2", "-q"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    base = folder / "base-model_seed-0"
    # trained nothing: no checkpoint, no metrics; evaluated like the others
    assert not (base / "checkpoints").exists() and not (base / "metrics.jsonl").exists()
    assert load_config([str(base / "config.yaml")]).train.steps == 0
    assert json.loads((base / "eval" / "heldout" / "results.json").read_text())["average"]["pass@k"].keys() == {
        "1", "2"}
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["variant"] for r in summary["rows"]] == ["base-model", "grpo", "w-reinforce", "nsr"]
    row = summary["rows"][0]
    assert row["setup"] == "tiny-llama, untrained (train.steps=0)" and row["pass@1"] is not None
    assert row["time_per_step_s"] is None and row["final_reward"] is None
    assert summary["runs"]["base-model_seed-0"]["pass_at_k_curve"]  # its curve in pass_at_k.png
    # each trained arm against the baseline (the first trained arm), then against the base model, then
    # the grid's compare pairs
    pairs = [(c["a"], c["b"]) for c in summary["paired"]]
    assert pairs == [("w-reinforce", "grpo"), ("nsr", "grpo"), ("grpo", "base-model"), ("w-reinforce", "base-model"),
                     ("nsr", "base-model"), ("nsr", "w-reinforce")]
    assert json.loads((folder / "tasks.json").read_text())["compare"] == [["nsr", "w-reinforce"]]
    report = (folder / "summary.md").read_text()
    assert "| base-model | 1 | tiny-llama, untrained (train.steps=0) |" in report
    assert "grpo - base-model heldout-copy pass@1" in report
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and again.output.count("finished, skipped") == 4, again.output
    collected = runner.invoke(app, ["ablate", "--collect", str(folder)])  # the pairs come from tasks.json
    assert collected.exit_code == 0, collected.output
    assert [(c["a"], c["b"]) for c in json.loads((folder / "summary.json").read_text())["paired"]] == pairs


def test_dry_run_estimate_counts_only_trained_arms(tmp_path, monkeypatch):
    import meds_cli.commands.ablate as ablate_module

    monkeypatch.setattr(ablate_module, "probe_step_seconds", lambda plan: 1.0)
    sets = sum((["--set", s] for s in TINY_SETS), [])
    result = runner.invoke(app, ["ablate", *sets, "--algos", "grpo,dapo", "--base-model", "--steps", "5",
                                 "--dry-run", "--estimate", "--output", str(tmp_path / "abl")])
    assert result.exit_code == 0, result.output
    assert "x 5 steps x 2 trained variants = 10 s" in " ".join(result.output.split())
    assert Path(tmp_path / "abl").exists() is False


def test_diagnostics_are_compared_seed_by_seed_between_trained_arms():
    from meds_cli.commands.ablate import Variant
    from meds_cli.commands.ablate_report import diagnostic_comparisons, diagnostics_markdown

    variants = [Variant(f"{group}_seed-{seed}", group, overrides, seed)
                for group, overrides in [("base-model", {"train.steps": 0}), ("dapo", {}), ("meds", {})]
                for seed in (0, 1, 2)]
    distinct = {"dapo": [2.0, 2.5, 3.0], "meds": [3.0, 4.5, 6.0]}  # meds - dapo: [1, 2, 3]
    results = {v.name: ({} if v.group == "base-model" else
                        {"distinct_wrong": distinct[v.group][v.seed], "eigen_ratio": None, "one_error": 0.5,
                         "entropy": None})
               for v in variants}
    comparisons = diagnostic_comparisons(variants, results, compare=[("meds", "dapo")])
    # the base-model arm logs no steps: only meds against the baseline, on what both logged
    assert [(c["a_label"], c["b_label"], c["metric"]) for c in comparisons] == [
        ("meds", "dapo", "distinct wrong"), ("meds", "dapo", "one-error groups")]
    distinct_wrong = comparisons[0]
    assert distinct_wrong["delta"] == pytest.approx(2.0) and distinct_wrong["same_sign"] == 3
    assert distinct_wrong["ci"] == pytest.approx([-0.484138, 4.484138], abs=1e-6)  # t(0.975, 2 df) x 1/sqrt(3)
    assert comparisons[1]["delta"] == 0 and comparisons[1]["same_sign"] == 0
    text = diagnostics_markdown(comparisons)
    assert "meds - dapo distinct wrong +2.000, 95% CI [-0.484, +4.484] over 3 seeds (3 of 3 the same sign): " \
           "no difference at this size" in text


def test_long_curves_are_drawn_as_trailing_means():
    from meds_cli.commands.ablate_report import smoothing_window, trailing_mean

    assert trailing_mean(np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert trailing_mean(np.array([4.0, 0.0, 2.0]), 1).tolist() == [4.0, 0.0, 2.0]
    assert smoothing_window(20) == 1 and smoothing_window(300) == 10
