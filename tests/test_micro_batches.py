"""Micro-batches by tokens (train.micro_batch_tokens, engine/training/micro_batches.py): the
grouping, computed by hand; an update and a scoring pass equal to the fixed-size ones in float64
on a batch of very different lengths, while the fixed size pads every micro-batch to the batch."""

import itertools
import random
from types import SimpleNamespace

import pytest
import torch

from meds_cli.core.errors import UserError
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training import update
from meds_cli.engine.training.micro_batches import (
    MicroBatch,
    cut_to_rows,
    even_out,
    filled_cuts,
    fixed_micro_batches,
    least_padded_cuts,
    over_budget,
    row_lengths,
    token_micro_batches,
)
from meds_cli.engine.training.packing import Packing
from meds_cli.engine.training.scoring import score_rollouts
from tests.conftest import tiny_config
from tests.float64 import assert_equal_in_float64, float64_norms
from tests.test_shared_prompts import batch as rollouts_of
from tests.tiny_policy import lora_policy


def rows_of(batches):
    return [m.rows for m in batches]


def test_rows_of_similar_length_go_together_within_the_budget():
    # totals 12, 3, 3, 8 -> order 0, 3, 1, 2. [0, 3]: 2 rows x (2 + 10) = 24 <= 24; adding row 1
    # would cost 3 x 12 = 36, so row 1 opens a group: [1, 2] costs 2 x (2 + 1) = 6.
    batches = token_micro_batches([2, 2, 2, 2], [10, 1, 1, 6], budget=24)
    assert rows_of(batches) == [(0, 3), (1, 2)]
    # the fixed size pairs 0 with 1 and 2 with 3 at the batch's width 12: 48 tokens, against 30
    assert rows_of(fixed_micro_batches([0, 1, 2, 3], 2)) == [(0, 1), (2, 3)]


def test_a_group_costs_its_longest_prompt_plus_its_longest_response():
    # rows (5 + 1) and (1 + 5): each 6 tokens, but together 2 x (5 + 5) = 20 as they run padded
    assert rows_of(token_micro_batches([5, 1], [1, 5], budget=19)) == [(0,), (1,)]
    assert rows_of(token_micro_batches([5, 1], [1, 5], budget=20)) == [(0, 1)]


def test_the_cuts_run_the_fewest_tokens_in_as_few_micro_batches_as_filling():
    # prompts 1, responses 10, 10, 4, 3, 3, 2; budget 44. Filling: rows 0-3 cost 4 x (1 + 10) = 44,
    # rows 4-5 2 x (1 + 3) = 8: 52 tokens. Cut after row 1 instead: 2 x 11 + 4 x (1 + 4) = 42.
    prompts, responses = [1] * 6, [10, 10, 4, 3, 3, 2]
    assert filled_cuts(prompts, responses, 44) == [0, 4, 6]
    assert rows_of(token_micro_batches(prompts, responses, budget=44)) == [(0, 1), (2, 3, 4, 5)]


def test_the_benchmarks_long_tailed_batch_pads_less():
    # scripts/bench_lengths.py at 16 rows (prompt width 56, budget 8 x (56 + 128) = 1,472). Filling:
    # 8 x 184 = 1,472 (both 128s with six short rows) + 8 x (56 + 10) = 528: 2,000 tokens. Cut
    # after the 41: 3 x 184 = 552 + 13 x (56 + 25) = 1,053: 1,605 tokens, still two micro-batches.
    responses = [4, 4, 5, 7, 7, 9, 10, 10, 11, 16, 17, 20, 25, 41, 128, 128]
    groups = token_micro_batches([56] * 16, responses, budget=1472)
    assert [sorted(responses[i] for i in m.rows) for m in groups] == [
        [41, 128, 128], [4, 4, 5, 7, 7, 9, 10, 10, 11, 16, 17, 20, 25]]


def _tokens(prompts, responses, cuts):
    return sum((e - s) * (max(prompts[s:e]) + max(responses[s:e])) for s, e in zip(cuts, cuts[1:]))


def test_the_cuts_are_the_least_padded_of_every_way_with_as_few_runs():
    """Against every way to cut 1-8 rows (in their longest-first order) into runs within budget."""
    rng = random.Random(0)
    for _ in range(300):
        rows = sorted(((rng.randint(1, 6), rng.randint(0, 12)) for _ in range(rng.randint(1, 8))),
                      key=lambda row: -sum(row))
        prompts, responses, budget = [p for p, _ in rows], [r for _, r in rows], rng.randint(5, 60)
        n, fewest = len(rows), len(filled_cuts(prompts, responses, budget)) - 1
        every = [[0, *inner, n] for m in range(n) for inner in itertools.combinations(range(1, n), m)]
        within = [cuts for cuts in every if len(cuts) - 1 <= fewest and all(
            e - s == 1 or _tokens(prompts[s:e], responses[s:e], [0, e - s]) <= budget
            for s, e in zip(cuts, cuts[1:]))]
        assert min(len(cuts) - 1 for cuts in within) == fewest  # filling needs no more runs than any way
        cuts = least_padded_cuts(prompts, responses, budget)
        assert cuts in within and len(cuts) - 1 == fewest
        assert _tokens(prompts, responses, cuts) == min(_tokens(prompts, responses, c) for c in within)


