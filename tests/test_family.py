"""The exploration family's plug-ins (docs/algorithms.md): each formula against its reference
code's own outputs on the same tensors (tests/fixtures/family_references.json, made by running
the function named there, at the commit named there, in a scratch environment), the hooks on
hand-built batches, bad settings refused at config load, and one training step of each on the
tiny model."""

import json
import math
from pathlib import Path

import pytest
import torch

from algorithms import ALGORITHMS
from algorithms.advantages import ADV_ESTIMATORS, group_advantages, passk_group_advantages
from algorithms.outcome_ucb import exploration_terms, ucb_bonus
from algorithms.policy_loss import POLICY_LOSSES, agg_loss, clip_cov_loss, clipped_surrogate
from algorithms.unlikeliness import sequence_logprob, unlikeliness_rewards
from algorithms.w_reinforce import psr_nsr_advantages
from meds_cli.core.errors import UserError
from meds_cli.core.records import Problem, Verdict
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training.algorithm_setup import build_algorithm
from meds_cli.engine.training.logprobs import token_logprobs_and_entropy
from tests.conftest import needs_embedded, tiny_config

REFERENCES = json.loads((Path(__file__).parent / "fixtures" / "family_references.json").read_text())


def batch(verdicts: list[Verdict], group_size: int, old_logp=None, mask=None) -> Rollouts:
    """A hand-built batch: verdicts (and old log-probs where a method reads them)."""
    size = len(verdicts)
    width = old_logp.shape[1] if old_logp is not None else 3
    return Rollouts(
        problems=[Problem(id=f"p{g}", question="q", answer="1") for g in range(size // group_size)],
        group_size=group_size, input_ids=torch.zeros(size, 2 + width, dtype=torch.long),
        attention_mask=torch.ones(size, 2 + width, dtype=torch.long), prompt_width=2,
        response_ids=torch.zeros(size, width, dtype=torch.long),
        response_mask=mask if mask is not None else torch.ones(size, width),
        response_texts=[""] * size, truncated=torch.zeros(size, dtype=torch.bool), verdicts=verdicts,
        old_logp=old_logp)


def graded(answers_and_correct) -> list[Verdict]:
    return [Verdict(ok, answer, "correct" if ok else ("wrong" if answer else "no_answer"))
            for answer, ok in answers_and_correct]


def rewarded(algo, r: Rollouts) -> Rollouts:
    r.reward_components = algo.reward_components(r)
    r.rewards = sum(r.reward_components.values())
    return r


# ---------------------------------------------------------------- pass@k advantages


@pytest.mark.parametrize("case", REFERENCES["passk"]["cases"], ids=lambda c: f"k{c['k']}")
def test_passk_matches_passk_training(case):
    """Reference: RUCAIBox/Passk_Training c3ba575ecb31f47fd9f5c43b18c081d4a295f783, code/passk_adv.py calc_adv."""
    ref = REFERENCES["passk"]
    passed = torch.tensor(ref["rewards"]) > 0
    ours = passk_group_advantages(passed, ref["group_size"], case["k"])
    assert ours.tolist() == pytest.approx(case["advantages"], abs=1e-6)


def test_passk_k1_is_grpo_with_the_population_std():
    # pass@1: rho = c/n, sigma = sqrt(rho (1 - rho)) (population std of 0/1 rewards)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    grouped = rewards.view(-1, 6)
    expected = (grouped - grouped.mean()) / (grouped.std(unbiased=False) + 1e-6)
    assert passk_group_advantages(rewards > 0, 6, 1).tolist() == pytest.approx(expected.view(-1).tolist(), abs=1e-6)


def test_passk_estimator_by_config_and_bad_k():
    assert "passk" in ADV_ESTIMATORS
    cfg = tiny_config("algo.name=grpo", "grpo.adv_estimator=passk", "grpo.passk_k=8")
    algo = build_algorithm(cfg)
    r = rewarded(algo, batch(graded([("1", True)] * 2 + [("2", False)] * 14), 16))
    # n 16, c 2, k 8: rho = 1 - C(14,8)/C(16,8) = 1 - 3003/12870 = 0.766667, sigma = 0.422953
    # A_pass = 0.233333 / 0.422953 = 0.551677; A_fail = (0.233333 - C(13,7)/C(15,7)) / sigma
    #        = (0.233333 - 1716/6435) / 0.422953 = -0.078811
    adv = algo.compute_advantages(r)
    assert adv[:2].tolist() == pytest.approx([0.551677] * 2, abs=1e-5)
    assert adv[2:].tolist() == pytest.approx([-0.078811] * 14, abs=1e-5)
    with pytest.raises(UserError, match=r"dapo.passk_k=32 must be at most rollout.group_size=16"):
        tiny_config("algo.name=dapo", "dapo.adv_estimator=passk", "dapo.passk_k=32")
    with pytest.raises(UserError, match=r"dapo.passk_k=32"):  # the base's k, under a shaping method
        tiny_config("algo.name=edas", "dapo.adv_estimator=passk", "dapo.passk_k=32")


# ---------------------------------------------------------------- W-REINFORCE


@pytest.mark.parametrize("case", REFERENCES["w_reinforce"]["cases"], ids=lambda c: f"{c['mode']}-{c['weight']}")
def test_w_reinforce_matches_rlvr_decomposed(case):
    """Reference: TianHongZXY/RLVR-Decomposed a5d4e7c1df6016ebd7396bd6db83d885120adb6d,
    verl/trainer/ppo/core_algos.py compute_psr_nsr_outcome_advantage."""
    ref = REFERENCES["w_reinforce"]
    correct = torch.tensor(ref["correct"]) > 0
    mode = {"weighted": "weighted", "positive": "psr", "negative": "nsr"}[case["mode"]]
    ours = psr_nsr_advantages(correct.float(), correct, mode, case["weight"] or 0.0, 1.0, 0.0)
    # the reference gives every token of a response its return; token 0 is inside every response
    assert ours.tolist() == pytest.approx([row[0] for row in case["advantages"]], abs=1e-7)


def test_w_reinforce_hook_metrics_and_reward_values():
    algo = build_algorithm(tiny_config("algo.name=w-reinforce", "algo.base=grpo", "reward.wrong=-1",
                                       "w-reinforce.positive_weight=0.5"))
    r = rewarded(algo, batch(graded([("1", True), ("2", False), ("3", False), ("1", True)]), 4))
    # rewards 1 -1 -1 1 with r_correct 1, r_wrong -1: correct 0.5 * (1 + 1) = 1, wrong -1 - 1 = -2
    assert algo.compute_advantages(r).tolist() == [1.0, -2.0, -2.0, 1.0]
    metrics = algo.step_metrics(r)
    assert metrics["w-reinforce/reweighted"] == 2 and metrics["w-reinforce/penalty_mean"] == -2.0


@pytest.mark.parametrize("mode,advantages,kept", [
    # rewards 1 -1 -1 1 (reward.wrong -1): psr 1 - (-1) = 2 on correct rows, nsr -1 - 1 = -2 on wrong rows
    ("psr", [2.0, 0.0, 0.0, 2.0], [1.0, 0.0, 0.0, 1.0]),
    ("nsr", [0.0, -2.0, -2.0, 0.0], [0.0, 1.0, 1.0, 0.0]),
    ("weighted", [0.2, -2.0, -2.0, 0.2], [1.0, 1.0, 1.0, 1.0]),  # lambda 0.1 * 2
])
def test_psr_and_nsr_leave_the_other_rows_out_of_the_loss(mode, advantages, kept):
    """The reference trainer drops the rows PSR / NSR do not train on (batch.subset): here they leave
    the loss mask, so token-mean counts only the kept rows' tokens."""
    algo = build_algorithm(tiny_config("algo.name=w-reinforce", "algo.base=grpo", "reward.wrong=-1",
                                       f"w-reinforce.mode={mode}"))
    r = rewarded(algo, batch(graded([("1", True), ("2", False), ("3", False), ("1", True)]), 4))
    assert algo.compute_advantages(r).tolist() == pytest.approx(advantages)
    assert algo.loss_mask(r)[:, 0].tolist() == kept and algo.loss_mask(r).shape == r.response_mask.shape
    assert algo.step_metrics(r)["w-reinforce/trained_rows"] == sum(kept)


def test_psr_nsr_presets():
    from meds_cli.commands.ablate_grid import algorithm_overrides

    assert algorithm_overrides("psr") == {"algo.name": "w-reinforce", "w-reinforce.mode": "psr"}
    assert algorithm_overrides("nsr") == {"algo.name": "w-reinforce", "w-reinforce.mode": "nsr"}


def test_w_reinforce_bad_settings_are_one_line_at_load():
    with pytest.raises(UserError, match=r"w-reinforce.positive_weight must be in \[0, 1\]"):
        tiny_config("algo.name=w-reinforce", "w-reinforce.positive_weight=1.5")
    with pytest.raises(UserError, match=r"dapo.adv_estimator=rloo has no effect under w-reinforce.*accepted: grpo"):
        tiny_config("algo.name=w-reinforce", "dapo.adv_estimator=rloo")
    with pytest.raises(UserError, match=r"algo.base=rlif-multireward is not a base w-reinforce can sit on; "
                                        r"accepted: grpo, dapo"):
        tiny_config("algo.name=w-reinforce", "algo.base=rlif-multireward")


# ---------------------------------------------------------------- unlikeliness


@pytest.mark.parametrize("case", REFERENCES["unlikeliness"]["cases"], ids=lambda c: f"beta{c['rank_penalty']}")
def test_unlikeliness_matches_rewarding_unlikely(case):
    """Reference: AndreHe02/rewarding-unlikely-release ca1cff05ebdf2cfe9737fd416897da838a93e11a,
    verl/trainer/ppo/ray_lean_trainer.py RayLeanTrainer._compute_advantages."""
    ref = REFERENCES["unlikeliness"]
    old, mask, rewards = (torch.tensor(ref[k]) for k in ("old_logp", "mask", "rewards"))
    shaped = unlikeliness_rewards(rewards, rewards > 0, sequence_logprob(old, mask), ref["group_size"],
                                  case["rank_penalty"])
    ours = group_advantages(shaped, ref["group_size"])  # GRPO's normalisation, as the reference's
    assert ours.tolist() == pytest.approx(case["advantages"], abs=1e-5)


def test_unlikeliness_hook_on_grpo_reads_the_scoring_pass():
    ref = REFERENCES["unlikeliness"]
    old, mask = torch.tensor(ref["old_logp"]), torch.tensor(ref["mask"])
    verdicts = graded([("1", r > 0) for r in ref["rewards"]])
    algo = build_algorithm(tiny_config("algo.name=unlikeliness", "algo.base=grpo", "rollout.group_size=4"))
    assert algo.forward_needs(4, records_lens=True).view == "shaping"
    r = rewarded(algo, batch(verdicts, 4, old, mask))
    algo.shape_rewards(r)
    assert algo.compute_advantages(r).tolist() == pytest.approx(REFERENCES["unlikeliness"]["cases"][0]["advantages"],
                                                                abs=1e-5)
    metrics = algo.step_metrics(r)
    assert metrics["unlikeliness/reweighted"] > 0 and metrics["unlikeliness/penalty_mean"] > 0
    with pytest.raises(UserError, match="unlikeliness.rank_penalty must be in"):
        tiny_config("algo.name=unlikeliness", "unlikeliness.rank_penalty=2")
    with pytest.raises(UserError, match="passk reads rewards as pass/fail"):
        tiny_config("algo.name=unlikeliness", "dapo.adv_estimator=passk")


# ---------------------------------------------------------------- outcome-based exploration


def test_outcome_ucb_terms_by_hand():
    # min(1, sqrt(1/N)): N = 0 (never seen) is capped at 1, N = 4 -> 0.5
    assert [ucb_bonus(n) for n in (0, 1, 4)] == [1.0, 1.0, 0.5]
    answers, counts = ["3", "3", "5", None], [4, 4, 1, 0]
    # ucb: 1/sqrt(4) = 0.5, 0.5, 1/sqrt(1) = 1, no answer 0
    assert exploration_terms(answers, counts, "ucb", 0.5) == pytest.approx([0.5, 0.5, 1.0, 0.0])
    # ucb-mean: minus the mean of the other answered responses: 0.5 - (0.5 + 1)/2 = -0.25, 1 - (0.5 + 0.5)/2 = 0.5
    assert exploration_terms(answers, counts, "ucb-mean", 0.5) == pytest.approx([-0.25, -0.25, 0.5, 0.0])
    # ucb-con, b0 = 0.5: 0.5 - 0.5 = 0, 1 - 0.5 = 0.5
    assert exploration_terms(answers, counts, "ucb-con", 0.5) == pytest.approx([0.0, 0.0, 0.5, 0.0])
    # batch: -(1/n) * (others with the same answer), n = 4: '3' has one other -> -0.25; '5' none -> 0
    assert exploration_terms(answers, counts, "batch", 0.5) == pytest.approx([-0.25, -0.25, 0.0, 0.0])


def ucb_algo(*overrides):
    return build_algorithm(tiny_config("algo.name=outcome-ucb", *overrides))


ALL_WRONG = [("3", False), ("3", False), ("3", False), ("7", False)]


def test_outcome_ucb_all_wrong_group_the_old_form_cancels_the_coefficient():
    """Answers [3, 3, 3, 7], all wrong. The old reward-level form (bonus c/sqrt(N) with this batch
    counted, minus c * (same others)/(G-1), then GRPO's normalisation) gives the same advantages at
    every c; the paper's form (the bonus added to GRPO's advantage, 0 here) keeps c."""
    old = []
    for c in (0.1, 0.2):
        # rewards 0 + c * [1/sqrt(3) - 2/3] x3, c * [1 - 0]: c * [-0.0893, -0.0893, -0.0893, 1]; mean c * 0.183,
        # centred c * [-0.2726 x3, 0.8179], unbiased std c * 0.5452 -> [-0.5, -0.5, -0.5, 1.5] whatever c is
        shaped = torch.tensor([c / math.sqrt(3) - c * 2 / 3] * 3 + [c])
        old.append(ADV_ESTIMATORS.get("grpo")(shaped, 4, None, tiny_config("algo.name=grpo").section("grpo")))
    assert old[0].tolist() == pytest.approx([-0.5, -0.5, -0.5, 1.5], abs=1e-4)
    assert old[1].tolist() == pytest.approx(old[0].tolist(), abs=1e-4)  # only the std's eps (1e-6) tells them apart
    for c, counts, expected in [
        # with-batch: N(3) = 3 -> 0.2 / sqrt 3 = 0.11547, N(7) = 1 -> 0.2 (the numbers at c = 0.2)
        (0.2, "with-batch", [0.11547] * 3 + [0.2]),
        (0.1, "with-batch", [0.057735] * 3 + [0.1]),
        # earlier: nothing seen before -> N = 0 for both answers -> the cap, c each
        (0.2, "earlier", [0.2] * 4),
    ]:
        algo = ucb_algo(f"outcome-ucb.coef={c}", f"outcome-ucb.counts={counts}")
        r = rewarded(algo, batch(graded(ALL_WRONG), 4))
        algo.shape_rewards(r)
        assert algo.compute_advantages(r).tolist() == pytest.approx(expected, abs=1e-5), (c, counts)


@pytest.mark.parametrize("rule,step1,step2", [
    # earlier: step 1 sees an empty table (N = 0 -> 0.2 each); step 2 reads step 1's N(3) = 3, N(7) = 1
    ("earlier", [0.2] * 4, [0.2 / math.sqrt(3)] * 3 + [0.2]),
    # with-batch: step 1 N(3) = 3, N(7) = 1; step 2 N(3) = 6 -> 0.2/sqrt 6 = 0.08165, N(7) = 2 -> 0.14142
    ("with-batch", [0.2 / math.sqrt(3)] * 3 + [0.2], [0.2 / math.sqrt(6)] * 3 + [0.2 / math.sqrt(2)]),
])
def test_outcome_ucb_counting_rules_over_two_steps_and_a_resume(rule, step1, step2):
    algo = ucb_algo(f"outcome-ucb.counts={rule}")
    r = rewarded(algo, batch(graded(ALL_WRONG), 4))
    assert algo.compute_advantages(r).tolist() == pytest.approx(step1, abs=1e-6)
    m = algo.step_metrics(r)
    assert m["outcome-ucb/never_seen_share"] == 1.0 and m["outcome-ucb/distinct_answers_so_far"] == 2
    assert m["outcome-ucb/bonus_mean"] == pytest.approx(sum(step1) / 4)
    again = ucb_algo(f"outcome-ucb.counts={rule}")
    again.load_state_dict(json.loads(json.dumps(algo.state_dict())))  # the checkpoint keeps it as JSON-able data
    r2 = rewarded(again, batch(graded(ALL_WRONG), 4))
    assert again.compute_advantages(r2).tolist() == pytest.approx(step2, abs=1e-6)
    assert again.step_metrics(r2)["outcome-ucb/never_seen_share"] == 0.0
    assert again.counts == {"p0": {"num:3": 6, "num:7": 2}}  # canonical answer keys


def test_outcome_ucb_adds_to_grpo_advantages_in_a_mixed_group():
    algo = ucb_algo("outcome-ucb.variant=ucb-con", "outcome-ucb.baseline=1", "outcome-ucb.counts=with-batch")
    r = rewarded(algo, batch(graded([("5", True), ("3", False), ("3", False), (None, False)]), 4))
    # GRPO: rewards 1 0 0 0, mean 0.25, unbiased std 0.5 -> 1.5, -0.5, -0.5, -0.5
    # ucb-con b0 = 1: '5' N = 1 -> 1 - 1 = 0; '3' N = 2 -> 0.7071 - 1 = -0.2929, x 0.2 = -0.05858; no answer 0
    assert algo.compute_advantages(r).tolist() == pytest.approx([1.5, -0.5 - 0.058579, -0.5 - 0.058579, -0.5],
                                                                abs=1e-5)


def test_outcome_ucb_defaults_settings_and_dapo_warning():
    cfg = tiny_config("algo.name=outcome-ucb")
    own = cfg.section("outcome-ucb")
    assert (cfg.algo.base, own.variant, own.coef, own.counts) == ("grpo", "ucb", 0.2, "earlier")
    assert tiny_config("algo.name=meds").algo.base == "dapo"  # the other shaping methods keep DAPO
    con = tiny_config("algo.name=outcome-ucb", "outcome-ucb.variant=ucb-con", "outcome-ucb.baseline=1")
    key = ALGORITHMS.get("outcome-ucb").key_settings  # what `meds ablate` shows beside the arm
    assert key(con.section("outcome-ucb")) == {"variant": "ucb-con", "coef": 0.2, "baseline": 1.0, "counts": "earlier"}
    batch_only = tiny_config("algo.name=outcome-ucb", "outcome-ucb.variant=batch").section("outcome-ucb")
    assert key(batch_only) == {"variant": "batch", "coef": 0.2}  # batch exploration reads no counts
    with pytest.warns(UserWarning, match="outcome-ucb on dapo: dynamic sampling drops the groups of equal correctness"):
        ucb_algo("algo.base=dapo")
    with pytest.raises(UserError, match="outcome-ucb.coef must be at least 0"):
        tiny_config("algo.name=outcome-ucb", "outcome-ucb.coef=-1")
    with pytest.raises(UserError, match="outcome-ucb.variant.*accepted: ucb, ucb-mean, ucb-con, batch"):
        tiny_config("algo.name=outcome-ucb", "outcome-ucb.variant=ucb-max")


def _two_process_counts(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        algo = build_algorithm(tiny_config("algo.name=outcome-ucb"),
                               gather=lambda value: _all_gather(dist, world, value))
        for step in range(2):
            groups = TWO_PROCESS_GROUPS[step][rank]
            r = rewarded(algo, batch(graded(groups[1]), 4))
            r.problems = [Problem(id=groups[0], question="q", answer="1")]
            adv = algo.compute_advantages(r)
            Path(out, f"rank{rank}_step{step}.json").write_text(json.dumps(adv.tolist()))
        Path(out, f"rank{rank}_counts.json").write_text(json.dumps({k: dict(v) for k, v in algo.counts.items()}))
    finally:
        dist.destroy_process_group()


def _all_gather(dist, world, value):
    out = [None] * world
    dist.all_gather_object(out, value)
    return out


# step -> rank -> (question, its group); question 'a' is on rank 0 at step 0 and on rank 1 at step 1
TWO_PROCESS_GROUPS = [
    [("a", [("3", False), ("3", False), ("4", True), (None, False)]), ("b", [("9", True)] * 4)],
    [("b", [("9", True), ("8", False), ("8", False), ("9", True)]), ("a", [("3", False), ("4", True)] * 2)],
]


def test_outcome_ucb_two_processes_count_as_one(tmp_path):
    """2 gloo processes, each its own question a step, with the questions swapped at step 2: the
    count tables equal one process's over both groups, and so do the advantages."""
    import torch.multiprocessing as mp

    mp.spawn(_two_process_counts, args=(2, f"file://{tmp_path / 'rendezvous'}", str(tmp_path)), nprocs=2)
    one = ucb_algo()
    for step in range(2):
        verdicts = [v for _, group in TWO_PROCESS_GROUPS[step] for v in graded(group)]
        r = rewarded(one, batch(verdicts, 4))
        r.problems = [Problem(id=q, question="q", answer="1") for q, _ in TWO_PROCESS_GROUPS[step]]
        alone = one.compute_advantages(r).tolist()
        both = sum((json.loads((tmp_path / f"rank{k}_step{step}.json").read_text()) for k in range(2)), [])
        assert both == pytest.approx(alone, abs=1e-7)
    counts = [json.loads((tmp_path / f"rank{k}_counts.json").read_text()) for k in range(2)]
    assert counts[0] == counts[1] == {k: dict(v) for k, v in one.counts.items()} == {
        "a": {"num:3": 4, "num:4": 3}, "b": {"num:9": 6, "num:8": 2}}


# ---------------------------------------------------------------- Clip-Cov


@pytest.mark.parametrize("case", REFERENCES["clip_cov"]["cases"], ids=lambda c: f"ratio{c['ratio']}")
def test_clip_cov_matches_verl(case):
    """Reference: volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7, verl/trainer/ppo/core_algos.py
    compute_policy_loss_clip_cov."""
    ref = REFERENCES["clip_cov"]
    logp, old, adv, mask = (torch.tensor(ref[k]) for k in ("logp", "old_logp", "advantages", "mask"))
    torch.manual_seed(case["seed"])  # the same generator state verl's randperm drew from
    loss, stats = clip_cov_loss(logp, old, adv, mask, case["ratio"], case["lb"], case["ub"], case["clip_low"],
                                case["clip_high"])
    assert torch.allclose(loss * mask, torch.tensor(case["loss_matrix"]) * mask, atol=1e-6)
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(case["loss_token_mean"], abs=1e-6)
    assert stats["clip_cov_share"].item() == pytest.approx(case["clipfrac"], abs=1e-6)


def test_clip_cov_cuts_the_gradient_of_the_selected_tokens_only():
    ref = REFERENCES["clip_cov"]
    old, adv, mask = (torch.tensor(ref[k]) for k in ("old_logp", "advantages", "mask"))
    logp = torch.tensor(ref["logp"], requires_grad=True)
    torch.manual_seed(0)
    loss, _ = clip_cov_loss(logp, old, adv, mask, 0.5, 0.0, 5.0, 0.2, 0.28)
    (loss * mask).sum().backward()
    plain = torch.tensor(ref["logp"], requires_grad=True)
    surrogate, _ = clipped_surrogate(plain, old, adv, mask, 0.2, 0.28)
    (surrogate * mask).sum().backward()
    cut = (loss.detach() == 0) & (surrogate.detach() != 0) & (mask > 0)
    assert cut.any()
    assert (logp.grad[cut] == 0).all()
    assert torch.equal(logp.grad[~cut & (mask > 0)], plain.grad[~cut & (mask > 0)])


def test_clip_cov_by_config():
    assert "clip-cov" in POLICY_LOSSES
    cfg = tiny_config("algo.name=grpo", "grpo.policy_loss=clip-cov", "grpo.clip_cov_ratio=0.5")
    assert build_algorithm(cfg).policy_loss is POLICY_LOSSES.get("clip-cov")
    with pytest.raises(UserError, match="clip_cov_lb=6.0 must be below grpo.clip_cov_ub=5.0"):
        tiny_config("grpo.clip_cov_lb=6")


# ---------------------------------------------------------------- entropy bonus


def test_entropy_with_its_gradient_matches_autograd_of_the_definition():
    torch.manual_seed(0)
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    head = torch.nn.Linear(4, 7)
    tokens = torch.randint(0, 7, (2, 3))
    _, entropy = token_logprobs_and_entropy(hidden, head, tokens, temperature=0.7, chunk_tokens=2, entropy_grad=True)
    entropy.sum().backward()
    ours = hidden.grad.clone()
    hidden.grad = None
    p = torch.softmax(head(hidden) / 0.7, -1)
    direct = -(p * torch.log(p)).sum(-1)
    assert torch.allclose(entropy, direct, atol=1e-5)
    direct.sum().backward()
    assert torch.allclose(ours, hidden.grad, atol=1e-5)
    _, detached = token_logprobs_and_entropy(hidden, head, tokens, temperature=0.7)
    assert not detached.requires_grad  # the diagnostic stays out of the graph


def test_entropy_bonus_term_in_the_loss():
    logp, old = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-1.0, -0.5]])
    entropy, mask = torch.tensor([[2.0, 1.0]]), torch.tensor([[1.0, 1.0]])
    plain = build_algorithm(tiny_config("algo.name=dapo"))
    assert plain.entropy_coef == 0
    base_loss, _ = plain.token_loss(logp, old, torch.tensor([1.0]), mask, entropy=entropy)
    assert base_loss.tolist() == [[-1.0, -1.0]]  # coefficient 0: no term
    algo = build_algorithm(tiny_config("algo.name=meds", "dapo.entropy_coef=0.1"))  # a shaping method: its base's
    loss, stats = algo.token_loss(logp, old, torch.tensor([1.0]), mask, entropy=entropy)
    assert loss[0].tolist() == pytest.approx([-1.2, -1.1])  # -A * ratio - 0.1 * H
    assert stats["entropy_bonus"].item() == pytest.approx(0.15)
    with pytest.raises(UserError, match="grpo.entropy_coef must be at least 0"):
        tiny_config("grpo.entropy_coef=-0.1")


