"""Padding-free forwards (`train.padding_free`, engine/training/packing.py): the layout computed by
hand; in float64, packed rows give the padded forward's log-probs, entropies, gradients, updates,
scoring values and algorithm views on a batch of very different lengths; one sequence cannot see
another."""

import pytest
import torch

from algorithms.meds import FEATURES
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.algorithm_setup import build_algorithm
from meds_cli.engine.training.micro_batches import real_token_micro_batches
from meds_cli.engine.training.packing import (
    PADDED,
    Packing,
    first_fit_decreasing,
    pack_rows,
    padding_free_line,
    prefix_sharing_mask,
)
from meds_cli.engine.training.scoring import policy_forward, score_rollouts, shares_prompts
from tests.conftest import tiny_config
from tests.float64 import assert_equal_in_float64, float64_norms
from tests.test_micro_batches import varied_batch
from tests.test_shared_prompts import batch as rollouts_of
from tests.tiny_policy import lora_policy

PACKED = Packing(on=True, masked=True)


# ------------------------------------------------------------ the layout, by hand

def test_rows_are_laid_end_to_end_with_positions_restarting():
    # prompt width 3: row 0 prompt [11, 12] (one left pad), response [21, 22] then padding;
    # row 1 prompt [13, 14, 15], response [23]. Units of 4 and 4 tokens: rows 4 wide, one each.
    ids = torch.tensor([[0, 11, 12, 21, 22, 0], [13, 14, 15, 23, 0, 0]])
    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    packed = pack_rows(ids, attention, 3, ids[:, 3:], response_mask)
    assert packed.input_ids.tolist() == [[11, 12, 21, 22], [13, 14, 15, 23]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert packed.attention_mask is None  # the library's own packed-sequence mask
    # response token (0, 0) = 21 is predicted by the prompt's last token (packed 1), (0, 1) by 21 (packed 2),
    # (1, 0) = 23 by 15 (packed 4 + 2 = 6); targets in [b * R] = [2 * 3]: 0, 1, 3
    assert packed.score_from.tolist() == [1, 2, 6] and packed.score_to.tolist() == [0, 1, 3]
    assert packed.tokens.tolist() == [21, 22, 23]
    assert packed.layout.tolist() == [[-1, 0, 1, 2, 3, -1], [4, 5, 6, 7, -1, -1]]


def test_short_units_share_a_row_and_its_padding_is_a_sequence_of_its_own():
    # prompt width 1; responses 4, 1 and 1 tokens: units 5, 2, 2 in rows of 5 -> [5], [2, 2] + 1 pad
    ids = torch.tensor([[9, 1, 2, 3, 4], [8, 5, 0, 0, 0], [7, 6, 0, 0, 0]])
    attention = (ids != 0).long()
    response_mask = attention[:, 1:]
    packed = pack_rows(ids, attention, 1, ids[:, 1:], response_mask)
    assert packed.input_ids.tolist() == [[9, 1, 2, 3, 4], [8, 5, 7, 6, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 0]]


def test_a_group_runs_its_prompt_once_under_a_prefix_sharing_mask():
    # two rows, one prompt [5, 6]; responses [1, 2] and [3]: one unit [5, 6, 1, 2, 3]
    ids = torch.tensor([[5, 6, 1, 2], [5, 6, 3, 0]])
    attention = (ids != 0).long()
    packed = pack_rows(ids, attention, 2, ids[:, 2:], attention[:, 2:], share_prompts=True)
    assert packed.input_ids.tolist() == [[5, 6, 1, 2, 3]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]  # the second response continues the prompt too
    seen = packed.attention_mask[0, 0].int().tolist()
    assert seen == [[1, 0, 0, 0, 0],
                    [1, 1, 0, 0, 0],
                    [1, 1, 1, 0, 0],
                    [1, 1, 1, 1, 0],
                    [1, 1, 0, 0, 1]]  # token 3 sees the prompt and itself, not the other response
    # response tokens: 1 (by 6 at packed 1), 2 (by 1 at 2), 3 (by 6 at 1)
    assert packed.score_from.tolist() == [1, 2, 1]


def test_pairs_per_token_and_the_shared_tokens_by_hand():
    import math
    import types

    from meds_cli.engine.training.packing import pairs_per_token, shared_response_tokens

    # SmolLM2-135M: q, o 576 x 576; k, v 576 x 192; up, gate, down 576 x 1536: 3,538,944 weights,
    # 7,077,888 FLOPs a token; a pair 4 x 9 x 64 = 2,304: 3,072 pairs a token
    smol = types.SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                                 intermediate_size=1536, head_dim=64)
    assert pairs_per_token(smol) == 3072.0
    assert pairs_per_token(types.SimpleNamespace()) == 3000.0  # no sizes: the default
    # P = 56 at 3,072: sqrt(56^2 + 3072 x 56) = sqrt(175,168) = 418.5
    assert shared_response_tokens(56, 3072.0) == pytest.approx(math.sqrt(175168))
    assert shared_response_tokens(0, 3072.0) == 0.0  # nothing to share: every response alone


