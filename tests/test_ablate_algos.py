"""`meds ablate --algos`: algorithms and presets as variants of one ablation (flags and grid
files, the baseline first, bad names as one line), and 2 algorithms x 1 seed end to end on the
tiny model: the report's diversity columns in every row, MEDS's columns blank elsewhere."""

import json

import pytest

from meds_cli.app import app
from meds_cli.commands.ablate import expand, read_grid
from meds_cli.core.errors import UserError
from meds_cli.engine.config import load_config
from tests.test_ablate import ROOT, TINY_SETS, plan, runner


def test_algos_are_variants_on_the_same_base_with_the_first_as_baseline():
    p = plan(algos="dapo,meds,passk,w-reinforce,outcome-ucb,clip-cov", seeds="0")
    assert [v.group for v in p.variants] == ["dapo", "meds", "passk", "w-reinforce", "outcome-ucb", "clip-cov"]
    assert p.variants[2].overrides == {"algo.name": "dapo", "dapo.adv_estimator": "passk", "train.seed": 0}
    assert p.variants[5].overrides == {"algo.name": "dapo", "dapo.policy_loss": "clip-cov", "train.seed": 0}
    assert p.variants[3].overrides == {"algo.name": "w-reinforce", "train.seed": 0}
    # the same base config under every variant: only the algorithm differs
    dapo = load_config([], p.base_sets + ["algo.name=dapo"])
    passk = load_config([], p.base_sets + ["algo.name=dapo", "dapo.adv_estimator=passk"])
    assert passk.rollout == dapo.rollout and passk.train == dapo.train
    # --baseline moves (or adds) the baseline to the front; MEDS axes still vary MEDS beside them
    named = plan(algos="meds,passk", baseline_name="dapo", features="random")
    assert [v.name for v in named.variants] == ["dapo", "meds", "passk", "features-random"]


def test_algos_from_a_grid_file(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("algos: [meds, grpo, w-reinforce]\nbaseline: grpo\nseeds: [1, 2]\n")
    assert [v.name for v in expand(read_grid(grid), "dapo")] == [
        "grpo_seed-1", "grpo_seed-2", "meds_seed-1", "meds_seed-2", "w-reinforce_seed-1", "w-reinforce_seed-2"]
    shipped = plan(grid_file=ROOT / "configs" / "ablate" / "family.yaml")
    assert shipped.variants[0].group == "dapo" and len({v.group for v in shipped.variants}) == 10


def test_bad_algos_are_one_line():
    with pytest.raises(UserError, match=r"unknown algorithm or preset 'pask' in --algos \(did you mean 'passk'\?\); "
                                        r"accepted: clip-cov"):
        plan(algos="dapo,pask")
    with pytest.raises(UserError, match="names 'meds' twice"):
        plan(algos="meds,dapo,meds")
    with pytest.raises(UserError, match="--baseline grpo names the baseline among --algos; give --algos too"):
        plan(baseline_name="grpo")
    # a variant's own settings are checked before anything trains: w-reinforce cannot sit on rlif
    with pytest.raises(UserError, match="algo.base=rlif-multireward is not a base w-reinforce can sit on"):
        plan(algos="grpo,w-reinforce", sets=TINY_SETS + ["algo.base=rlif-multireward"])
    result = runner.invoke(app, ["ablate", "--algos", "dapo,wreinforce", "--dry-run",
                                 *sum((["--set", s] for s in TINY_SETS), [])])
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "did you mean 'w-reinforce'" in lines[0], result.output


def test_two_algorithms_end_to_end(tmp_path):
    folder = tmp_path / "abl"
    # GRPO base: every step updates (DAPO's dynamic sampling can drop all groups of the untrained tiny model)
    sets = sum((["--set", s] for s in TINY_SETS + ["algo.base=grpo"]), [])
    result = runner.invoke(app, ["ablate", *sets, "--algos", "grpo,w-reinforce", "--seeds", "0", "--steps", "2",
                                 "--output", str(folder), "--k", "2", "-q"])
    assert result.exit_code == 0, result.output
    assert load_config([str(folder / "w-reinforce_seed-0" / "config.yaml")]).algo.name == "w-reinforce"
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["variant"] for r in summary["rows"]] == ["grpo", "w-reinforce"]
    # each arm's base and key settings, in the table too
    setups = ["grpo", "w-reinforce on grpo; w-reinforce.mode=weighted; w-reinforce.positive_weight=0.1"]
    assert [r["setup"] for r in summary["rows"]] == setups
    assert all(f"| {s} |" in (folder / "summary.md").read_text() for s in setups)
    for row in summary["rows"]:
        # the diversity diagnostics every arm logs (the eigen ratio on the same logit-lens features)
        for key in ("pass@1", "pass@k", "distinct_wrong", "distinct_correct", "entropy", "eigen_ratio"):
            assert row[key] is not None, (row["variant"], key)
        for key in ("clusters", "ari"):  # MEDS's own diagnostics: blank for these two
            assert row[key] is None, (row["variant"], key)
    run = summary["runs"]["w-reinforce_seed-0"]
    for curve in ("reward_curve", "distinct_wrong_curve", "entropy_curve", "eigen_ratio_curve"):  # diagnostics.png
        assert [step for step, _ in run[curve]] == [1, 2], curve
    metrics = [json.loads(line) for line in (folder / "w-reinforce_seed-0" / "metrics.jsonl").read_text().splitlines()]
    assert all("w-reinforce/reweighted" in m for m in metrics)
    [paired] = summary["paired"]
    assert (paired["a"], paired["b"]) == ("w-reinforce", "grpo")
    verdict = paired["benchmarks"]["heldout-copy"]["pass@1"]["verdict"]
    report = (folder / "summary.md").read_text()
    assert verdict.startswith("w-reinforce - grpo heldout-copy pass@1") and verdict in report
    assert "| distinct correct |" in report
    for file in ("reward_curves.png", "pass_at_k.png", "diagnostics.png", "paired_differences.png"):
        assert (folder / file).stat().st_size > 0, file
    again = runner.invoke(app, ["ablate", *sets, "--algos", "grpo,w-reinforce", "--seeds", "0", "--steps", "2",
                                "--output", str(folder), "--k", "2", "-q"])
    assert again.exit_code == 0 and again.output.count("finished, skipped") == 2, again.output


def test_arm_setup_names_the_base_and_the_presets_settings(tmp_path):
    from meds_cli.commands.ablate_report import arm_setup
    from meds_cli.engine.config import dump_yaml
    from tests.conftest import tiny_config

    for name, sets, overrides, expected in [
        ("ucb", ["algo.name=outcome-ucb"], {"algo.name": "outcome-ucb", "train.seed": 0},
         "outcome-ucb on grpo; outcome-ucb.variant=ucb; outcome-ucb.coef=0.2; outcome-ucb.counts=earlier"),
        ("nsr", ["algo.name=w-reinforce", "w-reinforce.mode=nsr"], {"algo.name": "w-reinforce",
                                                                   "w-reinforce.mode": "nsr"},
         "w-reinforce on dapo; w-reinforce.mode=nsr"),
        ("passk", ["algo.name=dapo", "dapo.adv_estimator=passk"], {"algo.name": "dapo", "dapo.adv_estimator": "passk"},
         "dapo; dapo.adv_estimator=passk"),
    ]:
        (tmp_path / name).mkdir()
        dump_yaml(tiny_config(*sets), tmp_path / name / "config.yaml")
        assert arm_setup(tmp_path / name, overrides) == expected
    assert arm_setup(tmp_path / "missing", {}) == "-"