# ---------------------------------------------------------------- one training step each


PLUGINS = {
    "passk": ["algo.name=grpo", "grpo.adv_estimator=passk", "grpo.passk_k=4"],
    "w-reinforce": ["algo.name=w-reinforce"],
    "unlikeliness": ["algo.name=unlikeliness"],
    "outcome-ucb": ["algo.name=outcome-ucb"],
    "clip-cov": ["algo.name=grpo", "grpo.policy_loss=clip-cov", "grpo.clip_cov_ratio=0.1", "grpo.clip_cov_lb=0",
                 "train.ppo_epochs=2"],
    "entropy-bonus": ["algo.name=grpo", "grpo.entropy_coef=0.01"],
}
METRIC = {"passk": "advantage/positive_mean", "w-reinforce": "w-reinforce/reweighted",
          "unlikeliness": "unlikeliness/penalty_mean", "outcome-ucb": "outcome-ucb/bonus_mean",
          "clip-cov": "clip_cov_share", "entropy-bonus": "entropy_bonus"}


@pytest.mark.parametrize("name", list(PLUGINS))
def test_one_training_step_on_the_tiny_model(tmp_path, name):
    from meds_cli.engine.trainer import Trainer

    cfg = tiny_config("algo.base=grpo", "model.lora.enabled=false", "train.steps=1", *PLUGINS[name],
                      output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    before = [p.detach().clone() for p in trainer.unwrapped.parameters()]
    row = trainer.train_step()
    assert math.isfinite(row["loss"]) and METRIC[name] in row
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.unwrapped.parameters())), "nothing trained"


