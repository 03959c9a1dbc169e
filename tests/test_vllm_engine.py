"""The `vllm` engine's orchestration against a fake with vLLM's call surface (LLM,
SamplingParams, LoRARequest, TokensPrompt): what is passed, when the policy is pushed, which
adapter id is served, sleep/wake order. tests/test_vllm_real.py runs the engine on the real vLLM."""

import copy
import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from meds_cli.core.errors import UserError
from meds_cli.engine.config import LoraConfig, load_config
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout.engines import resolve_engine
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
from meds_cli.engine.rollout.vllm_engine import (
    VLLMConfig,
    VLLMEngine,
    merged_weights,
    supported_lora_rank,
    vllm_available,
)

STOP = 99


@dataclass
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    min_tokens: int = 0
    stop_token_ids: list = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    detokenize: bool = True


@dataclass
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


def FakeTokensPrompt(prompt_token_ids):  # noqa: N802 - vLLM's TypedDict is called like a class
    return {"prompt_token_ids": prompt_token_ids}


class FakeLLM:
    """Records every call in `events`; generates [seed % 50, seed % 7, STOP] for each request
    (or max_tokens tokens when that is shorter), with log-probs -0.1 * position."""

    def __init__(self, events, with_rpc=True, reload=False, **kwargs):
        self.events, self.kwargs = events, kwargs
        self.loaded = []
        events.append(("init", kwargs))
        model = SimpleNamespace(load_weights=self._load)
        # vLLM's runner may hold a wrapper in `.model` (no load_weights); get_model() is the model.
        runner = SimpleNamespace(model=SimpleNamespace(wrapped=model), get_model=lambda: model)
        if not with_rpc:  # an older vLLM: no collective_rpc, no get_model
            runner = SimpleNamespace(model=model)
            self.collective_rpc = None
            self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
                model_runner=runner)))
        self.worker = SimpleNamespace(model_runner=runner)
        if reload:  # vLLM 0.32's worker: weights reloaded in place, in checkpoint format
            self.worker.reload_weights = lambda weights_iterator, is_checkpoint_format: (
                self.events.append(("reload", is_checkpoint_format)), self._load(list(weights_iterator)))

    def _load(self, weights):
        weights = list(weights)  # the engine hands over an iterator (one FSDP2 unit gathered at a time)
        self.loaded.append(dict(weights))
        self.events.append(("load_weights", len(weights)))

    def collective_rpc(self, method, args=()):
        self.events.append(("collective_rpc",))
        return [method(self.worker, *args)]

    def sleep(self, level=1):
        self.events.append(("sleep", level))

    def wake_up(self, tags=None):
        self.events.append(("wake_up", tuple(tags) if tags else None))

    def reset_prefix_cache(self):
        self.events.append(("reset_prefix_cache",))

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.events.append(("generate", prompts, params, lora_request))
        outputs = []
        for p in params:
            tokens = [p.seed % 50, p.seed % 7, STOP][:p.max_tokens]
            stopped = tokens[-1] in p.stop_token_ids
            logprobs = [{t: SimpleNamespace(logprob=-0.1 * i)} for i, t in enumerate(tokens)]
            completion = SimpleNamespace(token_ids=tokens, logprobs=logprobs, index=0,
                                         finish_reason="stop" if stopped else "length")
            outputs.append(SimpleNamespace(outputs=[completion]))
        return outputs


def fake_api(events, with_rpc=True, sleep_mode=True, reload=False, platform="fake"):
    return SimpleNamespace(LLM=lambda **kw: FakeLLM(events, with_rpc, reload, **kw), SamplingParams=FakeSamplingParams,
                           LoRARequest=FakeLoRARequest, TokensPrompt=FakeTokensPrompt,
                           sleep_mode_available=lambda: sleep_mode, platform=platform)


def _policy(lora=True):
    model, _ = tiny_model_and_tokenizer()
    if lora:
        model = apply_lora(model, LoraConfig(rank=12))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    return model


