"""The scoring pass (meds_cli/engine/training/scoring.py): log-probs of the distribution generate() sampled
from (the rollout temperature), which rows get scored, and runs that skip the pass equal runs
that make it."""

import pytest
import torch
from safetensors.torch import load_file

from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.rollout.batch import rollouts_from_samples, sample_responses
from meds_cli.engine.rollout.sampling_engine import Sample, stop_token_ids
from meds_cli.engine.training.scoring import score_rollouts, scoring_pass, scoring_temperature
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.trainer import TIMING_KEYS, Trainer
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def policy():
    model, tokenizer = tiny_model_and_tokenizer()
    model = apply_lora(model, LoraConfig(rank=4))
    torch.manual_seed(3)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # an adapter that changes the logits, as after some training
            torch.nn.init.normal_(p, std=0.05)
    return model.eval(), tokenizer


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.3])
def test_old_logprobs_are_those_generate_sampled_from(policy, temperature):
    model, tokenizer = policy
    prompts = ["2*3=", "7*8=12", "9="]  # different lengths: left padding and position ids matter
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    eos = stop_token_ids(tokenizer)
    out = model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], do_sample=True,
                         temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=6, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id, output_scores=True, output_logits=True,
                         return_dict_in_generate=True)
    width = enc["input_ids"].shape[1]
    batch = rollouts_from_samples(tokenizer, [tuple(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts],
                                  [[_cut_at_stop(row.tolist(), eos)] for row in out.sequences[:, width:]], [None] * 3, 1, eos)
    score_rollouts(model, batch, 2, with_reference=False, temperature=temperature)
    # what generate sampled from: its processed scores (logits / T; top-k 0 and top-p 1 filter nothing)
    sampled_from = torch.log_softmax(torch.stack(out.scores, dim=1).float(), dim=-1)
    raw = torch.stack(out.logits, dim=1).float()
    assert torch.allclose(torch.log_softmax(raw / temperature, dim=-1), sampled_from, atol=1e-5)
    tokens = batch.response_ids
    expected = sampled_from[:, :tokens.shape[1]].gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    assert batch.response_mask.sum() > 6
    assert torch.allclose(batch.old_logp, expected, atol=1e-4)
    probs = sampled_from[:, :tokens.shape[1]].exp()
    entropy = -(probs * sampled_from[:, :tokens.shape[1]]).sum(-1) * batch.response_mask
    assert torch.allclose(batch.entropy, entropy, atol=1e-4)
    if temperature != 1.0:  # scoring at T = 1 would not match: the temperature is what makes it right
        score_rollouts(model, batch, 2, with_reference=False, temperature=1.0)
        assert not torch.allclose(batch.old_logp, expected, atol=1e-3)


def _cut_at_stop(tokens: list[int], stop_ids) -> Sample:
    """generate()'s row as the engines return it: up to and including the first stop token."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return Sample(tokens[:i + 1], True)
    return Sample(tokens, False)


@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_old_logprobs_are_those_the_rollout_engine_sampled_from(policy, temperature):
    """The hf engine's own log-probs (through its KV cache, one prefill shared by the group) are
    those of the distribution it drew from; the scoring pass at the rollout temperature gives the
    same numbers."""
    model, tokenizer = policy
    torch.manual_seed(0)
    batch = sample_responses(model, tokenizer, ["2*3=", "7*8=12"], [None, None], 3, temperature=temperature,
                             top_p=1.0, max_new_tokens=6, batch_size=4)
    assert batch.sampler_logp is not None and batch.response_mask.sum() > 6
    score_rollouts(model, batch, 2, with_reference=False, temperature=temperature)
    assert torch.allclose(batch.old_logp, batch.sampler_logp, atol=1e-4)


def test_greedy_rollouts_are_scored_at_temperature_one():
    assert scoring_temperature(0.0) == 1.0 and scoring_temperature(0.6) == 0.6


@pytest.mark.parametrize("needed_by, reference, steps, setting, expected", [
    (None, False, 1, "auto", None),  # GRPO/DAPO, one optimizer step: the update's forward stands in
    (None, False, 1, "always", "trained"),
    (None, False, 2, "auto", "trained"),  # old log-probs must come before the first optimizer step
    (None, True, 1, "auto", "trained"),  # reference log-probs
    ("shaping", False, 1, "auto", "trained"),  # MEDS: features of the groups that train
    ("rewards", False, 1, "auto", "sampled"),  # RLIF: self-certainty is a reward
    ("rewards", False, 4, "always", "sampled"),
])
def test_which_rows_are_scored(needed_by, reference, steps, setting, expected):
    assert scoring_pass(needed_by, uses_reference=reference, optimizer_steps_per_batch=steps, setting=setting) == expected


def test_a_random_update_forward_keeps_the_pass():
    assert scoring_pass(None, uses_reference=False, optimizer_steps_per_batch=1, deterministic_update=False) == "trained"
    assert scoring_pass("rewards", uses_reference=False, optimizer_steps_per_batch=1,
                        deterministic_update=False) == "sampled"


def test_dropout_makes_the_update_forward_random():
    from meds_cli.engine.config import LoraConfig
    from meds_cli.engine.model_io.model import apply_lora
    from meds_cli.engine.training.scoring import has_active_dropout

    def lora(dropout):
        return apply_lora(tiny_model_and_tokenizer()[0], LoraConfig(rank=2, dropout=dropout))

    assert not has_active_dropout(lora(0.0))
    assert has_active_dropout(lora(0.3))
    model = lora(0.0)
    model.config.attention_dropout = 0.1  # functional dropout inside attention: no module to find
    assert has_active_dropout(model)


@pytest.mark.filterwarnings("ignore:rlif-multireward")
def test_algorithms_say_when_they_read_the_forward_pass():
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    def needed(*overrides):
        return build_algorithm(tiny_config(*overrides)).forward_needs(4, records_lens=False).view

    assert needed("algo.name=grpo") is None and needed("algo.name=dapo") is None
    assert needed("algo.name=meds", "algo.base=dapo") == "shaping"
    assert needed("algo.name=edas", "algo.base=grpo") is None
    assert needed("algo.name=rlif-multireward") == "rewards"


def test_an_undeclared_observe_forward_is_scored_before_rewards():
    from algorithms.base import Algorithm, GRPOConfig

    class Watches(Algorithm):
        def observe_forward(self, rollouts, view):
            pass

    assert Watches(GRPOConfig(), None).forward_needs(4, records_lens=False).view == "rewards"


def learning(rows):
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


@pytest.mark.parametrize("algo", [["algo.name=grpo"], ["algo.name=dapo", "dapo.max_gen_batches=2"]])
def test_skipping_the_scoring_pass_changes_nothing(tmp_path, algo):
    """One PPO epoch, one mini-batch: old log-probs from the update's own forward (auto) or from a
    separate scoring pass (always) give the same metrics, entropy included, and the same weights."""
    common = (*algo, "train.steps=3", "optim.lr=0.05", "train.micro_batch_size=24", "train.checkpoint_every=3")
    runs = {}
    for setting in ("auto", "always"):
        trainer = Trainer(tiny_config(*common, f"train.scoring_pass={setting}"), tmp_path / setting)
        assert trainer.scoring == (None if setting == "auto" else "trained")
        runs[setting] = trainer.train()
    skipped, scored = runs["auto"], runs["always"]
    assert all(row["groups_trained"] > 0 for row in scored)
    assert all(row["time_score_s"] == 0 for row in skipped) and all(row["time_score_s"] > 0 for row in scored)
    assert learning(skipped) == learning(scored)
    assert all("entropy" in row and row["ratio_mean"] == 1.0 for row in skipped)
    a = load_file(str(tmp_path / "auto" / "checkpoints/step_3/weights.safetensors"))
    b = load_file(str(tmp_path / "always" / "checkpoints/step_3/weights.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    initial = dict(tiny_model_and_tokenizer()[0].named_parameters())
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k) and initial  # it trained


def test_dynamic_sampling_scores_only_the_groups_that_train(tmp_path, monkeypatch):
    from meds_cli.engine import trainer as trainer_module

    scored = []
    real = trainer_module.score_rollouts

    def recording(model, rollouts, *args, **kwargs):
        scored.append(rollouts.num_groups)
        return real(model, rollouts, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_rollouts", recording)
    cfg = tiny_config("algo.name=dapo", "dapo.max_gen_batches=3", "train.ppo_epochs=2", "train.steps=2")
    rows = Trainer(cfg, tmp_path).train()
    assert scored == [row["groups_trained"] for row in rows if row["groups_trained"] > 0]
    assert any(row["groups_sampled"] > row["groups_trained"] for row in rows)  # some groups were dropped unscored


def test_scoring_runs_in_the_precision_of_the_update(tmp_path, fresh_accelerate_state):
    """Under bf16 autocast the scoring pass computes as the update does: an unchanged policy has
    ratio exactly 1 on its first optimizer step (fp32 scoring against a bf16 update would not)."""
    cfg = tiny_config("algo.name=grpo", "train.mixed_precision=bf16", "train.scoring_pass=always", "train.steps=1")
    trainer = Trainer(cfg, tmp_path)
    assert trainer.acc.mixed_precision == "bf16" and trainer.scoring == "trained"
    row = trainer.train_step()
    assert row["ratio_mean"] == 1.0 and row["ppo_kl"] == 0.0


def test_with_lora_dropout_old_logprobs_come_from_a_deterministic_pass(tmp_path):
    """model.lora.dropout > 0: the update's train-mode forward carries dropout noise, so its own
    log-probs are not pi_old's; the pass stays under auto (kl_k1 against the sampler, which ran the
    same weights in eval mode, at rounding level) and the run equals the one with the pass forced."""
    common = ("algo.name=grpo", "model.lora.dropout=0.3", "train.steps=2", "optim.lr=0.05",
              "train.micro_batch_size=24", "train.checkpoint_every=2")
    runs = {}
    for setting in ("auto", "always"):
        trainer = Trainer(tiny_config(*common, f"train.scoring_pass={setting}"), tmp_path / setting)
        assert trainer.scoring == "trained"
        runs[setting] = trainer.train()
    assert all(abs(row["mismatch/kl_k1"]) < 1e-6 for row in runs["auto"])  # without the pass: about 1e-2
    assert learning(runs["auto"]) == learning(runs["always"])
    a = load_file(str(tmp_path / "auto" / "checkpoints/step_2/weights.safetensors"))
    b = load_file(str(tmp_path / "always" / "checkpoints/step_2/weights.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