@pytest.mark.slow
@needs_embedded
@pytest.mark.parametrize("name", list(PLUGINS))
def test_one_meds_train_step_of_the_embedded_model(tmp_path, name):
    from typer.testing import CliRunner

    from meds_cli.app import app

    sets = ["algo.base=grpo", "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=4",
            "rollout.max_new_tokens=32", "train.micro_batch_size=4", *PLUGINS[name]]
    config = Path(__file__).resolve().parent.parent / "configs" / "smollm2.yaml"
    result = CliRunner().invoke(app, ["train", "-c", str(config), "--output", str(tmp_path / "run"), "-q",
                                      *sum((["--set", s] for s in sets), [])])
    assert result.exit_code == 0, result.output
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(row["loss"]) and METRIC[name] in row


def test_outcome_ucb_counts_survive_checkpoint_and_resume(tmp_path):
    """2 steps straight == 1 step, resume from its checkpoint, 1 step: the same counts and rewards."""
    from meds_cli.engine.trainer import Trainer

    common = ("algo.name=outcome-ucb", "algo.base=grpo", "train.checkpoint_every=1", "rollout.prompts_per_step=4",
              "rollout.group_size=8", "rollout.max_new_tokens=3", "model.lora.enabled=false")
    straight = Trainer(tiny_config(*common, "train.steps=2", output_dir=tmp_path / "straight"), tmp_path / "straight")
    straight.train()
    Trainer(tiny_config(*common, "train.steps=1", output_dir=tmp_path / "split"), tmp_path / "split").train()
    torch.manual_seed(123)  # resume must not depend on the global RNG
    second = Trainer(tiny_config(*common, "train.steps=2", output_dir=tmp_path / "split"), tmp_path / "split")
    second.load_checkpoint(tmp_path / "split" / "checkpoints" / "step_1")
    assert second.algorithm.counts  # the counts came back from the checkpoint
    second.train()
    assert straight.algorithm.counts == second.algorithm.counts
    assert 0 < sum(sum(c.values()) for c in straight.algorithm.counts.values()) <= 2 * 4 * 8  # answered responses
    rows = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["outcome-ucb/bonus_mean"] for r in rows] == [r["outcome-ucb/bonus_mean"] for r in ref]
    assert all(r["outcome-ucb/bonus_mean"] > 0 for r in ref)