def _engine(tmp_path, events, *, lora=True, options=None, **kwargs):
    options = options or VLLMConfig()
    policy = _policy(lora)
    engine = VLLMEngine("/models/tiny", options=options, seed=5, policy=policy,
                        lora_rank=12 if lora else None, scratch_dir=tmp_path, api=fake_api(events), **kwargs)
    return engine, policy


def _names(events):
    return [e[0] for e in events]


SETTINGS = SamplingSettings(temperature=0.8, top_p=0.95, max_new_tokens=8, stop_ids=(STOP, 2), min_new_tokens=1)


def test_lora_rank_rounds_up_to_a_size_vllm_accepts():
    # vLLM accepts max_lora_rank 1: a rank-1 adapter is not padded to 8.
    assert [supported_lora_rank(r) for r in (1, 2, 8, 12, 16, 17, 64, 200, 300, 512)] == [1, 8, 8, 16, 16, 32, 64, 256,
                                                                                            320, 512]
    with pytest.raises(UserError, match="larger than vLLM supports"):
        supported_lora_rank(600)


def test_engine_is_built_with_the_options_and_a_rounded_rank(tmp_path):
    events = []
    _engine(tmp_path, events, options=VLLMConfig(gpu_memory_utilization=0.4, tensor_parallel_size=1, max_model_len=512))
    kwargs = events[0][1]
    assert kwargs["max_lora_rank"] == 16 and kwargs["enable_lora"] and kwargs["max_loras"] == 1
    assert kwargs["gpu_memory_utilization"] == 0.4 and kwargs["enable_sleep_mode"] and kwargs["max_model_len"] == 512
    assert kwargs["logprobs_mode"] == "processed_logprobs" and kwargs["seed"] == 5 and kwargs["dtype"] == "bfloat16"
    assert "distributed_executor_backend" not in kwargs


def test_prompts_go_as_token_ids_one_request_per_sample_with_our_stop_ids(tmp_path):
    events = []
    engine, _ = _engine(tmp_path, events)
    out = engine.generate([SampleRequest((1, 5, 7), (11, 12)), SampleRequest((4,), (13,))], SETTINGS)
    _, prompts, params, lora = [e for e in events if e[0] == "generate"][0]
    assert prompts == [{"prompt_token_ids": [1, 5, 7]}, {"prompt_token_ids": [1, 5, 7]}, {"prompt_token_ids": [4]}]
    assert [p.seed for p in params] == [11, 12, 13]
    for p in params:
        assert (p.n, p.temperature, p.top_p, p.max_tokens, p.min_tokens) == (1, 0.8, 0.95, 8, 1)
        assert p.stop_token_ids == [STOP, 2] and p.ignore_eos and p.logprobs == 0 and not p.detokenize
    assert [[s.token_ids for s in r] for r in out] == [[[11, 4, STOP], [12, 5, STOP]], [[13, 6, STOP]]]
    assert out[0][0].stopped and out[0][0].logprobs == pytest.approx([0.0, -0.1, -0.2])


def test_a_response_cut_at_the_limit_is_not_stopped(tmp_path):
    events = []
    engine, _ = _engine(tmp_path, events)
    sample = engine.generate([SampleRequest((1,), (20,))], SamplingSettings(1.0, 1.0, 2, (STOP,)))[0][0]
    assert sample.token_ids == [20, 6] and not sample.stopped


def test_adapter_is_pushed_once_per_policy_change_with_a_new_id(tmp_path):
    events = []
    engine, policy = _engine(tmp_path, events)
    request = [SampleRequest((1,), (3,))]
    engine.generate(request, SETTINGS)  # the first call serves the policy as it is (a resumed adapter)
    engine.generate(request, SETTINGS)  # nothing changed: same adapter, no new folder
    engine.policy_updated()
    engine.policy_updated()  # two optimizer steps, one push
    engine.generate(request, SETTINGS)
    served = [e[3] for e in events if e[0] == "generate"]
    assert [(r.lora_name, r.lora_int_id) for r in served] == [("policy-1", 1), ("policy-1", 1), ("policy-2", 2)]
    assert served[2].lora_path == str((tmp_path / "adapter-2").resolve())
    config = json.loads((tmp_path / "adapter-2" / "adapter_config.json").read_text())
    assert config["r"] == 12
    assert not (tmp_path / "adapter-1").exists()  # served already, never asked for again
    assert "load_weights" not in _names(events)


