"""What the `vllm` engine asks vLLM for, against a fake LLM that records its construction and
every request: how many requests, their `n` and `seed` (rollout.vllm.seed_per_request), and the
memory settings it is built with (rollout.vllm.max_model_len's default from the task's longest
prompt, rollout.vllm.max_num_batched_tokens)."""

import json
from types import SimpleNamespace

import pytest

from meds_cli.core.errors import UserError
from meds_cli.engine.config import load_config
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine
from tests.test_vllm_engine import FakeLoRARequest, FakeSamplingParams, FakeTokensPrompt

SETTINGS = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=4, stop_ids=(99,))


class RecordingLLM:
    """Records its arguments and every request (prompt, n, seed); completion i of a request is
    [request number, i]: the samples can be traced back to the request and place they came from."""

    def __init__(self, **kwargs):
        self.kwargs, self.requests = kwargs, []

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        outputs = []
        for prompt, p in zip(prompts, params):
            number = len(self.requests)
            self.requests.append((tuple(prompt["prompt_token_ids"]), p.n, p.seed))
            outputs.append(SimpleNamespace(outputs=[
                SimpleNamespace(token_ids=[number, i], logprobs=None, index=i, finish_reason="length")
                for i in range(p.n)]))
        return outputs


def recording_api(platform: str, built: list):
    def make(**kwargs):
        built.append(RecordingLLM(**kwargs))
        return built[-1]

    return SimpleNamespace(LLM=make, SamplingParams=FakeSamplingParams, LoRARequest=FakeLoRARequest,
                           TokensPrompt=FakeTokensPrompt, sleep_mode_available=lambda: False, platform=platform)


def _engine(platform, **options):
    built = []
    engine = VLLMEngine("/m", options=VLLMConfig(sleep_level=0, enforce_eager=True, **options), seed=5,
                        api=recording_api(platform, built))
    return engine, built[0]


REQUESTS = [SampleRequest((1, 2), (10, 11, 12)), SampleRequest((3,), (20, 21, 22))]


def test_on_a_gpu_one_request_per_prompt_samples_the_group_from_the_engines_seed():
    engine, llm = _engine("cuda")
    out = engine.generate(REQUESTS, SETTINGS)
    assert llm.requests == [((1, 2), 3, None), ((3,), 3, None)]  # n = group size, no per-request seed
    assert llm.kwargs["seed"] == 5  # the engine's seed draws them
    assert [[s.token_ids for s in group] for group in out] == [[[0, 0], [0, 1], [0, 2]], [[1, 0], [1, 1], [1, 2]]]


def test_on_cpu_one_request_per_sample_with_its_own_seed():
    engine, llm = _engine("cpu")
    out = engine.generate(REQUESTS, SETTINGS)
    assert llm.requests == [((1, 2), 1, 10), ((1, 2), 1, 11), ((1, 2), 1, 12), ((3,), 1, 20), ((3,), 1, 21),
                            ((3,), 1, 22)]
    assert [[s.token_ids[0] for s in group] for group in out] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("platform, option, per_sample", [("cuda", True, True), ("cpu", False, False),
                                                          ("cuda", "auto", False), ("cpu", "auto", True)])
def test_the_setting_overrides_the_platforms_default(platform, option, per_sample):
    engine, llm = _engine(platform, seed_per_request=option)
    engine.generate(REQUESTS, SETTINGS)
    assert len(llm.requests) == (6 if per_sample else 2)
    assert all(seed is not None for _, _, seed in llm.requests) == per_sample


def test_tensor_parallel_pooling_keeps_each_process_its_own_samples():
    # the first process of the group asked for one prompt twice; items are (prompt ids, seed, token budget)
    other = [((8, 8), 40, SETTINGS.max_new_tokens), ((8, 8), 41, SETTINGS.max_new_tokens)]
    built = []
    engine = VLLMEngine("/m", options=VLLMConfig(sleep_level=0, enforce_eager=True, tensor_parallel_size=2),
                        api=recording_api("cuda", built), processes=2, tp_gather=lambda mine: ([other, mine], 1))
    out = engine.generate(REQUESTS, SETTINGS)
    assert built[0].requests == [((8, 8), 2, None), ((1, 2), 3, None), ((3,), 3, None)]
    assert [[s.token_ids for s in group] for group in out] == [[[1, 0], [1, 1], [1, 2]], [[2, 0], [2, 1], [2, 2]]]


@pytest.mark.parametrize("value, expected", [("auto", "auto"), ("true", True), ("false", False)])
def test_seed_per_request_takes_auto_true_or_false(value, expected):
    assert load_config(overrides=[f"rollout.vllm.seed_per_request={value}"]).rollout.vllm.seed_per_request == expected


def test_seed_per_request_refuses_anything_else_in_one_line():
    with pytest.raises(UserError, match="rollout.vllm.seed_per_request must be auto, true or false, got sometimes"):
        load_config(overrides=["rollout.vllm.seed_per_request=sometimes"])


# ---------------------------------------------------------------- memory settings


def test_max_model_len_defaults_to_what_the_run_asks_for_and_the_batch_budget_is_passed():
    _, llm = _engine("cuda")
    assert "max_model_len" not in llm.kwargs and "max_num_batched_tokens" not in llm.kwargs  # nothing known: vLLM's
    built = []
    VLLMEngine("/m", options=VLLMConfig(sleep_level=0, enforce_eager=True, max_num_batched_tokens=8192),
               api=recording_api("cuda", built), model_len=1300)
    assert built[0].kwargs["max_model_len"] == 1300 and built[0].kwargs["max_num_batched_tokens"] == 8192
    VLLMEngine("/m", options=VLLMConfig(sleep_level=0, enforce_eager=True, max_model_len=4096),
               api=recording_api("cuda", built), model_len=1300)
    assert built[1].kwargs["max_model_len"] == 4096  # a length set in the config wins


def _training_engine(tmp_path, monkeypatch, *overrides):
    from benchmarks.tasks import build_task
    from meds_cli.engine.model_io.tiny import tiny_tokenizer
    from meds_cli.engine.rollout import engines, vllm_engine
    from tests.test_vllm_engine import _policy

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    built = []
    monkeypatch.setattr(engines, "vllm_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "vllm_api", lambda: recording_api("cuda", built))
    cfg = load_config(overrides=["rollout.engine=vllm", f"model.name={model_dir}", "task.name=arithmetic",
                                 "rollout.max_new_tokens=100", "rollout.vllm.sleep_level=0", *overrides])
    tokenizer = tiny_tokenizer()
    engines.make_engine(cfg, _policy(), tokenizer, task=build_task(cfg.task, cfg.train.seed),
                        scratch_dir=tmp_path / "scratch")
    return cfg, tokenizer, built[0].kwargs


def test_a_training_engine_reserves_the_longest_prompt_plus_the_response_limit(tmp_path, monkeypatch):
    from benchmarks.tasks import build_task

    cfg, tokenizer, kwargs = _training_engine(tmp_path, monkeypatch)
    task = build_task(cfg.task, cfg.train.seed)
    prompts = [task.prompt(p, tokenizer) for p in (*task.train, *task.held_out)]
    longest = max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])
    assert 5 < longest < 200  # measured, not a fixed guess
    assert kwargs["max_model_len"] == longest + 100


def test_the_prompt_cap_bounds_the_reserved_length(tmp_path, monkeypatch):
    # task.max_prompt_tokens leaves longer prompts out, so none longer reaches the engine
    _, _, kwargs = _training_engine(tmp_path, monkeypatch, "task.max_prompt_tokens=5")
    assert kwargs["max_model_len"] == 5 + 100
