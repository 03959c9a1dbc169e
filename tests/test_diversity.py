"""Diversity diagnostics (algorithms/diversity.py, meds_cli/engine/training/diversity.py): hand-built
groups with values computed by hand, and a tiny GRPO run whose metrics.jsonl and ablate report carry them."""

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from algorithms.diversity import (
    distinct_labels,
    distinct_wrong_answers,
    l2_normalize,
    masked_token_mean,
    mean_group_eigen_ratio,
    one_repeated_error,
    top1_eigen_ratio,
)
from meds_cli.app import app
from meds_cli.core.forward import LensProbe
from meds_cli.engine.training.diversity import diversity_metrics, diversity_probe
from tests.rollout_factory import make_rollouts

# ---------------------------------------------------------------- answers


def test_distinct_wrong_answers_counts_classes_of_wrong_answered_responses():
    # wrong answers 7, 7, 8 and one wrong response without an answer (None): 2 classes, None adds none
    labels, correct = ["7", "7", "8", None, "3"], [False, False, False, False, True]
    assert distinct_wrong_answers(labels, correct) == 2
    assert distinct_labels(labels) == 3  # 7, 8, 3
    assert distinct_labels(labels, [c for c in correct]) == 1  # the correct one
    assert distinct_wrong_answers([None, None], [False, False]) == 0  # no answer is not an answer
    assert distinct_wrong_answers(["3", "3"], [True, True]) == 0  # no wrong response


def test_one_repeated_error():
    assert one_repeated_error(["7", "7", "3"], [False, False, True]) is True  # two wrong, both 7
    assert one_repeated_error(["7", "8", "7"], [False, False, False]) is False  # two modes
    assert one_repeated_error(["7", None, None], [False, False, False]) is None  # one answered wrong: no mode
    assert one_repeated_error(["7", "7", None], [False, False, False]) is True  # no-answer responses do not count
    assert one_repeated_error(["3", "3"], [True, True]) is None  # no error at all


# ---------------------------------------------------------------- eigen ratio


def test_l2_normalize_keeps_zero_rows_and_drops_nan():
    x = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0], [np.nan, 2.0]]))
    assert x.tolist() == [[0.6, 0.8], [0.0, 0.0], [0.0, 1.0]]


def test_eigen_ratio_of_identical_features_is_one():
    assert top1_eigen_ratio(np.ones((4, 3))) == 1.0  # every eigenvalue 0: fully collapsed
    assert top1_eigen_ratio(np.tile([[0.3, -2.0, 5.0]], (8, 1))) == 1.0
    assert top1_eigen_ratio(np.ones((1, 3))) is None  # one row has no spread


@pytest.mark.parametrize("n", [2, 3, 5])
def test_eigen_ratio_of_n_orthogonal_equal_norm_directions_is_one_over_n(n):
    # +-e_1 .. +-e_n (each direction with its opposite, mean 0): covariance 2/(2n-1) * I_n -> 1/n
    directions = np.eye(n) * 2.5
    assert top1_eigen_ratio(np.vstack([directions, -directions])) == pytest.approx(1 / n)
    # e_1 .. e_n alone: around their mean they span an (n-1)-simplex, the centred covariance has
    # n - 1 equal eigenvalues and a 0 along (1, ..., 1): 1/(n-1) (module docstring)
    assert top1_eigen_ratio(np.eye(n)) == pytest.approx(1 / (n - 1))


def test_eigen_ratio_hand_computed_2x2():
    # rows (2,1), (0,-1), (-2,-1), (0,1): mean 0; sums x^2 = 8, y^2 = 4, xy = 4; ddof 1:
    # cov = [[8, 4], [4, 4]] / 3; eigenvalues of [[8,4],[4,4]]: 6 +- sqrt(36 - 16) = 6 +- 2 sqrt(5)
    # ratio = (6 + 2 sqrt 5) / 12 = 0.5 + sqrt(5) / 6 = 0.872678
    points = np.array([[2, 1], [0, -1], [-2, -1], [0, 1]], dtype=float)
    assert top1_eigen_ratio(points) == pytest.approx(0.5 + math.sqrt(5) / 6)
    # axis-aligned: var x = 2/3, var y = 1/6 -> (2/3) / (2/3 + 1/6) = 0.8
    assert top1_eigen_ratio(np.array([[1, 0], [-1, 0], [0, 0.5], [0, -0.5]])) == pytest.approx(0.8)