def test_sleep_during_the_update_and_wake_before_the_push(tmp_path):
    events = []
    engine, _ = _engine(tmp_path, events, lora=False)
    request = [SampleRequest((1,), (3,))]
    engine.generate(request, SETTINGS)
    engine.release()
    engine.release()  # already asleep: no second call
    engine.policy_updated()
    engine.generate(request, SETTINGS)
    assert _names(events) == ["init", "collective_rpc", "load_weights", "reset_prefix_cache", "generate",
                              "sleep", "wake_up", "collective_rpc", "load_weights", "reset_prefix_cache", "generate"]
    assert ("sleep", 1) in events and ("wake_up", None) in events


def test_no_sleep_mode_means_no_sleep(tmp_path):
    events = []
    engine, _ = _engine(tmp_path, events, options=VLLMConfig(sleep_level=0))
    engine.release()
    assert "sleep" not in _names(events) and not events[0][1]["enable_sleep_mode"]


def test_sleep_is_off_in_one_line_where_the_platform_has_no_sleep_mode(tmp_path):
    events, said = [], []
    engine = VLLMEngine("/m", options=VLLMConfig(sleep_level=1, sync="merged"), policy=_policy(lora=False),
                        api=fake_api(events, sleep_mode=False), say=said.append)
    assert not events[0][1]["enable_sleep_mode"]  # vLLM on CPU refuses enable_sleep_mode=True
    assert said == ["rollout.vllm.sleep_level=1: vLLM has no sleep mode on this platform (fake), so it stays awake "
                    "while the trainer updates"]
    engine.release()
    engine.policy_updated()
    engine.generate([SampleRequest((1,), (3,))], SETTINGS)
    assert "sleep" not in _names(events) and "wake_up" not in _names(events)


def test_level_two_sleep_wakes_weights_then_loads_then_wakes_the_kv_cache(tmp_path):
    events = []
    engine, _ = _engine(tmp_path, events, options=VLLMConfig(sleep_level=2, sync="merged"))
    request = [SampleRequest((1,), (3,))]
    engine.generate(request, SETTINGS)
    del events[:]
    engine.release()
    engine.generate(request, SETTINGS)  # no optimizer step, but level 2 dropped the weights: push anyway
    assert _names(events) == ["sleep", "wake_up", "collective_rpc", "load_weights", "reset_prefix_cache", "wake_up",
                              "generate"]
    assert events[1] == ("wake_up", ("weights",)) and events[5] == ("wake_up", ("kv_cache",))


def test_level_two_sleep_with_adapter_pushes_is_refused(tmp_path):
    with pytest.raises(UserError, match="sleep_level=2"):
        _engine(tmp_path, [], options=VLLMConfig(sleep_level=2, sync="adapter"))


@pytest.mark.parametrize("setting, message", [
    ("rollout.vllm.gpu_memory_utilization=1.5", "must be in \\(0, 1\\], got 1.5"),
    ("rollout.vllm.sync=copy", "accepted: adapter, merged"),
    ("rollout.vllm.sleep_level=3", "must be 0, 1 or 2"),
    ("rollout.vllm.tensor_parallel_size=0", "at least 1"),
    ("rollout.engine=vvlm",
     "unknown rollout.engine 'vvlm' \\(did you mean 'vllm'\\?\\); accepted: hf, hf-worker, vllm, vllm-server, auto"),
    ("rollout.vllm.dtype=fp8", "accepted: bfloat16, float16, float32, auto"),
    ("rollout.vllm.max_model_len=-1", "at least 0"),
    ("rollout.is_correction=ppo", "accepted: none, tis"),
    ("rollout.tis_cap=0", "greater than 0"),
    ("rollout.min_new_tokens=65", "must not exceed max_new_tokens=64"),
])
def test_bad_engine_settings_are_refused_when_the_config_loads(setting, message):
    with pytest.raises(UserError, match=message):
        load_config(overrides=[setting])


