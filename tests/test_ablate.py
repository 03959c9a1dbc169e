"""`meds ablate`: the grid from flags and YAML, bad names, and a small ablation on the tiny model
end to end (table, plots, finished variants skipped, an interrupted one resumed)."""

import csv
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.commands.ablate import Grid, expand, grid_from_flags, make_plan, read_grid, variant_sets
from meds_cli.core.errors import UserError
from meds_cli.engine.config import load_config
from tests.conftest import TINY_COPY

ROOT = Path(__file__).resolve().parent.parent
TINY_SETS = [s for s in TINY_COPY if not s.startswith(("rollout.group_size", "rollout.prompts_per_step"))] + [
    "rollout.group_size=8", "rollout.prompts_per_step=4", "train.checkpoint_every=1"]
runner = CliRunner()


def plan(**options):
    defaults = dict(config_files=[], sets=TINY_SETS, grid_file=None, features=None, clusterer=None, layers=None,
                    seeds=None, steps=2, baseline=True, output=None)
    return make_plan(**{**defaults, **options})


def test_grid_from_flags_is_the_product_plus_a_baseline():
    p = plan(features="logits,semantic", clusterer="hdbscan,kmeans")
    names = [v.name for v in p.variants]
    assert names == ["features-logits_clusterer-hdbscan", "features-logits_clusterer-kmeans",
                     "features-semantic_clusterer-hdbscan", "features-semantic_clusterer-kmeans", "baseline-dapo"]
    assert p.variants[3].overrides == {"algo.name": "meds", "meds.features": "semantic", "meds.clusterer": "kmeans"}
    assert p.variants[-1].overrides == {"algo.name": "dapo"}
    assert p.steps == 2
    # each variant differs from the base only where the grid says
    base = load_config([], TINY_SETS + ["algo.name=meds", "train.steps=2"])
    cfg = load_config([], p.base_sets + variant_sets(p.variants[3]))
    assert cfg.section("meds").features == "semantic" and cfg.section("meds").clusterer == "kmeans"
    assert cfg.section("meds").layers == base.section("meds").layers and cfg.rollout == base.rollout


def test_layers_and_seeds_flags():
    p = plan(layers="last_half,last:4", seeds="0,1", baseline=False)
    assert [v.name for v in p.variants] == ["layers-last-half_seed-0", "layers-last-half_seed-1",
                                            "layers-last4_seed-0", "layers-last4_seed-1"]
    assert [v.group for v in p.variants] == ["layers-last-half"] * 2 + ["layers-last4"] * 2
    assert p.variants[3].overrides == {"algo.name": "meds", "meds.layers": "last:4", "train.seed": 1}
    assert load_config([], p.base_sets + variant_sets(p.variants[3])).section("meds").layers == "last:4"
    assert [v.name for v in plan().variants] == ["meds", "baseline-dapo"]  # no axis: MEDS as configured
    assert plan(sets=TINY_SETS + ["algo.base=grpo"]).variants[-1].name == "baseline-grpo"


def test_grid_from_yaml(tmp_path):
    (tmp_path / "base.yaml").write_text("rollout:\n  temperature: 0.9\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text("config: [base.yaml]\nset: [meds.alpha=0.2]\naxes:\n  meds.features: [logits, hidden_mean]\n"
                    "variants:\n  - {name: knn, set: {meds.assign: knn}}\nseeds: [3]\nbaseline: false\n")
    p = plan(grid_file=grid)
    assert [v.name for v in p.variants] == ["features-logits_seed-3", "features-hidden-mean_seed-3", "knn_seed-3"]
    cfg = load_config(p.config_files, p.base_sets + variant_sets(p.variants[2]))
    assert (cfg.rollout.temperature, cfg.section("meds").alpha, cfg.section("meds").assign, cfg.train.seed) == (
        0.9, 0.2, "knn", 3)
    # a flag replaces the grid's axis of the same key
    flagged = grid_from_flags(read_grid(grid), features="random")
    assert [v.name for v in expand(flagged, None)] == ["features-random_seed-3", "knn_seed-3"]
    assert [v.name for v in expand(Grid(seeds=[0]), "dapo")] == ["meds_seed-0", "baseline-dapo_seed-0"]


@pytest.mark.parametrize("name", ["features", "clusterers", "layers"])
def test_shipped_grids_expand(name):
    p = plan(grid_file=ROOT / "configs" / "ablate" / f"{name}.yaml")
    assert len(p.variants) >= 9 and p.variants[-1].name.startswith("baseline-dapo")


def test_bad_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="accepted: hidden_mean, logits, random, semantic"):
        plan(features="logits,semantics")
    with pytest.raises(UserError, match="accepted: agglomerative, dbscan, hdbscan, kmeans"):
        plan(clusterer="kmedoids")
    with pytest.raises(UserError, match="meds.layers 'middle'"):
        make_plan(config_files=[], sets=TINY_SETS + ["algo.name=meds"], grid_file=None, features=None, clusterer=None,
                  layers="middle", seeds=None, steps=1, baseline=False, output=None)
    with pytest.raises(UserError, match="seed .one. is not an integer"):
        plan(seeds="0,one")
    grid = tmp_path / "g.yaml"
    grid.write_text("axis:\n  meds.features: [logits]\n")
    with pytest.raises(UserError, match="unknown key 'axis'.*did you mean 'axes'"):
        plan(grid_file=grid)
    result = runner.invoke(app, ["ablate", "--features", "logit", "--dry-run",
                                 *sum((["--set", s] for s in TINY_SETS), [])])
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "did you mean 'logits'" in lines[0], result.output


