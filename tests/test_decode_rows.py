"""Rows per decode batch from memory (engine/rollout/decode_rows.py), and how the hf eval backend
groups problems into calls of that many samples."""

import pytest
from transformers import LlamaConfig

from benchmarks.generation import GenerationSettings, Request
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
from meds_cli.engine.rollout import decode_rows as rows_module
from meds_cli.engine.rollout.decode_rows import (
    bytes_per_row,
    decode_rows,
    free_memory,
    kv_cache_bytes_per_token,
    rows_that_fit,
)
from meds_cli.engine.rollout.eval_backends import HFBackend


def test_bytes_per_row_by_hand():
    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                         vocab_size=100)
    # keys and values: 2 layers x 2 (k, v) x 2 kv heads x head_dim 8 x 10 tokens x 4 bytes = 2,560;
    # the sampler's rows: 4 float32 copies of 100 logits = 1,600
    assert bytes_per_row(config, tokens=10, cache_bytes_per_value=4) == 2560 + 1600
    # bf16 halves the cache, not the sampler's float32 rows
    assert bytes_per_row(config, tokens=10, cache_bytes_per_value=2) == 1280 + 1600


def test_bytes_per_row_reads_an_explicit_head_dim_and_defaults_kv_heads_to_heads():
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=32, head_dim=4, vocab_size=10)
    config.num_key_value_heads = None
    assert bytes_per_row(config, tokens=3, cache_bytes_per_value=4) == 1 * 2 * 2 * 4 * 3 * 4 + 4 * 4 * 10


def test_rows_that_fit_takes_a_share_of_the_free_memory_within_bounds():
    assert rows_that_fit(4160, 1_000_000) == 500_000 // 4160  # half of the free memory: 120 rows
    assert rows_that_fit(4160, 1_000_000, share=0.25) == 250_000 // 4160
    assert rows_that_fit(10, 10**12) == 1024  # capped
    assert rows_that_fit(10, 10**12, most=64) == 64
    assert rows_that_fit(10**9, 10**6) == 1  # never zero: one row always runs


def test_free_memory_of_this_host_is_positive():
    import torch

    assert free_memory(torch.device("cpu")) > 0


def test_decode_rows_of_a_model_follow_its_config_and_the_free_memory(monkeypatch):
    model, _ = tiny_model_and_tokenizer()
    per_row = bytes_per_row(model.config, 100, 4)
    monkeypatch.setattr(rows_module, "free_memory", lambda device: 20 * per_row)
    assert decode_rows(model, 100) == 10
    monkeypatch.setattr(rows_module, "free_memory", lambda device: 10**15)
    assert decode_rows(model, 100) == 1024


def requests(*ns):
    return [Request(f"q{i}", n, i) for i, n in enumerate(ns)]


@pytest.fixture
def tiny():
    return tiny_model_and_tokenizer()


def settings(batch_size):
    return GenerationSettings(temperature=1.0, top_p=1.0, max_new_tokens=8, batch_size=batch_size)


def test_hf_backend_fills_each_call_up_to_the_batch_size(tiny):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, settings(7))
    assert backend.call_sizes(requests(3, 3, 3, 3, 3)) == [2, 2, 1]  # 6 samples a call; a third would make 9
    assert backend.call_sizes(requests(10, 2, 2)) == [1, 2]  # a problem wider than a batch goes alone
    assert backend.call_sizes([]) == []
    assert backend.engine.batch_size == 7


def test_hf_backend_sizes_its_batch_from_memory_when_none_is_given(tiny, monkeypatch):
    model, tokenizer = tiny
    backend = HFBackend(model, tokenizer, settings(None))
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in ("q0", "q1 is longer"))
    per_row = bytes_per_row(model.config, longest + 8, 4)
    monkeypatch.setattr(rows_module, "free_memory", lambda device: 2 * 5 * per_row)  # half of it: 5 rows
    reqs = [Request("q0", 2, 0), Request("q1 is longer", 2, 1), Request("q0", 2, 2)]
    assert backend.call_sizes(reqs) == [2, 1]
    assert backend.engine.batch_size == 5


def test_kv_cache_bytes_per_token_by_hand():
    config = LlamaConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, hidden_size=32,
                         vocab_size=10)
    assert kv_cache_bytes_per_token(config, 2) == 3 * 2 * 1 * 8 * 2  # layers x (k, v) x kv heads x head_dim x bytes