def test_meds_list_shows_every_member_of_the_family():
    from typer.testing import CliRunner

    from meds_cli.app import app

    result = CliRunner().invoke(app, ["list"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "presets (meds ablate --algos)" in text
    for name in ("passk", "w-reinforce", "unlikeliness", "outcome-ucb", "clip-cov", "entropy-bonus"):
        assert f"\n  {name} " in text, name


@pytest.mark.parametrize("args, expected", [
    (["--algo", "w-reinforce", "--set", "w-reinforce.positive_weight=1.5"],
     "w-reinforce.positive_weight must be in [0, 1]"),
    (["--algo", "w-reinforce", "--base", "edas"], "algo.base=edas is not a base w-reinforce can sit on"),
    (["--algo", "w-reinforce", "--set", "dapo.adv_estimator=passk"], "dapo.adv_estimator=passk has no effect under"),
    (["--algo", "dapo", "--set", "dapo.adv_estimator=passk", "--set", "dapo.passk_k=64"],
     "dapo.passk_k=64 must be at most rollout.group_size"),
])
def test_bad_settings_are_one_line_from_meds_train(tmp_path, args, expected):
    from typer.testing import CliRunner

    from meds_cli.app import app
    from tests.cli_errors import one_error_line

    line = one_error_line(CliRunner().invoke(app, ["train", *args, "--output", str(tmp_path / "r")]))
    assert expected in line, line
    assert not (tmp_path / "r").exists()  # refused before anything is made


def test_entropy_bonus_matches_verl():
    """Reference: volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7: entropy_from_logits
    (verl/utils/torch_functional.py) on logits / T, and dp_actor's pg_loss - entropy_coeff * agg_loss(entropy)."""
    from algorithms.policy_loss import add_entropy_bonus

    ref = REFERENCES["entropy_bonus"]
    logits, mask, pg = (torch.tensor(ref[k]) for k in ("logits", "mask", "pg_loss_matrix"))
    tokens = torch.zeros(logits.shape[:2], dtype=torch.long)
    # the head is the identity: hidden states are the logits themselves
    _, entropy = token_logprobs_and_entropy(logits, lambda h: h, tokens, temperature=ref["temperature"],
                                            entropy_grad=True)
    assert torch.allclose(entropy, torch.tensor(ref["entropy"]), atol=1e-5)
    loss, _ = add_entropy_bonus(pg, {}, entropy, mask, ref["entropy_coeff"])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(ref["policy_loss_token_mean"], abs=1e-6)
