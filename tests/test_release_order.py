"""Memory between rollout and update (issue 37): the rollout engine is released (vLLM sleeps)
before the scoring pass, not only before the update, and the vLLM engine empties PyTorch's CUDA
cache after sleeping and before waking (freed activations otherwise stay cached and vLLM's
wake-up runs out of memory)."""

import torch

import meds_cli.engine.trainer as trainer_module
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings
from meds_cli.engine.rollout.vllm_engine import VLLMConfig
from meds_cli.engine.trainer import Trainer
from tests.conftest import tiny_config
from tests.test_vllm_engine import _engine


class RecordingEngine:
    """Records sample / release / update / wake as a sleeping engine would: a release while
    asleep does nothing, a generate while asleep wakes first."""

    name = "recording-fake"
    records_lens = False
    reads_policy_weights = True

    def __init__(self, events, stop_id):
        self.events, self.stop_id, self.asleep = events, stop_id, False

    def generate(self, requests, settings):
        if self.asleep:
            self.events.append("wake")
            self.asleep = False
        self.events.append("sample")
        return [[Sample([5, self.stop_id], True) for _ in r.seeds] for r in requests]

    def release(self):
        if not self.asleep:
            self.events.append("release")
            self.asleep = True

    def policy_updated(self):
        self.events.append("update")

    def policy_settled(self, version):
        pass

    def close(self):
        pass


def test_the_engine_is_released_before_the_scoring_pass(tmp_path, monkeypatch):
    cfg = tiny_config("rollout.prompts_per_step=2", "rollout.group_size=2", "train.scoring_pass=always",
                      "train.steps=2", output_dir=tmp_path / "run")
    trainer = Trainer(cfg, tmp_path / "run")
    events = []
    trainer.engine = RecordingEngine(events, trainer.tokenizer.eos_token_id)
    real_score = trainer_module.score_rollouts

    def recording_score(*args, **kwargs):
        events.append("score")
        return real_score(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "score_rollouts", recording_score)
    # rewards with a spread, so that every step updates
    monkeypatch.setattr(trainer.algorithm, "compute_advantages", lambda batch: torch.linspace(-1, 1, batch.size))
    trainer.train_step()
    trainer.train_step()
    assert events == ["sample", "release", "score", "update", "wake", "sample", "release", "score", "update"]


def test_vllm_empties_the_cuda_cache_after_sleep_and_before_wake_up(tmp_path, monkeypatch):
    events = []
    engine, _ = _engine(tmp_path, events, lora=False, options=VLLMConfig(sleep_level=1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append(("empty_cache",)))
    request = [SampleRequest((1,), (3,))]
    settings = SamplingSettings(1.0, 1.0, 4, (99,))
    engine.generate(request, settings)
    engine.release()
    engine.policy_updated()
    engine.generate(request, settings)
    names = [e[0] for e in events]
    start = names.index("sleep")
    assert names[start:start + 4] == ["sleep", "empty_cache", "empty_cache", "wake_up"]


def test_without_cuda_the_cache_is_left_alone(tmp_path, monkeypatch):
    events = []
    engine, _ = _engine(tmp_path, events, lora=False, options=VLLMConfig(sleep_level=1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append(("empty_cache",)))
    engine.release()
    engine.generate([SampleRequest((1,), (3,))], SamplingSettings(1.0, 1.0, 4, (99,)))
    assert "empty_cache" not in [e[0] for e in events]
