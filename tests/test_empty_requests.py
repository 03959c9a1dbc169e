"""A process with nothing to ask still enters the rollout engine's call (issue 37: vLLM's
tensor-parallel pooling is collective): every engine takes an empty request list, and
sample_rollouts turns it into an empty batch."""

from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout.batch import sample_rollouts
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.sampling_engine import SamplingSettings, stop_token_ids
from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine
from tests.test_vllm_engine import fake_api


def assert_empty(batch, group_size):
    assert batch.size == 0 and batch.num_groups == 0 and batch.group_size == group_size
    assert batch.response_texts == [] and batch.response_mask.shape[0] == 0 and batch.input_ids.shape[0] == 0


def test_hf_engine_and_sample_rollouts_take_no_prompts():
    model, tokenizer = tiny_model_and_tokenizer()
    settings = SamplingSettings(1.0, 1.0, 3, stop_token_ids(tokenizer))
    engine = HFEngine(model, tokenizer.pad_token_id, 8)
    assert engine.generate([], settings) == []
    assert_empty(sample_rollouts(engine, tokenizer, [], [], 4, settings), 4)


def test_vllm_engine_takes_no_prompts_and_asks_vllm_for_nothing(tmp_path):
    events = []
    model, tokenizer = tiny_model_and_tokenizer()
    engine = VLLMEngine("/models/tiny", options=VLLMConfig(), api=fake_api(events))
    settings = SamplingSettings(1.0, 1.0, 3, stop_token_ids(tokenizer))
    assert engine.generate([], settings) == []
    assert_empty(sample_rollouts(engine, tokenizer, [], [], 2, settings), 2)
    assert [e[0] for e in events] == ["init"]  # nothing generated
