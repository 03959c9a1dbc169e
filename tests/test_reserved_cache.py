"""The decode loop's KV cache written in place: the same keys and values as transformers'
concatenating cache at every step, and the same samples from the decode loop."""

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from meds_cli.engine.rollout import hf_sampler
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.reserved_cache import ReservedLayer, reserve_cache
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings, stop_token_ids
from tests.tiny_policy import lora_policy


def _states(rows: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, length, 4, generator=g), torch.randn(rows, 2, length, 4, generator=g)


def test_layer_matches_concatenation_through_selection_and_past_its_capacity():
    plain = DynamicLayer()
    plain.update(*_states(2, 5, 0))
    rows = torch.tensor([0, 0, 1])
    reserved = ReservedLayer(plain, rows, capacity=8)
    plain.batch_select_indices(rows)
    for step in range(6):  # 5 + 3 positions fill the capacity; the last 3 steps grow past it
        if step == 2:  # a row ends: both keep the others
            keep = torch.tensor([0, 2])
            plain.batch_select_indices(keep)
            reserved.batch_select_indices(keep)
        new = _states(plain.keys.shape[0], 1, step + 1)
        expected, got = plain.update(*new), reserved.update(*new)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        assert reserved.get_seq_length() == plain.get_seq_length() == 6 + step
    reserved.crop(-2)
    plain.crop(-2)
    assert torch.equal(reserved.keys, plain.keys) and reserved.get_seq_length() == 9


def test_writes_go_to_the_buffer_without_copying_it():
    plain = DynamicLayer()
    plain.update(*_states(1, 3, 0))
    reserved = ReservedLayer(plain, torch.tensor([0]), capacity=6)
    storage = reserved.keys.data_ptr()
    reserved.update(*_states(1, 1, 1))
    assert reserved.keys.data_ptr() == storage and reserved.keys.shape[-2] == 4


def test_dropping_rows_moves_them_within_the_buffer_and_more_rows_get_a_new_one():
    plain = DynamicLayer()
    plain.update(*_states(4, 3, 0))
    reserved = ReservedLayer(plain, torch.arange(4), capacity=6)
    storage = reserved._key_buffer.data_ptr()
    keep = torch.tensor([1, 3])
    plain.batch_select_indices(keep)
    reserved.batch_select_indices(keep)
    assert reserved._key_buffer.data_ptr() == storage and torch.equal(reserved.keys, plain.keys)
    plain.batch_repeat_interleave(2)
    reserved.batch_repeat_interleave(2)
    assert reserved.keys.shape[0] == 4 and torch.equal(reserved.keys, plain.keys)
    new = _states(4, 1, 9)
    assert torch.equal(reserved.update(*new)[1], plain.update(*new)[1])


def test_reserve_cache_replaces_every_full_attention_layer_of_a_prefill():
    model, tokenizer = lora_policy(seed=3)
    ids = torch.tensor([tokenizer("12+3=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    assert isinstance(cache, DynamicCache)
    before = [layer.keys.clone() for layer in cache.layers]
    assert reserve_cache(cache, torch.tensor([0, 0, 0]), ids.shape[1] + 4)
    for layer, keys in zip(cache.layers, before):
        assert isinstance(layer, ReservedLayer) and torch.equal(layer.keys, keys.expand(3, -1, -1, -1))


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_decode_samples_what_the_concatenating_cache_samples(monkeypatch, top_p):
    model, tokenizer = lora_policy(seed=3)
    prompts = ["12+3=", "7*8=(", "hello"]
    requests = [SampleRequest(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]), (3 * i, 3 * i + 1, 3 * i + 2))
                for i, p in enumerate(prompts)]
    settings = SamplingSettings(1.0, top_p, 12, stop_token_ids(tokenizer))
    reserved = HFEngine(model, tokenizer.pad_token_id, 9).generate(requests, settings)
    used = []
    monkeypatch.setattr(hf_sampler, "reserve_cache",
                        lambda cache, rows, capacity: used.append(rows) or cache.batch_select_indices(rows))
    concatenated = HFEngine(model, tokenizer.pad_token_id, 9).generate(requests, settings)
    assert used  # the second run did take the concatenating path
    for a, b in zip(reserved, concatenated):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.stopped == y.stopped
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-6)


def test_repeating_rows_matches_concatenation():
    plain = DynamicLayer()
    plain.update(*_states(2, 3, 0))
    reserved = ReservedLayer(plain, torch.tensor([0, 1]), capacity=5)
    plain.batch_repeat_interleave(2)
    reserved.batch_repeat_interleave(2)
    new = _states(4, 1, 1)
    expected, got = plain.update(*new), reserved.update(*new)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
