"""Sample rows of a step: responses with their answers, rewards before and after shaping, advantages, extras."""

import json

import torch

from meds_cli.core.records import Problem, Verdict
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.run_folders.samples_log import sample_rows, samples_path, should_log_samples, write_samples


def _rollouts(advantages):
    """3 groups of 2 responses (response width 3); MEDS-like extras: a label per response and a feature matrix."""
    problems = [Problem("p0", "What is 2 * 3?", "6"), Problem("p1", "What is 1 + 1?", "2"), Problem("p2", "x", "0")]
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0]], dtype=torch.float)
    return Rollouts(
        problems=problems, group_size=2,
        input_ids=torch.zeros(6, 5, dtype=torch.long), attention_mask=torch.ones(6, 5, dtype=torch.long),
        prompt_width=2,
        response_ids=torch.zeros(6, 3, dtype=torch.long), response_mask=mask,
        response_texts=["6", "so 5", "2", "\\boxed{3}", "0", "1"],
        truncated=torch.tensor([False, True, False, False, False, False]),
        verdicts=[Verdict(True, "6", "correct"), Verdict(False, "5", "wrong"), Verdict(True, "2", "correct"),
                  Verdict(False, "3", "wrong"), Verdict(True, "0", "correct"), Verdict(False, "1", "wrong")],
        reward_components={"correctness": torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
                           "overlong": torch.tensor([0.0, -0.5, 0.0, 0.0, 0.0, 0.0])},
        rewards=torch.tensor([1.0, -0.7, 1.0, -0.1, 1.0, 0.0]),  # after a shaping step took 0.2 and 0.1 off
        advantages=advantages,
        extras={"meds_label": torch.tensor([-1, 0, -1, 3, -1, -1]), "meds_features": torch.zeros(6, 4),
                "answer_class": [0, 1, 0, None, 0, 1], "per_prompt": ["a", "b", "c"]},
    )


def test_rows_of_the_first_groups_carry_rewards_before_and_after_shaping():
    rows = sample_rows(_rollouts(torch.tensor([0.7, -0.7, 0.7, -0.7, 0.5, -0.5])), step=4, groups=2)
    assert len(rows) == 4  # two groups of two
    second = rows[1]
    assert second["problem_id"] == "p0" and second["sample"] == 1 and second["prompt"] == "What is 2 * 3?"
    assert second["gold"] == "6" and second["response"] == "so 5" and second["extracted"] == "5"
    assert second["correct"] is False and second["outcome"] == "wrong" and second["truncated"] is True
    assert second["response_tokens"] == 3
    assert second["reward/correctness"] == 0.0 and second["reward/overlong"] == -0.5
    assert second["reward_raw"] == -0.5  # 0.0 + (-0.5)
    assert abs(second["reward_shaped"] - (-0.7)) < 1e-6
    assert abs(second["advantage"] - (-0.7)) < 1e-6
    assert rows[3]["meds_label"] == 3 and rows[0]["meds_label"] == -1
    assert rows[3]["answer_class"] is None and rows[2]["answer_class"] == 0
    assert "meds_features" not in second and "per_prompt" not in second  # not one scalar per response
    assert all(row["step"] == 4 for row in rows)


def test_token_level_advantages_are_averaged_over_the_response_tokens():
    per_token = torch.tensor([[1.0, 3.0, 9.0], [2.0, 4.0, 6.0], [5.0, 0.0, 0.0],
                              [1.0, 2.0, 9.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    rows = sample_rows(_rollouts(per_token), step=1, groups=1)
    assert [row["advantage"] for row in rows] == [2.0, 4.0]  # mean of (1, 3) and of (2, 4, 6)


def test_a_batch_before_shaping_has_no_advantages_and_more_groups_than_asked_are_not_invented():
    batch = _rollouts(None)
    batch.rewards = None
    rows = sample_rows(batch, step=1, groups=10)
    assert len(rows) == 6
    assert rows[0]["advantage"] is None and rows[0]["reward_shaped"] is None and rows[0]["reward_raw"] == 1.0


def test_rows_are_written_as_json_lines_and_rewritten_whole(tmp_path):
    rows = sample_rows(_rollouts(torch.zeros(6)), step=2)
    path = write_samples(tmp_path, 2, rows)
    assert path == samples_path(tmp_path, 2) == tmp_path / "samples" / "step_2.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    write_samples(tmp_path, 2, rows[:1])
    assert len(path.read_text().splitlines()) == 1


def test_samples_are_logged_every_n_steps_and_never_with_zero():
    assert [s for s in range(1, 10) if should_log_samples(s, 3)] == [3, 6, 9]
    assert not any(should_log_samples(s, 0) for s in range(1, 10))