def ablate(folder, *extra):
    sets = sum((["--set", s] for s in TINY_SETS), [])
    return runner.invoke(app, ["ablate", *sets, "--steps", "2", "--features", "logits,random", "--no-baseline",
                               "--output", str(folder), "--k", "2", "-q", *extra])


def test_dry_run_lists_variants_at_once_without_training(tmp_path, monkeypatch):
    import meds_cli.commands.ablate as ablate_module

    def no_probe(plan):
        raise AssertionError("a plain --dry-run must not train")

    monkeypatch.setattr(ablate_module, "probe_step_seconds", no_probe)
    result = ablate(tmp_path / "abl", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "features-logits" in result.output and "add --estimate" in result.output
    assert not (tmp_path / "abl").exists()


def test_dry_run_lists_variants_and_estimates(tmp_path):
    result = ablate(tmp_path / "abl", "--dry-run", "--estimate")
    assert result.exit_code == 0, result.output
    assert "features-logits" in result.output and "features-random" in result.output
    text = " ".join(result.output.split())  # rich wraps at the terminal width
    assert "one step of the base config took" in text and "x 2 steps x 2 trained variants" in text
    assert not (tmp_path / "abl").exists()  # a dry run creates nothing


def test_two_variant_ablation_end_to_end(tmp_path):
    folder = tmp_path / "abl"
    result = ablate(folder)
    assert result.exit_code == 0, result.output
    for name in ("features-logits", "features-random"):
        run = folder / name
        assert (run / "config.yaml").is_file() and (run / "checkpoints" / "step_2").is_dir()
        assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
        results = json.loads((run / "eval" / "heldout" / "results.json").read_text())
        assert results["average"]["pass@k"].keys() == {"1", "2"}
    assert load_config([str(folder / "features-random" / "config.yaml")]).section("meds").features == "random"
    for file in ("summary.md", "summary.csv", "summary.json", "reward_curves.png", "pass_at_k.png", "diagnostics.png"):
        assert (folder / file).stat().st_size > 0, file
    summary = json.loads((folder / "summary.json").read_text())
    logits_run = summary["runs"]["features-logits"]
    # What diagnostics.png draws: the reward every step, MEDS's own metrics on the steps that logged them.
    for curve in ("reward_curve", "distinct_wrong_curve"):
        assert [step for step, _ in logits_run[curve]] == [1, 2], curve
    for curve in ("clusters_curve", "eigen_ratio_curve"):
        assert logits_run[curve] and {step for step, _ in logits_run[curve]} <= {1, 2}, curve
    assert [r["variant"] for r in summary["rows"]] == ["features-logits", "features-random"]
    row = summary["rows"][0]
    for key in ("pass@1", "pass@k", "final_reward", "distinct_wrong", "eigen_ratio", "ari", "time_per_step_s"):
        assert row[key] is not None, key
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    assert rows[1]["variant"] == "features-random" and float(rows[1]["time_per_step_s"]) > 0
    assert "| features-logits | 1 |" in (folder / "summary.md").read_text()
    assert "ablation" in result.output  # the rich table
    # Without a baseline run, the first variant is the one the others are paired with.
    [paired] = summary["paired"]
    assert (paired["a"], paired["b"]) == ("features-random", "features-logits")
    verdict = paired["benchmarks"]["heldout-copy"]["pass@1"]["verdict"]
    assert verdict.startswith("features-random - features-logits heldout-copy pass@1") and verdict in result.output
    assert verdict in (folder / "summary.md").read_text()
    assert (folder / "problem_deltas.csv").is_file() and (folder / "paired_differences.png").is_file()

    # rerun: both finished, nothing trains again
    before = (folder / "features-logits" / "metrics.jsonl").stat().st_mtime_ns
    again = ablate(folder)
    assert again.exit_code == 0, again.output
    assert again.output.count("finished, skipped") == 2
    assert (folder / "features-logits" / "metrics.jsonl").stat().st_mtime_ns == before

    # an interrupted variant (checkpoint at step 1, no eval yet) resumes from its checkpoint
    run = folder / "features-random"
    shutil.rmtree(run / "checkpoints" / "step_2")
    shutil.rmtree(run / "eval")
    resumed = ablate(folder)
    assert resumed.exit_code == 0, resumed.output
    assert "features-random: resuming from step 1" in resumed.output and resumed.output.count("finished, skipped") == 1
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (run / "eval" / "heldout" / "results.json").is_file()

    # the same folder with other settings for a variant is refused
    other = runner.invoke(app, ["ablate", *sum((["--set", s] for s in TINY_SETS), []), "--set", "meds.alpha=0.5",
                                "--steps", "2", "--features", "logits", "--no-baseline", "--output", str(folder)])
    assert other.exit_code == 2 and "another base config" in other.output


def test_curves_over_seeds_mean_and_std():
    from types import SimpleNamespace

    from meds_cli.commands.ablate_report import curves_over_seeds

    variants = [SimpleNamespace(name=f"v{i}", group=g) for i, g in enumerate(["a", "a", "b"])]
    results = {"v0": {"c": [[1, 0.2], [2, 0.4]]}, "v1": {"c": [[1, 0.4]]}, "v2": {"c": [[1, 1.0]]}}
    curves = curves_over_seeds(variants, results, "c")
    xs, mean, std = curves["a"]
    # step 1: values 0.2, 0.4 -> mean 0.3, std (ddof 1) sqrt(0.02) = 0.141421; step 2: only 0.4, std 0
    assert xs == [1, 2] and mean.tolist() == pytest.approx([0.3, 0.4])
    assert std.tolist() == pytest.approx([0.141421, 0.0], abs=1e-6)
    assert curves["b"][1].tolist() == [1.0] and curves["b"][2].tolist() == [0.0]