@pytest.mark.parametrize("settings, key", [
    (["rollout.temperature=2.5"], "rollout.temperature=2.5"),
    (["eval.temperature=3"], "eval.temperature=3.0"),
])
def test_temperatures_vllm_refuses_are_refused_when_the_config_loads(settings, key):
    with pytest.raises(UserError, match=f"{key} is above 2, the highest temperature vLLM samples at"):
        load_config(overrides=["rollout.engine=vllm", *settings])
    assert load_config(overrides=["rollout.engine=hf", *settings])  # the hf engine samples at any temperature


def test_merged_sync_loads_plain_weights_with_the_adapter_folded_in(tmp_path):
    events = []
    engine, policy = _engine(tmp_path, events, options=VLLMConfig(sync="merged", dtype="float32"))
    assert "enable_lora" not in events[0][1]
    engine.generate([SampleRequest((1,), (3,))], SETTINGS)
    loaded = engine.llm.loaded[-1]
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(loaded) == {n for n in reference if n != "lm_head.weight" or not policy.config.tie_word_embeddings}
    for name, tensor in loaded.items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6)
    assert [e[3] for e in events if e[0] == "generate"] == [None]  # no adapter request when weights are merged


@pytest.mark.parametrize("setting, dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                             ("auto", torch.float32)])
def test_merged_weights_are_cast_to_the_engines_dtype(tmp_path, setting, dtype):
    events = []
    engine, _ = _engine(tmp_path, events, options=VLLMConfig(sync="merged", dtype=setting))
    engine.generate([SampleRequest((1,), (3,))], SETTINGS)
    assert {t.dtype for t in engine.llm.loaded[-1].values()} == {dtype}  # auto: the policy's own float32


def test_weights_load_without_collective_rpc_through_the_driver_worker(tmp_path):
    events = []
    engine = VLLMEngine("/m", options=VLLMConfig(dtype="float16"), policy=_policy(lora=False),
                        api=fake_api(events, with_rpc=False))
    engine.generate([SampleRequest((1,), (3,))], SETTINGS)
    assert "collective_rpc" not in _names(events) and "load_weights" in _names(events)
    assert "model.embed_tokens.weight" in engine.llm.loaded[-1]


def test_a_fixed_checkpoint_adapter_is_served_and_never_pushed(tmp_path):
    events = []
    engine = VLLMEngine("/m", options=VLLMConfig(), lora_rank=64, adapter_path=tmp_path,
                        api=fake_api(events))
    engine.policy_updated()
    engine.generate([SampleRequest((1,), (3,))], SETTINGS)
    assert events[0][1]["max_lora_rank"] == 64
    served = [e[3] for e in events if e[0] == "generate"][0]
    assert (served.lora_int_id, served.lora_path) == (1, str(tmp_path.resolve()))
    assert "load_weights" not in _names(events)


def test_tensor_parallel_processes_pool_their_prompts_and_keep_their_own_share(tmp_path):
    events = []
    other = [((8, 8), 40, SETTINGS.max_new_tokens)]  # (prompt ids, seed, token budget) of the other process's sample

    def gather(mine):  # this process is second in its group of two
        return [other, mine], 1

    engine, _ = _engine(tmp_path, events, options=VLLMConfig(tensor_parallel_size=2), processes=2, tp_gather=gather)
    assert events[0][1]["distributed_executor_backend"] == "external_launcher"
    out = engine.generate([SampleRequest((1,), (3, 4))], SETTINGS)
    prompts = [e[1] for e in events if e[0] == "generate"][0]
    assert [p["prompt_token_ids"] for p in prompts] == [[8, 8], [1], [1]]
    assert [s.token_ids[0] for s in out[0]] == [3, 4]


def test_merged_weights_of_a_plain_model_are_its_parameters():
    model = _policy(lora=False)
    weights = dict(merged_weights(model))
    assert set(weights) == {n for n, _ in model.named_parameters()}
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters())


def test_engine_choice():
    assert resolve_engine("hf") == "hf"
    assert resolve_engine("auto") == "hf"  # no vllm and no GPU here
    with pytest.raises(UserError, match="accepted: hf, hf-worker, vllm, vllm-server, auto"):
        resolve_engine("vvlm")
    if not vllm_available():
        with pytest.raises(UserError, match="rollout.engine=vllm needs the vllm package"):
            resolve_engine("vllm")


