"""Rollouts bookkeeping: selecting groups and joining batches of different widths."""

import torch

from meds_cli.core.rollouts import Rollouts
from tests.rollout_factory import make_rollouts


def test_concat_repads_prompt_left_and_response_right():
    a = make_rollouts([True, False], 2, lengths=[2, 3], width=3)
    b = make_rollouts([False, False, True, True], 2, lengths=[5, 1, 2, 4], width=5)
    a.input_ids, a.prompt_width = torch.ones(2, 2 + 3, dtype=torch.long), 2
    b.input_ids = torch.full((4, 4 + 5), 2, dtype=torch.long)
    b.attention_mask = torch.ones(4, 9, dtype=torch.long)
    b.prompt_width = 4
    a.extras["tag"] = ["a0", "a1"]
    b.extras["tag"] = ["b0", "b1", "b2", "b3"]
    a.old_logp, b.old_logp = torch.full((2, 3), -1.0), torch.full((4, 5), -2.0)
    joined = Rollouts.concat([a, b], pad_id=9)
    assert joined.size == 6 and joined.num_groups == 3 and joined.prompt_width == 4
    assert joined.input_ids.shape == (6, 9)
    # a's rows: 2 columns of left padding, its 5 tokens, 2 columns of right padding
    assert joined.input_ids[0].tolist() == [9, 9, 1, 1, 1, 1, 1, 9, 9]
    assert joined.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert joined.response_mask[1].tolist() == [1, 1, 1, 0, 0]
    assert joined.old_logp[0].tolist() == [-1, -1, -1, 0, 0]
    assert joined.response_lengths.tolist() == [2, 3, 5, 1, 2, 4]
    assert joined.extras["tag"] == ["a0", "a1", "b0", "b1", "b2", "b3"]
    assert joined.ref_logp is None and [v.correct for v in joined.verdicts] == [True, False, False, False, True, True]


def test_select_groups_keeps_rows_of_kept_groups():
    batch = make_rollouts([True, False, False, False, True, True], 2)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    batch.extras["tag"] = list("abcdef")
    kept = batch.select_groups(torch.tensor([True, False, True]))
    assert [p.id for p in kept.problems] == ["p0", "p2"]
    assert kept.rewards.tolist() == [1.0, 0.0, 1.0, 1.0] and kept.extras["tag"] == list("abef")
    assert kept.old_logp is None and kept.advantages is None