def test_a_prompt_is_shared_by_as_many_response_tokens_as_pay_for_it():
    from meds_cli.engine.training.packing import split_shared_unit

    # P = 56 at 3,072 pairs a token: at most 418 response tokens a run, as few runs as that allows,
    # balanced, in the rows' order
    assert split_shared_unit([0, 1, 2, 3], 56, [128] * 4, 3072.0) == [[0, 1], [2, 3]]
    assert split_shared_unit([0, 1, 2, 3], 56, [300, 20, 20, 300], 3072.0) == [[0, 1], [2, 3]]
    assert split_shared_unit([0, 1, 2, 3], 56, [512] * 4, 3072.0) == [[0], [1], [2], [3]]
    assert split_shared_unit([4, 5, 6], 56, [48] * 3, 3072.0) == [[4, 5, 6]]
    # at 2 pairs a token attention is dear: sqrt(4 + 4) = 2.8 response tokens a prompt
    ids = torch.tensor([[5, 6, 1, 2], [5, 6, 3, 0]])
    attention = (ids != 0).long()
    packed = pack_rows(ids, attention, 2, ids[:, 2:], attention[:, 2:], share_prompts=True, pairs_per_token=2.0)
    assert packed.input_ids.tolist() == [[5, 6, 1, 2], [5, 6, 3, 0]]  # a prompt copy per response
    assert packed.score_from.tolist() == [1, 2, 5]


def test_the_mask_is_additive_for_eager_attention_and_padding_sees_itself():
    unit = torch.tensor([[0, 0, -1]])
    part = torch.tensor([[0, 1, 0]])
    mask = prefix_sharing_mask(unit, part, torch.float64)[0, 0]
    low = torch.finfo(torch.float64).min
    assert mask.tolist() == [[0, low, low], [0, 0, low], [low, low, 0]]


def test_first_fit_decreasing_and_real_token_runs():
    # longest first: 6 -> row 0 (room 4), 5 -> row 1 (room 5), 4 -> row 0 (room 0), 3 -> row 1 (room 2)
    assert first_fit_decreasing([3, 6, 4, 5], 10) == [[1, 2], [3, 0]]
    # budget 10; prompts 3, responses 4, 2, 5, 1; keys: rows 0-1 share a prompt, 2-3 another.
    # run 1: row 0 costs 3 + 4 = 7, row 1 only its response (2): 9; row 2 would add 3 + 5 -> opens run 2
    # (8), row 3 adds its response (1): 9.
    runs = real_token_micro_batches([3, 3, 3, 3], [4, 2, 5, 1], [0, 0, 1, 1], budget=10)
    assert [m.rows for m in runs] == [(0, 1), (2, 3)]
    # without sharing row 1 costs 5: 7 + 5 > 10
    assert [m.rows for m in real_token_micro_batches([3, 3, 3, 3], [4, 2, 5, 1], None, 10)] == [(0,), (1,), (2,), (3,)]


def test_the_choice_and_what_the_run_says():
    model, _ = lora_policy(seed=1)
    assert Packing.for_model(model, "auto") == Packing(True, True, False)  # the tiny Llama runs sdpa
    assert Packing.for_model(model, "false") == PADDED
    model.config._attn_implementation = "flash_attention_2"
    assert Packing.for_model(model, "auto") == Packing(True, False, True)  # varlen: one row, no mask
    line = padding_free_line(Packing(True, False, True), "auto", "flash_attention_2", share_prompts=True)
    assert "on" in line and "repeated per response" in line
    model.config._attn_implementation = "some_kernel"
    assert Packing.for_model(model, "auto") == PADDED
    assert "some_kernel attention takes no packed rows" in padding_free_line(PADDED, "auto", "some_kernel", False)
    with pytest.raises(ValueError, match="padding_free"):
        Packing.for_model(model, "sometimes")
    # packed with a mask, prompts are shared under gradient checkpointing and FSDP2 too
    cfg = tiny_config("train.gradient_checkpointing=true").train
    assert shares_prompts(cfg, sharded=object(), packing=PACKED)
    assert not shares_prompts(cfg, sharded=object(), packing=PADDED)
    assert not shares_prompts(cfg, sharded=None, packing=Packing(True, False, True))