def test_eval_backend_serves_the_checkpoint_adapter_with_token_ids_and_our_stop_ids(tmp_path):
    from benchmarks.generation import GenerationSettings, Request
    from meds_cli.engine.model_io.tiny import tiny_tokenizer
    from meds_cli.engine.rollout.eval_backends import ModelSpec, VLLMBackend, sample_seeds

    model_dir = tmp_path / "model"
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    adapter = tmp_path / "run" / "checkpoints" / "step_3" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 24}))
    save_file({"base_model.lora_A.weight": torch.zeros(24, 4)}, adapter / "adapter_model.safetensors")
    events = []
    backend = VLLMBackend(ModelSpec(str(model_dir), checkpoint=adapter.parent), GenerationSettings(0.6, 1.0, 5, 8),
                          api=fake_api(events))
    assert events == []  # vLLM starts when it sees the prompts it must hold
    requests = [Request("12+3=", 2, 7), Request("9", 1, 8)]
    assert backend.call_sizes(requests) == [2]
    kwargs = events[0][1]
    assert kwargs["max_lora_rank"] == 32 and kwargs["gpu_memory_utilization"] == 0.9 and not kwargs["enable_sleep_mode"]
    # KV cache for the longest prompt and the response limit, not the model's own limit
    assert kwargs["max_model_len"] == len(tokenizer("12+3=", add_special_tokens=False)["input_ids"]) + 5
    out = backend.generate(requests)
    _, prompts, params, lora = [e for e in events if e[0] == "generate"][0]
    assert prompts[0]["prompt_token_ids"] == tokenizer("12+3=", add_special_tokens=False)["input_ids"]
    assert [p.seed for p in params] == [*sample_seeds(7, 2), *sample_seeds(8, 1)]
    assert params[0].stop_token_ids == [tokenizer.eos_token_id] and params[0].max_tokens == 5
    assert (lora.lora_int_id, lora.lora_path) == (1, str(adapter.resolve()))
    assert [len(g.texts) for g in out] == [2, 1]
    assert out[0].lengths == [3, 3] and out[0].truncated == [True, True]  # STOP is not one of this tokenizer's stops


