"""The trainer drives its rollout engine through the interface only: it releases the engine
before the update, tells it after every optimizer step, logs the sampler/trainer mismatch, and
weights the loss by the truncated importance ratio when asked. A new engine is one registry entry
(docs/extending.md, "Adding a rollout engine"), which training and `meds eval` both find."""

import dataclasses
import math

import pytest
import torch

from benchmarks.generation import GenerationSettings, Request
from meds_cli.core.errors import UserError
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout import engines
from meds_cli.engine.rollout.engines import ROLLOUT_ENGINES, EngineKind, make_backend
from meds_cli.engine.rollout.eval_backends import HFBackend, ModelSpec
from meds_cli.engine.rollout.hf_sampler import HFConfig, HFEngine
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config


class RecordingEngine:
    """Wraps the trainer's own engine and records the calls it receives."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.records_lens = inner.name, inner.records_lens
        self.reads_policy_weights = inner.reads_policy_weights

    def generate(self, requests, settings):
        self.calls.append("generate")
        return self.inner.generate(requests, settings)

    def policy_updated(self):
        self.calls.append("policy_updated")

    def policy_settled(self, version):
        self.calls.append("policy_settled")

    def release(self):
        self.calls.append("release")

    def close(self):
        self.inner.close()


def test_engine_is_released_for_the_update_and_told_of_every_optimizer_step(tmp_path):
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "train.mini_batch_size=4",
                      "train.micro_batch_size=4", output_dir=tmp_path)
    trainer = Trainer(cfg, tmp_path)
    trainer.engine = RecordingEngine(trainer.engine)
    row = trainer.train_step()
    assert row["optimizer_steps"] == 2
    # released before the scoring pass, and again before the update (a no-op for an engine already asleep)
    assert trainer.engine.calls == ["generate", "release", "release", "policy_updated", "policy_updated",
                                    "policy_settled"]


def test_hf_engine_logprobs_agree_with_the_trainer_and_the_gap_is_logged(tmp_path):
    trainer = Trainer(tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", output_dir=tmp_path), tmp_path)
    row = trainer.train_step()
    # Same model, same temperature: only the merged adapter's rounding separates the two.
    assert 0 <= row["mismatch/logp_abs_diff"] < 1e-4
    assert abs(row["mismatch/kl_k3"]) < 1e-6 and row["mismatch/tis_capped"] == 0.0


def _update_loss(tmp_path, correction: str) -> float:
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "algo.name=grpo",
                      "grpo.loss_agg=token-mean", f"rollout.is_correction={correction}", "rollout.tis_cap=1.5",
                      output_dir=tmp_path / correction)
    trainer = Trainer(cfg, tmp_path / correction)
    torch.manual_seed(7)
    batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
    # The sampler gave every token half the trainer's probability (the hf engine's own log-probs
    # equal the trainer's to 1e-4, so every ratio is about 2, over the cap). GRPO with one step has
    # no scoring pass: the update's forward gives the old log-probs the weights are taken against.
    batch.sampler_logp = batch.sampler_logp - math.log(2.0)
    batch.advantages = torch.linspace(-1.0, 2.0, batch.size)  # the toy task starts with no reward spread
    return trainer.update(batch)["loss"]


def test_tis_weights_each_token_loss_by_the_capped_ratio(tmp_path):
    plain, corrected = _update_loss(tmp_path, "none"), _update_loss(tmp_path, "tis")
    assert plain != 0
    assert corrected == pytest.approx(1.5 * plain, rel=1e-5)  # ratio 2, capped at 1.5


def test_mismatch_metrics_are_not_logged_under_nucleus_sampling(tmp_path):
    # The sampler's log-probs are of the nucleus (renormalised), the trainer's of the full softmax:
    # the gap would be the nucleus mass, not a kernel mismatch (engine/training/importance.py).
    trainer = Trainer(tiny_config("rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.top_p=0.7",
                                  output_dir=tmp_path), tmp_path)
    row = trainer.train_step()
    assert trainer.sampler_is_full_softmax is False and not any(key.startswith("mismatch/") for key in row)


class GreedyEngine(HFEngine):
    """The pattern of a new engine: the rollout interface (here the hf decode loop, always greedy)."""

    name = "greedy"

    def generate(self, requests, settings):
        return super().generate(requests, dataclasses.replace(settings, temperature=0.0))


def refuse_top_p_below_one(cfg):
    if cfg.rollout.top_p < 1:
        raise UserError(f"rollout.top_p={cfg.rollout.top_p}: the greedy engine ignores top_p; leave it at 1")


@pytest.fixture
def greedy_registered(monkeypatch):
    """Registers the `greedy` engine for one test (monkeypatch removes it afterwards)."""
    def for_training(settings, context):  # its settings sections and the run's context (engines.EngineContext)
        return GreedyEngine(context.model, context.tokenizer.pad_token_id, settings["hf"].generation_batch_size)

    def for_eval(spec, settings):
        model, tokenizer = tiny_model_and_tokenizer()
        backend = HFBackend(model, tokenizer, settings)
        backend.engine = GreedyEngine(model, tokenizer.pad_token_id, settings.batch_size)
        return backend

    entries = dict(ROLLOUT_ENGINES._entries)
    monkeypatch.setattr(ROLLOUT_ENGINES, "_entries", entries)
    ROLLOUT_ENGINES.register("greedy", "the hf decode loop, greedy whatever the temperature")(EngineKind(
        unavailable=lambda: None, preferred=lambda: False, check=refuse_top_p_below_one,
        for_training=for_training, for_eval=for_eval, engine_class=GreedyEngine, settings={"hf": HFConfig}))


def test_a_registered_engine_serves_training_and_eval(tmp_path, greedy_registered):
    assert engines.engine_names() == ["greedy", "hf", "hf-worker", "vllm", "vllm-server", "auto"]
    trainer = Trainer(tiny_config("rollout.engine=greedy", "rollout.prompts_per_step=2", "rollout.group_size=4",
                                  output_dir=tmp_path), tmp_path)
    assert isinstance(trainer.engine, GreedyEngine)
    trainer.train_step()
    batch, _, _ = trainer.collect({"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0})
    for g in range(0, batch.size, 4):  # greedy: the four responses of a prompt are one response
        assert len(set(batch.response_texts[g:g + 4])) == 1
    backend = make_backend("greedy", ModelSpec("tiny-llama"), GenerationSettings(1.0, 1.0, 4, 8))
    assert isinstance(backend.engine, GreedyEngine)
    texts = backend.generate([Request("12+3=", 3, 5)])[0].texts
    assert len(texts) == 3 and len(set(texts)) == 1
    with pytest.raises(UserError, match="the greedy engine ignores top_p"):  # its check runs when the config loads
        tiny_config("rollout.engine=greedy", "rollout.top_p=0.9")


def test_an_engine_that_is_not_registered_is_refused_in_one_line():
    with pytest.raises(UserError,
                       match="unknown rollout.engine 'greedy'; accepted: hf, hf-worker, vllm, vllm-server, auto"):
        tiny_config("rollout.engine=greedy")