# ------------------------------------------------------------ the same numbers in float64

def with_observations(batch):
    """`batch` with tool observations (docs/tools.md): in every response of at least 10 tokens,
    columns 3..7 attended but not the policy's (response_mask 0), model tokens on both sides."""
    long_rows = batch.response_mask.sum(-1) >= 10
    batch.response_mask[long_rows, 3:7] = 0
    assert long_rows.sum() >= 2 and batch.observation_lengths.sum() == 4 * long_rows.sum()
    return batch


def forward_grads(model, rows, packing, share, temperature=0.7):
    model.zero_grad(set_to_none=True)
    logp, entropy, _, _ = policy_forward(model, rows.input_ids, rows.attention_mask, rows.prompt_width,
                                         rows.response_ids, temperature=temperature, response_mask=rows.response_mask,
                                         share_prompts=share, packing=packing, entropy_grad=True)
    ((logp + 0.3 * entropy) * rows.response_mask).sum().backward()  # the entropy's gradient too
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads


@pytest.mark.parametrize("share,lora,observations", [(False, True, False), (True, True, False), (False, False, False),
                                                    (True, False, False), (True, True, True), (False, True, True)])
def test_packed_forward_equals_the_padded_one_with_gradients(share, lora, observations):
    with float64_norms():
        model, tokenizer = lora_policy(seed=7)
        if not lora:
            model = model.merge_and_unload().requires_grad_(True)  # every weight trains
        model.double().train()
        rows = varied_batch(tokenizer)
        if observations:  # context both ways, no log-prob on them
            rows = with_observations(rows)
        rows.response_mask = rows.response_mask.double()
        padded, packed = forward_grads(model, rows, PADDED, share), forward_grads(model, rows, PACKED, share)
    mask = rows.response_mask != 0
    assert_equal_in_float64(packed[0], padded[0], "log-probs")
    assert_equal_in_float64(packed[1][mask], padded[1][mask], "entropy")
    assert (packed[0][~mask] == 0).all()
    assert padded[2] and packed[2].keys() == padded[2].keys()
    assert any("lora" in n for n in padded[2]) == lora
    for name, grad in padded[2].items():
        assert_equal_in_float64(packed[2][name], grad, name)


def test_eager_attention_packed_gives_the_padded_values():
    # eager takes the prefix-sharing mask additive; its softmax runs in float32, hence the tolerance
    model, tokenizer = lora_policy(seed=8)
    rows = varied_batch(tokenizer)
    with torch.no_grad():
        padded = policy_forward(model, rows.input_ids, rows.attention_mask, rows.prompt_width, rows.response_ids,
                                temperature=0.7, response_mask=rows.response_mask)[0]  # sdpa, padded
        model.config._attn_implementation = "eager"
        packing = Packing.for_model(model)
        packed = policy_forward(model, rows.input_ids, rows.attention_mask, rows.prompt_width, rows.response_ids,
                                temperature=0.7, response_mask=rows.response_mask, share_prompts=True,
                                packing=packing)[0]
    assert packing == PACKED
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)


@pytest.mark.parametrize("share", [False, True])
def test_one_sequence_cannot_see_another(share):
    """Change one token of row 0's response: row 0's later log-probs move, no other row's do."""
    model, tokenizer = lora_policy(seed=9)
    rows = varied_batch(tokenizer)
    with torch.no_grad():
        before = policy_forward(model, rows.input_ids, rows.attention_mask, rows.prompt_width, rows.response_ids,
                                temperature=1.0, response_mask=rows.response_mask, share_prompts=share,
                                packing=PACKED)[0]
        ids = rows.input_ids.clone()
        ids[0, rows.prompt_width + 2] = (ids[0, rows.prompt_width + 2] + 1) % 50 + 2
        after = policy_forward(model, ids, rows.attention_mask, rows.prompt_width, ids[:, rows.prompt_width:],
                               temperature=1.0, response_mask=rows.response_mask, share_prompts=share,
                               packing=PACKED)[0]
    assert (after[0, 3:] - before[0, 3:]).abs().max() > 1e-3  # the changed row sees its own change
    assert torch.equal(after[0, :2], before[0, :2])  # not before it
    assert torch.equal(after[1:], before[1:])


def decoder_calls(model):
    calls = []
    inner = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
    handle = inner.register_forward_pre_hook(lambda m, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)),
                                             with_kwargs=True)
    return calls, handle