def test_eval_backend_reserves_no_more_than_the_models_limit_and_starts_once(tmp_path):
    from benchmarks.generation import GenerationSettings, Request
    from meds_cli.engine.model_io.tiny import tiny_tokenizer
    from meds_cli.engine.rollout.eval_backends import ModelSpec, VLLMBackend

    model_dir = tmp_path / "model"
    tiny_tokenizer().save_pretrained(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    events = []
    backend = VLLMBackend(ModelSpec(str(model_dir)), GenerationSettings(0.6, 1.0, 100, 8), api=fake_api(events))
    assert backend.call_sizes([]) == [] and events == []  # nothing left to sample: vLLM never starts
    backend.generate([Request("12+3=", 1, 7)])  # without call_sizes: sized by these requests
    backend.generate([Request("9", 1, 8)])
    inits = [e[1] for e in events if e[0] == "init"]
    assert len(inits) == 1 and inits[0]["max_model_len"] == 64  # prompt + 100 capped at the model's 64


def test_the_processes_of_one_tensor_parallel_group_share_an_engine_seed(tmp_path, monkeypatch):
    from benchmarks.tasks import build_task
    from meds_cli.engine.model_io.tiny import tiny_tokenizer
    from meds_cli.engine.rollout import engines, vllm_engine

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    events = []
    monkeypatch.setattr(engines, "vllm_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "vllm_api", lambda: fake_api(events))
    monkeypatch.setattr(engines, "tensor_parallel_gather", lambda size: None)
    cfg = load_config(overrides=["rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2", "train.seed=10",
                                 f"model.name={model_dir}"])
    task = build_task(cfg.task, cfg.train.seed)
    for rank in range(4):
        engines.make_engine(cfg, _policy(), tiny_tokenizer(), task=task, scratch_dir=tmp_path / f"rank-{rank}",
                            processes=4, rank=rank)
    assert [e[1]["seed"] for e in events if e[0] == "init"] == [10, 10, 11, 11]  # TRL's rank // tp


def test_eval_backend_refuses_a_temperature_vllm_refuses(tmp_path):
    from benchmarks.generation import GenerationSettings
    from meds_cli.engine.rollout.eval_backends import ModelSpec, VLLMBackend

    events = []
    with pytest.raises(UserError, match="--temperature=2.5 is above 2"):
        VLLMBackend(ModelSpec(str(tmp_path)), GenerationSettings(2.5, 1.0, 5, 8), api=fake_api(events))
    assert events == []  # refused before any engine was built


def test_a_worker_that_reloads_in_place_gets_the_weights_in_checkpoint_format(tmp_path):
    events = []
    engine = VLLMEngine("/m", options=VLLMConfig(sync="merged"), policy=_policy(), lora_rank=12, scratch_dir=tmp_path,
                        api=fake_api(events, reload=True))
    engine.generate([SampleRequest((1,), (3,))], SETTINGS)
    assert ("reload", True) in events and "model.layers.0.self_attn.q_proj.weight" in engine.llm.loaded[-1]


def test_on_cpu_a_call_is_cut_into_waves_the_scheduler_prefills_whole(tmp_path):
    events = []
    engine = VLLMEngine("/m", options=VLLMConfig(sleep_level=0), api=fake_api(events, platform="cpu"), say=print)
    engine.llm.llm_engine = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(
        max_num_batched_tokens=10, max_num_seqs=3)))
    # prompts of 4, 4, 1, 1, 1, 1 tokens: 4+1 + 4+1 = 10 fits, then at most three requests a call
    out = engine.generate([SampleRequest((1, 1, 1, 1), (1, 2)), SampleRequest((5,), (3, 4, 5, 6))], SETTINGS)
    calls = [[p["prompt_token_ids"] for p in e[1]] for e in events if e[0] == "generate"]
    assert calls == [[[1, 1, 1, 1], [1, 1, 1, 1]], [[5], [5], [5]], [[5]]]
    assert [[s.token_ids[0] for s in r] for r in out] == [[1, 2], [3, 4, 5, 6]]  # the samples keep their order


def test_a_tied_output_head_is_tied_again_to_the_reloaded_embeddings():
    from meds_cli.engine.rollout.vllm_engine import retie_output_head

    calls = []
    embed = SimpleNamespace(weight="new embedding")

    def make(tied):
        head = SimpleNamespace(weight="old embedding")
        head.tie_weights = lambda e: (calls.append("tie"), setattr(head, "weight", e.weight))
        head.quant_method = SimpleNamespace(process_weights_after_loading=lambda layer: calls.append("prepare"))
        return SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=tied), lm_head=head,
                               model=SimpleNamespace(embed_tokens=embed))

    untied = make(False)
    retie_output_head(untied)
    assert calls == [] and untied.lm_head.weight == "old embedding"  # its own head was loaded by name
    tied = make(True)
    retie_output_head(tied)
    assert calls == ["tie", "prepare"] and tied.lm_head.weight == "new embedding"


def test_sampler_precision_line_and_auto_dtype_follow_the_trainer():
    import torch

    from meds_cli.engine.rollout.vllm_engine import engine_dtype, sampler_precision_line, trainer_compute_dtype

    # bf16 autocast computes in bfloat16 whatever the weights; without autocast, in the weights' dtype
    assert trainer_compute_dtype("bf16", torch.float32) == "bfloat16"
    assert trainer_compute_dtype("no", torch.float32) == "float32"
    assert trainer_compute_dtype(None, torch.float16) == "float16"
    assert engine_dtype("auto", "bfloat16") == "bfloat16" and engine_dtype("float32", "bfloat16") == "float32"
    assert sampler_precision_line("vllm", "float32", "float32") is None
    line = sampler_precision_line("vllm", "float32", "bfloat16")
    assert "\n" not in line and "computes in float32, the trainer in bfloat16" in line