def test_a_row_longer_than_the_budget_runs_alone():
    # budget 10: row 0 (12 tokens) alone; row 3 (8) alone, since 2 x (2 + 6) = 16 > 10; [1, 2]: 2 x 3 = 6
    prompts, responses = [2, 2, 2, 2], [10, 1, 1, 6]
    assert rows_of(token_micro_batches(prompts, responses, budget=10)) == [(0,), (3,), (1, 2)]
    assert over_budget(prompts, responses, budget=10) == [0]
    assert over_budget(prompts, responses, budget=12) == []


def test_even_out_splits_the_largest_then_adds_zero_weight_stand_ins():
    planned = [MicroBatch((0, 1, 2)), MicroBatch((3,))]
    assert even_out(planned, 2) == planned
    # (0, 1, 2) -> (0, 1) + (2,); then (0, 1) -> (0,) + (1,)
    assert rows_of(even_out(planned, 3)) == [(0, 1), (2,), (3,)]
    four = even_out(planned, 4)
    assert rows_of(four) == [(0,), (1,), (2,), (3,)] and all(m.counts for m in four)
    six = even_out(planned, 6)
    assert rows_of(six) == [(0,), (1,), (2,), (3,), (3,), (3,)]
    assert [m.counts for m in six] == [True] * 4 + [False] * 2


def test_row_lengths_and_the_cut_keep_only_real_tokens():
    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # prompt width 3: prompts of 2, 3 and 1 tokens; responses end at columns 2, 1 and (none) 0
    assert row_lengths(attention, 3, response_mask) == ([2, 3, 1], [2, 1, 0])
    ids = torch.arange(18).reshape(3, 6)
    cut = cut_to_rows(ids, attention, 3, ids[:, 3:], response_mask, prompt_length=2, response_length=2)
    assert cut[0].tolist() == [[1, 2, 3, 4], [7, 8, 9, 10], [13, 14, 15, 16]]
    assert cut[2] == 2 and cut[3].tolist() == [[3, 4], [9, 10], [15, 16]] and cut[4].shape == (3, 2)


def test_a_negative_budget_is_one_line(tmp_path):
    with pytest.raises(UserError, match="micro_batch_tokens") as caught:
        tiny_config("train.micro_batch_tokens=-1")
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------ the same update, less padding

PROMPTS = ["12+3=", "7*8=(1"]
RESPONSES = [["4" * 40, "7", "ab", "1" * 25], ["5", "6" * 33, "x", "9"]]  # very different lengths


def varied_batch(tokenizer):
    batch = rollouts_of(tokenizer, PROMPTS, RESPONSES)
    batch.advantages = torch.linspace(-1.0, 1.0, batch.size)  # a fixed spread: an update to compare
    return batch


def decoder_widths(model):
    """A list filled with (rows, columns) of every call of the decoder, and the hook's handle."""
    calls = []
    inner = model.get_base_model().model
    handle = inner.register_forward_pre_hook(lambda m, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
                                             with_kwargs=True)
    return calls, handle


def update_both_ways(tmp_path, share, extra):
    out = {}
    for budget in (0, 160):
        cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "train.micro_batch_size=2",
                          "algo.name=grpo", "grpo.loss_agg=token-mean", "optim.lr=0.05", "optim.warmup_steps=0",
                          f"train.share_prompts={share}", f"train.micro_batch_tokens={budget}",
                          "train.padding_free=false", *extra)  # padded (packed: test_padding_free.py)
        trainer = Trainer(cfg, tmp_path / str(budget))
        model = trainer.unwrapped
        model.double()
        batch = varied_batch(trainer.tokenizer)
        batch.response_mask = batch.response_mask.double()  # old log-probs and entropy are filled in its dtype
        if cfg.train.ppo_epochs > 1:  # old log-probs from a scoring pass, the same on both sides
            score_rollouts(model, batch, 8, with_reference=False)
        calls, handle = decoder_widths(model)
        stats = trainer.update(batch)
        handle.remove()
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        out[budget] = (weights, stats, calls, batch)
    return out