def test_mean_group_eigen_ratio_normalises_each_row_then_averages_groups():
    # group 1: one direction at three lengths -> normalised identical -> 1
    # group 2: +-e_1, +-e_2 at lengths 3, 1, 2, 5 -> normalised +-e_1, +-e_2 -> 1/2; mean 0.75
    features = torch.tensor([[1.0, 1.0], [2.0, 2.0], [5.0, 5.0], [0.5, 0.5],
                             [3.0, 0.0], [-1.0, 0.0], [0.0, 2.0], [0.0, -5.0]])
    assert mean_group_eigen_ratio(features, [slice(0, 4), slice(4, 8)]) == pytest.approx(0.75)
    assert mean_group_eigen_ratio(features, [slice(0, 1)]) is None  # no group of two


def test_masked_token_mean():
    # tokens 1, 2 of row 0 and 4 of row 1: (1 + 2 + 4) / 3
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_token_mean(entropy, mask) == pytest.approx(7 / 3)
    assert masked_token_mean(entropy, torch.zeros_like(mask)) == 0.0


# ---------------------------------------------------------------- the step's metrics


def _four_groups():
    # g1: 7, 7 wrong, 3 correct, no answer -> 1 distinct wrong, one repeated error
    # g2: 7, 8 wrong, two without answer -> 2 distinct wrong, not one error
    # g3: 5, 5, 5 correct, 6 wrong -> 1 distinct wrong, one wrong answer: not judged
    # g4: nothing answered -> 0, not judged
    correct = [False, False, True, False, False, False, False, False, True, True, True, False] + [False] * 4
    answers = ["7", "7", "3", None, "7", "8", None, None, "5", "5", "5", "6", None, None, None, None]
    return make_rollouts(correct, 4, answers=answers)


def test_diversity_metrics_from_hand_built_groups():
    sampled = _four_groups()
    out = diversity_metrics(sampled, None)
    assert out["diversity/distinct_wrong_per_group"] == pytest.approx((1 + 2 + 1 + 0) / 4)
    assert out["diversity/one_error_group_share"] == pytest.approx(1 / 2)  # g1 of g1, g2
    assert "diversity/entropy" not in out and "diversity/eigen_ratio_top1" not in out  # no update, no probe
    # counts are summed over processes before the division: another process with 1 of 1 -> 2 / 3
    others = iter([1.0, 1.0])
    summed = diversity_metrics(sampled, None, total=lambda count: count + next(others))
    assert summed["diversity/one_error_group_share"] == pytest.approx(2 / 3)
    # no group with two answered wrong responses: no share (not 0: there is no error mode to judge)
    right = make_rollouts([True] * 4, 4, answers=["1"] * 4)
    assert "diversity/one_error_group_share" not in diversity_metrics(right, None)


def test_diversity_metrics_entropy_over_the_trained_tokens():
    trained = make_rollouts([True, False], 2, lengths=[2, 1], width=3)
    trained.entropy = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    assert diversity_metrics(trained, trained)["diversity/entropy"] == pytest.approx(7 / 3)


def test_diversity_metrics_eigen_ratio_at_the_answer_token():
    # Responses without \boxed{: y* is each one's last token (index 3 of 4). Group 1's values there
    # are one direction (ratio 1), group 2's +-e_1, +-e_2 (1/2); the other tokens' values must not count.
    sampled = make_rollouts([False] * 8, 4, answers=["1", "2", "3", "4"] * 2)
    at_answer = [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]
    sampled.sampler_lens = []
    for value in at_answer:
        lens = torch.randn(4, 2)
        lens[3] = torch.tensor(value)
        sampled.sampler_lens.append(lens)
    tokenizer = object()  # never asked: no response has a box to find
    out = diversity_metrics(sampled, None, tokenizer)
    assert out["diversity/eigen_ratio_top1"] == pytest.approx(0.75)
    assert "diversity/eigen_ratio_top1" not in diversity_metrics(sampled, None)  # no probe recorded


