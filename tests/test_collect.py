"""The dynamic-sampling rounds (engine/training/collect.py) with fakes in place of the engine, the
algorithm and the other processes: how many rounds run, which groups are kept and trained, and
that a process whose quota is full still enters every round."""

import torch

from meds_cli.engine.training.collect import collect_groups
from tests.rollout_factory import make_rollouts

G = 2  # responses per group


class Sampler:
    """Problem indices in order, as PromptSampler hands them out."""

    def __init__(self):
        self.position = 0

    def take(self, count):
        out = list(range(self.position, self.position + count))
        self.position += count
        return out


class KeepsEven:
    """An algorithm that keeps the groups of even problem indices (a stand-in for DAPO's filter)."""

    def __init__(self, rounds):
        self.rounds = rounds

    def generation_rounds(self):
        return self.rounds

    def keep_groups(self, part):
        return torch.tensor([int(p.id) % 2 == 0 for p in part.problems])


class Alone:
    """The collectives of a single process."""

    world = 1

    def any(self, flag):
        return flag

    def min(self, value):
        return value


class OtherStillSampling(Alone):
    """Two processes; the other one always wants another round and has as many groups as we do."""

    world = 2

    def any(self, flag):
        return True


def sampling(calls):
    def sample(indices):
        calls.append(list(indices))
        part = make_rollouts([True] * (len(indices) * G), G)
        for problem, index in zip(part.problems, indices):
            problem.id = str(index)
        return part
    return sample


def test_rounds_run_until_the_quota_is_kept_and_the_batch_is_cut_to_it():
    calls = []
    batch, sampled, info = collect_groups(Sampler(), KeepsEven(rounds=5), sampling(calls), Alone(),
                                          prompts_per_step=3, rank=0, sample_when_full=False, pad_token_id=0)
    # round 1 takes 0,1,2 and keeps 0,2; round 2 takes 3,4,5 and keeps 4: 3 >= 3, stop
    assert calls == [[0, 1, 2], [3, 4, 5]]
    assert info == {"groups_sampled": 6, "groups_kept": 3, "generation_rounds": 2, "groups_dropped": 3,
                    "groups_trained": 3}
    assert [p.id for p in batch.problems] == ["0", "2", "4"] and sampled.num_groups == 6


def test_the_round_limit_leaves_a_short_batch_or_none():
    batch, _, info = collect_groups(Sampler(), KeepsEven(rounds=1), sampling([]), Alone(),
                                    prompts_per_step=3, rank=0, sample_when_full=False, pad_token_id=0)
    assert info["groups_trained"] == 2 and [p.id for p in batch.problems] == ["0", "2"]
    odd_only = Sampler()
    odd_only.position = 1
    batch, sampled, info = collect_groups(odd_only, KeepsEven(rounds=1), sampling([]), Alone(),
                                          prompts_per_step=1, rank=0, sample_when_full=False, pad_token_id=0)
    assert batch is None and info["groups_trained"] == 0 and sampled.num_groups == 1


def test_a_process_with_its_quota_still_enters_every_round():
    # rank 0 of 2: its share of a round of 2 prompts is the even index, so it is full after round 1
    for sample_when_full, second_round in ((False, []), (True, [2])):
        calls = []
        batch, _, info = collect_groups(Sampler(), KeepsEven(rounds=2), sampling(calls), OtherStillSampling(),
                                        prompts_per_step=2, rank=0, sample_when_full=sample_when_full,
                                        pad_token_id=0)
        assert calls == [[0], second_round]
        # the trained groups are cut to the quota even where more were kept
        assert info["generation_rounds"] == 2 and info["groups_trained"] == 1 and batch.num_groups == 1
