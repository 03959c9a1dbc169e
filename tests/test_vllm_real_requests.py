"""The request and memory settings of the `vllm` engine against the real vLLM (its CPU build in
.venv-vllm, `make test-vllm`): groups asked as one request with n samples come back whole and in
place, and the computed max_model_len and max_num_batched_tokens are the engine's. The request
building itself is tested against a recording fake in tests/test_vllm_requests.py."""

from __future__ import annotations

import gc
import os

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine

from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer  # noqa: E402
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings  # noqa: E402
from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine  # noqa: E402

SETTINGS = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=6, stop_ids=(1,))


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("random-llama")
    model, tokenizer = tiny_model_and_tokenizer(layers=2, hidden=256, seed=3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _engine(folder, **options):
    return VLLMEngine(str(folder), options=VLLMConfig(dtype="float32", enforce_eager=True, sleep_level=0, **options),
                      seed=7, model_len=64)


def test_a_group_asked_as_one_request_comes_back_whole(random_model):
    engine = _engine(random_model, seed_per_request=False, max_num_batched_tokens=256)
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.max_model_len == 64 and config.scheduler_config.max_num_batched_tokens == 256
    requests = [SampleRequest((5, 6, 7), (1, 2, 3)), SampleRequest((8,), (4, 5, 6))]
    out = engine.generate(requests, SETTINGS)
    assert [len(group) for group in out] == [3, 3]
    for group in out:
        for sample in group:
            assert 1 <= len(sample.token_ids) <= 6 and len(sample.logprobs) == len(sample.token_ids)
    assert len({tuple(s.token_ids) for group in out for s in group}) > 1  # not one sample copied
    del engine
    gc.collect()


def test_seeded_requests_repeat_whatever_they_are_batched_with(random_model):
    engine = _engine(random_model, seed_per_request=True)
    alone = engine.generate([SampleRequest((8,), (5,))], SETTINGS)[0][0]
    together = engine.generate([SampleRequest((5, 6, 7), (1, 2)), SampleRequest((8,), (4, 5))], SETTINGS)[1][1]
    assert together.token_ids == alone.token_ids
    del engine
    gc.collect()


def test_a_tool_turn_pauses_after_a_stop_string_and_keeps_it(random_model):
    """Tool-integrated reasoning's turns (issue 56): vLLM stops after the first stop string, keeps it in
    the returned tokens (include_stop_str_in_output), and the engine reads that as a pause, not an end."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_model)
    engine = _engine(random_model, seed_per_request=True)
    greedy = SamplingSettings(temperature=0.0, top_p=1.0, max_new_tokens=16, stop_ids=())
    request = [SampleRequest((5, 6, 7), (1,))]
    free = engine.generate(request, greedy)[0][0]
    text = tokenizer.decode(free.token_ids)
    stop = tokenizer.decode(free.token_ids[3:5])  # a string the greedy response writes after its third token
    assert stop.strip(), f"the tiny model's greedy text {text!r} has no usable stop string"
    paused = engine.generate(request, SamplingSettings(temperature=0.0, top_p=1.0, max_new_tokens=16, stop_ids=(),
                                                       stop_strings=(stop,)))[0][0]
    assert paused.paused and not paused.stopped
    assert paused.token_ids == free.token_ids[:len(paused.token_ids)]  # the same greedy tokens, cut
    assert stop in tokenizer.decode(paused.token_ids) and len(paused.token_ids) <= 5
    assert len(paused.logprobs) == len(paused.token_ids)
    del engine
    gc.collect()