def update_with(tmp_path, layout, budget, algo, lora, observations=False):
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "train.micro_batch_size=2",
                      f"algo.name={algo}", "optim.lr=0.05", "optim.warmup_steps=0", f"train.padding_free={layout}",
                      f"train.micro_batch_tokens={budget}", "train.ppo_epochs=2", "train.mini_batch_size=4",
                      f"model.lora.enabled={str(lora).lower()}")
    trainer = Trainer(cfg, tmp_path / f"{layout}{budget}")
    model = trainer.unwrapped
    model.double()
    batch = varied_batch(trainer.tokenizer)
    if observations:
        batch = with_observations(batch)
    batch.response_mask = batch.response_mask.double()
    score_rollouts(model, batch, 8, with_reference=False)  # the same old log-probs on both sides
    calls, handle = decoder_calls(model)
    stats = trainer.update(batch)
    handle.remove()
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}, stats, calls


@pytest.mark.parametrize("algo,lora,observations", [("grpo", True, False), ("dapo", True, False),
                                                    ("grpo", False, False), ("dapo", True, True)])
def test_a_packed_update_equals_the_padded_one(tmp_path, algo, lora, observations):
    with float64_norms():
        padded, padded_stats, padded_calls = update_with(tmp_path, "false", 0, algo, lora, observations)
        packed, packed_stats, packed_calls = update_with(tmp_path, "true", 120, algo, lora, observations)
    assert padded.keys() == packed.keys() and padded
    for name, value in padded.items():
        assert_equal_in_float64(packed[name], value, name)
    assert packed_stats["loss"] == pytest.approx(padded_stats["loss"], rel=1e-9)
    # the padded update runs 2 epochs x 4 micro-batches of 2 x 47 columns (and the prompts once each);
    # packed, the real tokens only: fewer positions in all
    assert sum(r * w for r, w in packed_calls) < 0.7 * sum(r * w for r, w in padded_calls)


# ------------------------------------------------------------ the scoring pass and the views

def score_both_ways(make_batch, algo_overrides, hidden_states):
    out = []
    with float64_norms():
        model, tokenizer = lora_policy(seed=4)
        model.double()
        for packing, budget in ((PADDED, 0), (PACKED, 60)):
            batch = make_batch(tokenizer)
            algo = build_algorithm(tiny_config(*algo_overrides)) if algo_overrides else None
            observe = (lambda view, algo=algo, batch=batch: algo.observe_forward(batch, view)) if algo else None
            calls, handle = decoder_calls(model)
            score_rollouts(model, batch, 3, with_reference=True, temperature=0.8, disable_adapter=model.disable_adapter,
                           share_prompts=True, micro_batch_tokens=budget, packing=packing, observe=observe,
                           wants_hidden_states=hidden_states, tokenizer=tokenizer)
            handle.remove()
            out.append((batch, calls))
    return out


@pytest.mark.parametrize("observations", [False, True])
def test_the_packed_scoring_pass_gives_the_padded_values(observations):
    make = (lambda tokenizer: with_observations(varied_batch(tokenizer))) if observations else varied_batch
    (padded, padded_calls), (packed, packed_calls) = score_both_ways(make, None, False)
    for name in ("old_logp", "entropy", "ref_logp"):
        assert_equal_in_float64(getattr(packed, name).double(), getattr(padded, name).double(), name)
        assert (getattr(packed, name)[packed.observation_mask != 0] == 0).all()  # nothing kept on observations
    assert sum(r * w for r, w in packed_calls) < 0.6 * sum(r * w for r, w in padded_calls)


@pytest.mark.parametrize("features", ["logits", "hidden_mean"])
def test_meds_features_from_packed_views(features):
    overrides = ("algo.name=meds", "meds.layers=last:3", f"meds.features={features}")
    (padded, _), (packed, _) = score_both_ways(rollouts_of, overrides, True)
    assert_equal_in_float64(packed.extras[FEATURES].double(), padded.extras[FEATURES].double(), features)
    assert_equal_in_float64(packed.old_logp.double(), padded.old_logp.double(), "old log-probs")


def test_rlif_self_certainty_from_packed_views():
    overrides = ("algo.name=rlif-multireward", "rollout.temperature=0.8", "train.ppo_epochs=2")
    (padded, _), (packed, _) = score_both_ways(rollouts_of, overrides, False)
    assert padded.extras["self_certainty"].abs().sum() > 0
    torch.testing.assert_close(packed.extras["self_certainty"], padded.extras["self_certainty"], rtol=0, atol=1e-6)


def test_the_run_says_its_layout_first(tmp_path, capsys):
    cfg = tiny_config("train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2",
                      output_dir=tmp_path / "run")
    Trainer(cfg, tmp_path / "run").train()
    err = capsys.readouterr().err
    assert "padding-free: on (sdpa attention" in err and "prefix-sharing mask" in err