@pytest.mark.parametrize("share", ["true", "false"])
@pytest.mark.parametrize("extra", [(), ("train.ppo_epochs=2", "train.mini_batch_size=4")])
def test_an_update_by_tokens_equals_the_fixed_size_one_with_less_padding(tmp_path, share, extra):
    with float64_norms():
        out = update_both_ways(tmp_path, share, extra)
    (fixed, fixed_stats, fixed_calls, fixed_batch), (tokens, token_stats, token_calls, token_batch) = out[0], out[160]
    full = fixed_batch.input_ids.shape[1]
    prompt_width = fixed_batch.prompt_width
    if share == "false":
        # today's code: every micro-batch as wide as the batch's longest prompt + longest response
        assert {width for _, width in fixed_calls} == {full}
        assert min(width for _, width in token_calls) < full / 3
        # one batch: 4 x (2 rows x 47) = 376 columns against (3 x 47) + (5 x 9) = 186
        assert sum(r * w for r, w in token_calls) < 0.85 * sum(r * w for r, w in fixed_calls)
    else:
        # prompts run once per distinct prompt of a micro-batch (rows x prompt width), then the responses
        responses = [(r, w) for r, w in fixed_calls if w != prompt_width]
        assert {width for _, width in responses} == {full - prompt_width}
        # by tokens too: some micro-batch runs its distinct prompts (fewer rows, a prompt's width at most)
        # before its rows' responses
        assert any(shared < rows and width <= prompt_width
                   for (shared, width), (rows, _) in zip(token_calls, token_calls[1:]))
    assert fixed.keys() == tokens.keys() and fixed
    for name, value in fixed.items():
        assert_equal_in_float64(tokens[name], value, name)
    assert token_stats["loss"] == pytest.approx(fixed_stats["loss"], rel=1e-9)
    assert_equal_in_float64(token_batch.old_logp.double(), fixed_batch.old_logp.double(), "old log-probs")
    assert_equal_in_float64(token_batch.entropy.double(), fixed_batch.entropy.double(), "entropy")


def test_the_scoring_pass_by_tokens_gives_the_fixed_size_values():
    with float64_norms():
        model, tokenizer = lora_policy(seed=5)
        model.double()
        batches = [varied_batch(tokenizer), varied_batch(tokenizer)]
        calls = {}
        for budget, batch in zip((0, 120), batches):
            calls[budget], handle = decoder_widths(model)
            score_rollouts(model, batch, 2, with_reference=True, temperature=0.8, disable_adapter=model.disable_adapter,
                           share_prompts=True, micro_batch_tokens=budget)
            handle.remove()
    for name in ("old_logp", "entropy", "ref_logp"):
        assert_equal_in_float64(getattr(batches[1], name), getattr(batches[0], name), name)
    assert sum(r * w for r, w in calls[120]) < sum(r * w for r, w in calls[0])


def test_rows_longer_than_the_budget_are_said_once(monkeypatch, capsys):
    monkeypatch.setattr(update, "_warned_over_budget", False)
    _, tokenizer = lora_policy(seed=5)
    batch = varied_batch(tokenizer)
    settings = SimpleNamespace(micro_batch_tokens=30, micro_batch_size=2, packing=Packing(), share_prompts=False)
    acc = SimpleNamespace(num_processes=1, is_main_process=True)
    plans = [update.plan_update_micro_batches(batch, list(range(batch.size)), settings, acc) for _ in range(2)]
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "3 rows" in err and "train.micro_batch_tokens=30" in err
    # rows 0, 3 and 5 (responses of 40, 25 and 33 characters, one token each, plus EOS and a prompt
    # of 5 or 6) are longer than 30 tokens and run alone; the short rows share micro-batches
    assert plans[0] == plans[1]
    assert {m.rows for m in plans[0] if len(m.rows) == 1} == {(0,), (3,), (5,)}
    assert sorted(r for m in plans[0] for r in m.rows) == list(range(8))


def test_the_trainers_scoring_pass_cuts_by_tokens(tmp_path, monkeypatch):
    """The loop's scoring pass gets the budget, and without an algorithm reading the pass (GRPO)
    no observer, so the pass really cuts; the scores equal the fixed-size pass's."""
    import meds_cli.engine.trainer as trainer_module

    calls = []
    real_score = trainer_module.score_rollouts

    def recording_score(*args, **kwargs):
        calls.append(kwargs)
        return real_score(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_rollouts", recording_score)
    logps = []
    for budget in (0, 64):
        cfg = tiny_config("algo.name=grpo", "rollout.prompts_per_step=2", "rollout.group_size=2",
                          "train.scoring_pass=always", f"train.micro_batch_tokens={budget}",
                          output_dir=tmp_path / f"run{budget}")
        trainer = Trainer(cfg, tmp_path / f"run{budget}")
        batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
        logps.append(batch.old_logp)
    assert [c["micro_batch_tokens"] for c in calls] == [0, 64]
    assert all(c["observe"] is None for c in calls)
    assert calls[1]["most_over_processes"](3) == 3  # one process: its own count
    torch.testing.assert_close(logps[0], logps[1], rtol=0, atol=1e-5)
