"""Forwards that run each distinct prompt once (`train.share_prompts`, engine/training/scoring.py) give the
log-probs, entropy and LoRA gradients of forwards that run every row whole, and whole runs agree."""

import pytest
import torch

from meds_cli.core.records import Problem
from meds_cli.engine.rollout.batch import rollouts_from_samples
from meds_cli.engine.rollout.sampling_engine import Sample
from meds_cli.engine.trainer import Trainer
from meds_cli.engine.training.scoring import policy_forward, score_rollouts
from tests.conftest import tiny_config
from tests.float64 import assert_equal_in_float64, float64_norms
from tests.tiny_policy import lora_policy

PROMPTS = ["12+3=", "7*8=(1", "9"]  # different lengths: left padding
RESPONSES = [["42", "7", "abc1"], ["5", "66", "x"], ["123", "", "9"]]  # different lengths: right padding


def batch(tokenizer, prompts=PROMPTS, responses=RESPONSES):
    """Rollouts of `responses[i]` (each ended by EOS) to `prompts[i]`, laid out as the engine lays them."""
    prompt_ids = [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    eos = tokenizer.eos_token_id
    samples = [[Sample(tokenizer(r, add_special_tokens=False)["input_ids"] + [eos], True) for r in group]
               for group in responses]
    problems = [Problem(id=str(i), question=p, answer="1") for i, p in enumerate(prompts)]
    return rollouts_from_samples(tokenizer, prompt_ids, samples, problems, len(responses[0]), [eos])


def forward_and_grads(model, rows, share):
    """(log-probs, entropy, LoRA gradients, [batch size of each call of the decoder])."""
    model.zero_grad(set_to_none=True)
    calls = []
    hook = model.get_base_model().model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    logp, entropy, _, _ = policy_forward(model, rows.input_ids, rows.attention_mask, rows.prompt_width,
                                         rows.response_ids, temperature=0.7, response_mask=rows.response_mask,
                                         share_prompts=share)
    hook.remove()
    (logp * rows.response_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads, calls


@pytest.mark.parametrize("rows", [slice(0, 9), slice(1, 7)])  # whole groups, and groups cut by a micro-batch
def test_shared_prompt_forward_equals_the_whole_forward_with_gradients(rows):
    # float64 end to end (tests/float64.py): in float32 about 20 gradient elements differ by up to
    # 6e-5 on an AVX2 machine and less on AVX-512; in float64 by ~1e-15, on any machine, while
    # detaching the copied prompt cache changes the gradients by ~1e1
    with float64_norms():
        check_shared_prompt_forward(rows)


def check_shared_prompt_forward(rows):
    model, tokenizer = lora_policy(seed=11)
    model.double().train()
    part = batch(tokenizer).select_groups(torch.ones(3, dtype=torch.bool))
    part.input_ids, part.attention_mask = part.input_ids[rows], part.attention_mask[rows]
    part.response_ids, part.response_mask = part.response_ids[rows], part.response_mask[rows]
    whole, shared = forward_and_grads(model, part, False), forward_and_grads(model, part, True)
    size, width = part.input_ids.shape[0], part.prompt_width
    assert whole[3] == [(size, part.input_ids.shape[1])]
    assert shared[3] == [(3, width), (size, part.input_ids.shape[1] - width)]  # each prompt once, then the responses
    assert_equal_in_float64(shared[0], whole[0], "log-probs")
    assert_equal_in_float64(shared[1], whole[1], "entropy")
    assert whole[2] and shared[2].keys() == whole[2].keys()  # LoRA gradients, through the copied prompt too
    for name, grad in whole[2].items():
        assert_equal_in_float64(shared[2][name], grad, name)


def test_the_scoring_pass_shares_prompts_with_the_same_results():
    with float64_norms():
        model, tokenizer = lora_policy(seed=12)
        model.double()
        rollouts = [batch(tokenizer), batch(tokenizer)]
        for rows, share in zip(rollouts, (False, True)):
            score_rollouts(model, rows, micro_batch_size=4, with_reference=True, temperature=1.3,
                           disable_adapter=model.disable_adapter, share_prompts=share)
    for name in ("old_logp", "entropy", "ref_logp"):
        assert_equal_in_float64(getattr(rollouts[1], name), getattr(rollouts[0], name), name)


def test_runs_with_and_without_shared_prompts_agree(tmp_path):
    rows = {}
    for share in ("true", "false"):
        cfg = tiny_config("rollout.prompts_per_step=4", "rollout.group_size=4", "train.micro_batch_size=6",
                          "train.steps=3", "optim.lr=0.01", f"train.share_prompts={share}", output_dir=tmp_path / share)
        rows[share] = Trainer(cfg, tmp_path / share).train()
    for a, b in zip(rows["true"], rows["false"]):
        assert a["reward"] == b["reward"]  # the same samples at every step: the updates agree
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
