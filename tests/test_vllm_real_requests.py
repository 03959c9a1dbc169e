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
