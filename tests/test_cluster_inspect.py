"""`meds cluster-inspect` on a short real MEDS run of the tiny model."""

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.commands.cluster_inspect import inspect_run
from meds_cli.core.errors import UserError
from meds_cli.engine.config import dump_yaml
from meds_cli.engine.run_folders.checkpoint_store import write_manifest
from meds_cli.engine.run_folders.state_codec import save_state
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config

PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("meds-run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster than two fighting for a shared CPU
    cfg = tiny_config("algo.name=meds", "train.steps=3", "rollout.prompts_per_step=4", "rollout.group_size=8",
                      "rollout.max_new_tokens=6", "dapo.dynamic_sampling=false", "meds.snippet_chars=8")
    trainer = Trainer(cfg, folder)
    dump_yaml(cfg, folder / "config.yaml", sections=trainer.algorithm.config_sections)  # as `meds train` does
    try:
        trainer.train()  # checkpoint at the last step
    finally:
        torch.set_num_threads(threads)
    return folder


def test_report_and_plots(run_dir, tmp_path):
    report = inspect_run(run_dir, output=tmp_path / "png")
    assert report["checkpoint_step"] == 3 and report["layers"] == [3, 4]
    rows = report["prompts"]
    assert rows and all(r["entries"] == r["wrong"] + r["correct"] for r in rows)
    chosen = report["prompt"]
    assert chosen["prompt"] == max(rows, key=lambda r: (r["largest_wrong_cluster"], r["entries"]))["prompt"]
    assert sum(c["size"] for c in chosen["clusters_detail"]) == chosen["entries"]
    # issue 54: the question and its gold answer, as the run's task has them
    from benchmarks.tasks import build_task
    from meds_cli.engine.config import load_config

    cfg = load_config([str(run_dir / "config.yaml")])
    problem = next(p for p in build_task(cfg.task, cfg.train.seed).train if p.id == chosen["prompt"])
    assert chosen["question"] == problem.question and chosen["gold"] == problem.answer
    for c in chosen["clusters_detail"]:
        assert 0.0 <= c["share_wrong"] <= 1.0 and len(c["samples"]) <= 2
        assert all(len(s) <= 8 for s in c["samples"])  # snippets are bounded in memory
    assert [p[0] for p in report["steps"]["meds/eigen_ratio_top1"]] == [1, 2, 3]
    for path in report["plots"].values():
        assert path.startswith(str(tmp_path / "png"))
        with open(path, "rb") as f:
            assert f.read(4) == PNG


def test_cli_json_prompt_and_step(run_dir, tmp_path):
    runner = CliRunner()
    first = inspect_run(run_dir, output=tmp_path)["prompts"][0]["prompt"]
    result = runner.invoke(app, ["cluster-inspect", str(run_dir), "--json", "--step", "3", "--prompt", first,
                                 "--output", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["prompt"]["prompt"] == first and data["checkpoint_step"] == 3
    assert set(data["plots"]) == {"projection", "heatmap", "steps"}
    table = runner.invoke(app, ["cluster-inspect", str(run_dir), "--output", str(tmp_path / "cli")])
    assert table.exit_code == 0 and "clusters" in table.stdout
    assert (run_dir / "inspect").exists() is False  # --output was honoured


@pytest.mark.parametrize("args, message", [
    (["--step", "2"], "no checkpoint at step 2"),
    (["--prompt", "copy-77"], "not in the memory"),
])
def test_user_errors_exit_2(run_dir, args, message):
    result = CliRunner().invoke(app, ["cluster-inspect", str(run_dir), *args])
    assert result.exit_code == 2 and message in result.output


def test_not_a_run_and_not_meds(run_dir, tmp_path):
    result = CliRunner().invoke(app, ["cluster-inspect", str(tmp_path)])
    assert result.exit_code == 2 and "not a run folder" in result.output
    other = tmp_path / "dapo-run"
    shutil.copytree(run_dir, other)
    folder = other / "checkpoints/step_3"
    save_state({"base": {}}, folder, "algorithm_0")  # what a DAPO run saves
    write_manifest(folder, step=3)
    with pytest.raises(UserError, match="not meds"):
        inspect_run(other)


def test_with_no_run_named_the_newest_run_is_inspected(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["cluster-inspect", "--json"])
    assert result.exit_code == 2 and "no run folder under 'runs'" in result.output
    shutil.copytree(run_dir, tmp_path / "runs" / "20260101-000000-meds")
    result = CliRunner().invoke(app, ["cluster-inspect", "--json", "--output", str(tmp_path / "png")])
    assert result.exit_code == 0, result.output
    assert "inspecting the newest run, runs/20260101-000000-meds" in result.output


def saved_run(folder, algo, cfg, step):
    """A run folder as `meds train` leaves it, with only what cluster-inspect reads."""
    folder.mkdir()
    dump_yaml(cfg, folder / "config.yaml", sections=algo.config_sections)
    checkpoint = folder / "checkpoints" / f"step_{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_text(json.dumps({"algorithm": "meds", "step": step}))
    save_state(algo.state_dict(), checkpoint, "algorithm_0")
    write_manifest(checkpoint, step=step)
    return folder


def test_random_control_is_inspected_as_it_was_trained(tmp_path):
    """cluster-inspect and ablate's report read the clustering from the run's config the way
    training does: for the random control, the same shuffled labels as training stored."""
    import numpy as np

    from algorithms.meds_clusterers import cluster_settings
    from meds_cli.commands.ablate_report import memory_ari
    from meds_cli.commands.cluster_inspect import analyse_prompt, load_memory, run_settings
    from meds_cli.engine.training.algorithm_setup import build_algorithm
    from tests.test_meds_shaping import batch

    cfg = tiny_config("algo.name=meds", "meds.features=random")
    algo = build_algorithm(cfg)
    rng = np.random.default_rng(0)
    for step in (1, 2):  # 8 wrong responses a step around two modes, plus a lone one
        modes = [[1.0, 0.2, 0.0]] * 4 + [[0.0, 1.0, 0.3]] * 3 + [[-1.0, -1.0, 1.0]]
        features = (np.array(modes) + 0.01 * rng.standard_normal((8, 3))).tolist()
        r = batch(features, [False] * 8, 8, answers=["5"] * 4 + ["6"] * 3 + ["7"])
        algo.shape_rewards(r)
        algo.on_step_end(r, step)
    trained = algo.memory.bank("p0", "wrong", 3).labels  # the fit over memory + step 2, shuffled
    run_dir = saved_run(tmp_path / "random-run", algo, cfg, 2)
    _, memory, _ = load_memory(run_dir, None)
    inspected = analyse_prompt("p0", memory["p0"], run_settings(run_dir))["_labels"].tolist()
    assert inspected == trained
    plain = cluster_settings(tiny_config("algo.name=meds").section("meds"))  # what was read before
    assert plain.labels(memory["p0"]["wrong"]["features"]).tolist() != trained
    # ablate's report scores the same labels
    from sklearn.metrics import adjusted_rand_score

    answers = memory["p0"]["wrong"]["answers"]
    clusters = [f"c{v}" if v >= 0 else f"n{i}" for i, v in enumerate(trained)]
    assert memory_ari(run_dir) == pytest.approx(adjusted_rand_score(answers, clusters))


def test_the_printed_report_shows_the_question_and_gold_answer(run_dir, tmp_path):
    first = inspect_run(run_dir, output=tmp_path)["prompts"][0]["prompt"]
    result = CliRunner().invoke(app, ["cluster-inspect", str(run_dir), "--prompt", first, "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"prompt {first}: " in result.output and "gold answer: " in result.output
