"""The `hf` decode loop reads from the device at most once per generated token: on a GPU every
read (`.item()`, `.tolist()`, an `if` on a tensor, a boolean mask, `nonzero`) makes the host wait
for the queued kernels, and the next step's kernels cannot be queued behind them. Counted on CPU
with tests/host_syncs.py, which sees the same calls the GPU would wait on; and the tokens are the
ones sampled before the loop was changed to read less (tests/test_hf_sampler.py compares them
with HF generate and with samples drawn alone)."""

import pytest
import torch

from meds_cli.engine.rollout import hf_sampler
from meds_cli.engine.rollout.hf_sampler import HFEngine, choose_tokens
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings, stop_token_ids
from tests.host_syncs import HostSyncs
from tests.tiny_policy import lora_policy

PROMPTS = ["12+3=", "7*8=(", "hello", "9"]


def _requests(tokenizer, samples=4):
    return [SampleRequest(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]),
                          tuple(range(10 * i, 10 * i + samples))) for i, p in enumerate(PROMPTS)]


def _syncs(engine, requests, settings) -> tuple[int, list]:
    with HostSyncs() as syncs:
        out = engine.generate(requests, settings)
    return syncs.count, out


@pytest.mark.parametrize("packed", [False, True], ids=["model-forward (the GPU path)", "packed direct steps (CPU)"])
def test_decode_reads_the_device_at_most_once_per_token(packed):
    model, tokenizer = lora_policy(seed=3)
    engine = HFEngine(model, tokenizer.pad_token_id, 16, packing="mkl" if packed else "none")
    requests = _requests(tokenizer)
    # no stop ids: every row runs to the limit, so the two runs differ by their steps only
    short, _ = _syncs(engine, requests, SamplingSettings(1.0, 1.0, 16, ()))
    long, _ = _syncs(engine, requests, SamplingSettings(1.0, 1.0, 48, ()))
    assert (long - short) / 32 <= 1


def test_rows_that_end_cost_no_extra_reads():
    """Stops end rows at different steps and the batch drops them: still one read a step, plus
    the ones outside the loop (prompt batching, the results' copy to the host)."""
    model, tokenizer = lora_policy(seed=3)
    engine = HFEngine(model, tokenizer.pad_token_id, 16, packing="none")
    requests = _requests(tokenizer)
    _, free = _syncs(engine, requests, SamplingSettings(1.0, 1.0, 24, ()))
    base, _ = _syncs(engine, requests, SamplingSettings(1.0, 1.0, 24, ()))
    counted, out = _syncs(engine, requests, SamplingSettings(1.0, 1.0, 24, stop_token_ids(tokenizer) + (5, 7)))
    lengths = [len(s.token_ids) for group in out for s in group]
    assert min(lengths) < 24 // 2  # rows ended early and the batch was compacted
    assert counted <= base


def test_choosing_a_token_reads_nothing_back():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(0))
    uniforms = torch.rand(8, generator=torch.Generator().manual_seed(1))
    uniforms[0] = 1 - 2 ** -24  # u * mass rounds to the whole mass: the draw held below it
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (0.0, 1.0)):
        with HostSyncs() as syncs:
            choose_tokens(logits, uniforms, temperature, top_p)
        assert syncs.count == 0, (temperature, top_p, syncs.kinds)


def test_host_reads_of_the_loop_go_through_one_function(monkeypatch):
    """Every read the loop makes is a call of hf_sampler.host_read (so a profile or a test can
    count them); the reads outside the loop (prompt batching, results) are a few per batch."""
    model, tokenizer = lora_policy(seed=3)
    engine = HFEngine(model, tokenizer.pad_token_id, 16, packing="none")
    calls = []
    real = hf_sampler.host_read
    monkeypatch.setattr(hf_sampler, "host_read", lambda tensor: calls.append(tensor.shape) or real(tensor))
    engine.generate(_requests(tokenizer), SamplingSettings(1.0, 1.0, 12, ()))
    assert len(calls) == 12 - 1  # one a step but the last (the loop ends there whatever it reads)


def test_a_nucleus_reads_once_and_twice_where_it_sorts_in_full():
    """A nucleus's sort has a shape only the values tell: one read for whether any row's nucleus
    passes the first look (256 tokens), one more for the widest nucleus where one does."""
    generator = torch.Generator().manual_seed(2)
    peaked = torch.randn(4, 1000, generator=generator)
    peaked[:, 7] = 30.0  # every nucleus is token 7 alone
    flat = torch.zeros(4, 1000)  # top_p 0.9 of a uniform distribution: 900 tokens
    uniforms = torch.rand(4, generator=generator)
    for logits, reads in ((peaked, 1), (flat, 2)):
        with HostSyncs() as syncs:
            tokens, _ = choose_tokens(logits, uniforms, 1.0, 0.9)
        assert syncs.count == reads, syncs.kinds
    assert tokens.max() < 1000


def test_a_uniform_at_the_top_draws_the_last_token_with_weight():
    # probabilities [0.1, 0.2, 0.3, 0.4]; top_p 0.5 keeps 0.4 and 0.3 (tokens 3, 2): u -> 1 is the
    # top of the nucleus's CDF, token 2 (3/7), not a token past the nucleus; without top_p, token 3
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()[None]
    tokens, logp = choose_tokens(logits, torch.tensor([1.0]), 1.0, 0.5)
    assert tokens.tolist() == [2] and logp.item() == pytest.approx(torch.tensor(3 / 7).log().item(), abs=1e-6)
    tokens, _ = choose_tokens(logits, torch.tensor([1.0]), 1.0, 1.0)
    assert tokens.tolist() == [3]