def test_diversity_probe_is_shared_with_the_same_layers_and_off_otherwise():
    probe, why = diversity_probe("last_half", 4, True, None)
    assert probe == LensProbe((3, 4), False) and why is None
    assert diversity_probe("last:2", 4, True, LensProbe((3, 4), False)) == (LensProbe((3, 4), False), None)
    probe, why = diversity_probe("last_half", 4, True, LensProbe((2, 3, 4), False))
    assert probe is None and "train.diversity_layers" in why and "[2, 3, 4]" in why
    probe, why = diversity_probe("last_half", 4, False, None)
    assert probe is None and "records no logit-lens" in why
    assert diversity_probe("none", 4, True, None) == (None, None)


# ---------------------------------------------------------------- a run, and the report reading it


DIVERSITY_KEYS = ("diversity/distinct_wrong_per_group", "diversity/entropy", "diversity/eigen_ratio_top1")


def test_grpo_run_logs_the_diversity_keys_and_the_report_reads_them(tmp_path):
    from types import SimpleNamespace

    from meds_cli.commands.ablate_report import STEP_CURVES, plot_step_diagnostics, variant_result

    run = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "--algo", "grpo", "--model", "tiny-llama", "--task", "copy", "--steps", "2", "--output", str(run),
        "-q", "--set", "rollout.max_new_tokens=3", "--set", "rollout.prompts_per_step=4",
        "--set", "rollout.group_size=4", "--set", "train.checkpoint_every=0"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        for key in DIVERSITY_KEYS:
            assert key in row, key
        assert row["diversity/distinct_wrong_per_group"] == row["distinct_wrong_answers_per_group"]
        assert row["diversity/entropy"] == row["entropy"] > 0
        assert 0 < row["diversity/eigen_ratio_top1"] <= 1
        assert not any(key.startswith("meds/") for key in row)  # GRPO: no MEDS metrics, the diagnostics still
    report = variant_result(run, run / "no-eval" / "results.json")
    for value in ("distinct_wrong", "entropy", "eigen_ratio"):
        assert report[value] is not None, value
    assert report["clusters"] is None  # MEDS's own
    assert [step for step, _ in report["eigen_ratio_curve"]] == [1, 2]
    assert [value for _, value in report["distinct_wrong_curve"]] == [r["diversity/distinct_wrong_per_group"]
                                                                      for r in rows]
    plot_step_diagnostics([SimpleNamespace(name="grpo", group="grpo")], {"grpo": report}, tmp_path / "d.png")
    assert (tmp_path / "d.png").stat().st_size > 0 and len(STEP_CURVES) == 6


def test_the_report_reads_older_runs_from_the_older_keys(tmp_path, monkeypatch):
    from meds_cli.commands import ablate_report

    monkeypatch.setattr(ablate_report, "memory_ari", lambda run_dir: None)  # no config, no memory here

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 1, "reward": 0.5, "distinct_wrong_answers_per_group": 2.0, "entropy": 1.5,
         "meds/eigen_ratio_top1": 0.9, "time_step_s": 1.0}]))
    report = ablate_report.variant_result(tmp_path, tmp_path / "results.json")
    assert (report["distinct_wrong"], report["entropy"], report["eigen_ratio"]) == (2.0, 1.5, 0.9)
    assert report["one_error"] is None and report["eigen_ratio_curve"] == [[1, 0.9]]


def test_the_probe_changes_nothing_the_run_trains_on(tmp_path):
    """Recording the diversity probe's values while sampling leaves the samples and the update as
    they are without it: every logged number but the probe's own is the same."""
    from meds_cli.engine.trainer import Trainer
    from tests.conftest import tiny_config

    rows = {}
    for name, extra in (("probe", []), ("none", ["train.diversity_layers=none"])):
        cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
                          *extra, output_dir=tmp_path / name)
        trainer = Trainer(cfg, tmp_path / name)
        assert (trainer.lens_probe is not None) == (name == "probe")
        rows[name] = [trainer.train_step() for _ in range(2)]
    for probed, plain in zip(rows["probe"], rows["none"]):
        assert "diversity/eigen_ratio_top1" in probed and "diversity/eigen_ratio_top1" not in plain
        same = [k for k in plain if not k.startswith("time_") and k != "tokens_per_s"]
        assert {k: probed[k] for k in same} == {k: plain[k] for k in same}
