"""The `hf` rollout engine: token choice by hand, the decode loop against HF generate, the
merged adapter restored exactly, seeds that belong to samples."""

import math

import pytest
import torch

from meds_cli.engine.rollout.hf_sampler import HFEngine, _nucleus, batches_of, choose_tokens, merged_lora, row_uniforms
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings, stop_token_ids
from tests.float64 import float64_norms
from tests.tiny_policy import lora_policy

PROBS = [0.1, 0.2, 0.3, 0.4]


def _logits(rows: int) -> torch.Tensor:
    return torch.tensor(PROBS).log().repeat(rows, 1)


def test_inverse_cdf_picks_the_interval_the_uniform_falls_in():
    # cdf [0.1, 0.3, 0.6, 1.0]: u in [0, 0.1) -> 0, [0.1, 0.3) -> 1, [0.3, 0.6) -> 2, [0.6, 1) -> 3
    u = torch.tensor([0.0, 0.05, 0.1, 0.29, 0.31, 0.59, 0.61, 0.999])
    tokens, logp = choose_tokens(_logits(8), u, temperature=1.0, top_p=1.0)
    assert tokens.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert logp.tolist() == pytest.approx([math.log(PROBS[t]) for t in tokens.tolist()], abs=1e-6)


def test_top_p_keeps_the_nucleus_and_renormalises():
    # sorted [0.4, 0.3, 0.2, 0.1]; mass before each [0, 0.4, 0.7, 0.9]; top_p 0.5 keeps 0.4 and 0.3,
    # renormalised to 4/7 and 3/7: u < 4/7 -> token 3, else token 2
    u = torch.tensor([0.0, 0.55, 0.58, 0.99])
    tokens, logp = choose_tokens(_logits(4), u, temperature=1.0, top_p=0.5)
    assert tokens.tolist() == [3, 3, 2, 2]
    assert logp.tolist() == pytest.approx([math.log(4 / 7)] * 2 + [math.log(3 / 7)] * 2, abs=1e-6)


def test_temperature_flattens_and_greedy_takes_the_argmax():
    # T = 2: p_i proportional to sqrt(p_i)
    roots = [math.sqrt(p) for p in PROBS]
    z = sum(roots)
    u = torch.tensor([roots[0] / z - 1e-4, roots[0] / z + 1e-4])
    tokens, logp = choose_tokens(_logits(2), u, temperature=2.0, top_p=1.0)
    assert tokens.tolist() == [0, 1]
    assert logp.tolist() == pytest.approx([math.log(roots[0] / z), math.log(roots[1] / z)], abs=1e-6)
    tokens, logp = choose_tokens(_logits(1), torch.tensor([0.0]), temperature=0.0, top_p=1.0)
    assert tokens.tolist() == [3] and logp.item() == pytest.approx(math.log(0.4), abs=1e-6)


def test_nucleus_sorts_in_full_only_the_rows_whose_nucleus_passes_the_first_look():
    weights = torch.tensor([[1.0, 2.0, 3.0, 4.0, 0.5],   # total 10.5; top_p 0.8 needs 4, 3, 2 (9 >= 8.4): 3 > 2
                            [0.1, 9.0, 0.2, 0.3, 0.4]])  # total 10.0; 9 >= 8: within a first look of 2
    kept, order = _nucleus(weights, 0.8, first_look=2)
    # cut to the longest nucleus (3 tokens); the narrow row padded with zero weights
    assert kept.tolist() == [[4.0, 3.0, 2.0], [9.0, 0.0, 0.0]]
    assert order[0].tolist() == [3, 2, 1] and order[1, 0].item() == 1

    def dense(kept, order):  # the nucleus as weights per token id
        return torch.zeros_like(weights).scatter_add_(-1, order, kept)

    # the same distributions as sorting every row in full
    assert torch.equal(dense(kept, order), dense(*_nucleus(weights, 0.8, first_look=5)))
    assert dense(kept, order).tolist() == [[0.0, 2.0, 3.0, 4.0, 0.0], [0.0, 9.0, 0.0, 0.0, 0.0]]


def test_row_uniforms_depend_on_the_seed_only():
    a = row_uniforms([7, 8, 9], 5)
    b = row_uniforms([9, 7], 5)
    assert torch.equal(a[2], b[0]) and torch.equal(a[0], b[1]) and not torch.equal(a[0], a[1])


def test_batches_split_requests_by_rows_and_keep_seed_order():
    requests = [SampleRequest((1,), (10, 11, 12)), SampleRequest((2,), (20,)), SampleRequest((3,), (30, 31))]
    batches = batches_of(requests, rows=2)
    assert [[(r.prompt_ids, r.seeds) for r in b] for b in batches] == [
        [((1,), (10, 11))], [((1,), (12,)), ((2,), (20,))], [((3,), (30, 31))]]


def _policy():
    return lora_policy(seed=3)


PROMPTS = ["12+3=", "7*8=(", "hello", "9"]


def _ids(tokenizer, text):
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_greedy_decode_equals_hf_generate_including_early_stops():
    model, tokenizer = _policy()
    stops = stop_token_ids(tokenizer)
    # A stop set with a token the model emits early on some prompts, so rows leave the batch.
    probe = HFEngine(model, tokenizer.pad_token_id, 8).generate(
        [SampleRequest(_ids(tokenizer, p), (0,)) for p in PROMPTS], SamplingSettings(0.0, 1.0, 10, ()))
    greedy = [group[0].token_ids for group in probe]
    runs_to_limit = lambda token: [g for g in greedy if token not in g and not set(g) & set(stops)]  # noqa: E731
    early = next(t for t in greedy[0][:4] if runs_to_limit(t))  # ends prompt 0 early, some other prompt not
    stops = tuple(sorted({*stops, early}))
    out = HFEngine(model, tokenizer.pad_token_id, 8).generate(
        [SampleRequest(_ids(tokenizer, p), (0, 1)) for p in PROMPTS], SamplingSettings(0.0, 1.0, 10, stops))
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        reference = model.generate(**enc, do_sample=False, max_new_tokens=10, eos_token_id=list(stops),
                                   pad_token_id=tokenizer.pad_token_id)[:, enc["input_ids"].shape[1]:]
    lengths = set()
    for i, samples in enumerate(out):
        expected = reference[i].tolist()
        for sample in samples:
            n = len(sample.token_ids)
            lengths.add(n)
            assert sample.token_ids == expected[:n]
            assert sample.stopped == (sample.token_ids[-1] in stops)
            assert n == 10 or sample.stopped
            assert len(sample.logprobs) == n
    assert min(lengths) <= 3 and max(lengths) == 10  # some rows ended early, others ran to the limit


def test_merged_sampling_restores_the_weights_exactly_and_matches_the_adapter():
    model, tokenizer = _policy()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    storage = {n: p.data_ptr() for n, p in model.named_parameters()}
    requests = [SampleRequest(_ids(tokenizer, p), (4, 5)) for p in PROMPTS]
    settings = SamplingSettings(1.0, 1.0, 8, stop_token_ids(tokenizer))
    merged = HFEngine(model, tokenizer.pad_token_id, 8).generate(requests, settings)
    unmerged = HFEngine(model, tokenizer.pad_token_id, 8, merge_lora=False).generate(requests, settings)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) and p.data_ptr() == storage[name]  # the same memory, unchanged
    for a, b in zip(merged, unmerged):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    with merged_lora(model):
        changed = [n for n, p in model.named_parameters() if "base_layer" in n and not torch.equal(p, before[n])]
    assert changed  # while merged, the base weights did carry the adapter


def test_a_sample_depends_on_its_seed_not_on_its_batch():
    model, tokenizer = _policy()
    settings = SamplingSettings(1.0, 0.9, 8, stop_token_ids(tokenizer))
    together = HFEngine(model, tokenizer.pad_token_id, 16).generate(
        [SampleRequest(_ids(tokenizer, p), (10 * i, 10 * i + 1, 10 * i + 2)) for i, p in enumerate(PROMPTS)], settings)
    alone = HFEngine(model, tokenizer.pad_token_id, 1).generate([SampleRequest(_ids(tokenizer, PROMPTS[2]), (21,))],
                                                                settings)
    assert together[2][1].token_ids == alone[0][0].token_ids
    assert together[2][1].logprobs == pytest.approx(alone[0][0].logprobs, abs=1e-5)
    assert together[2][0].token_ids != together[2][1].token_ids or together[2][0].logprobs != together[2][1].logprobs


def test_sampler_logprobs_are_the_models_own():
    model, tokenizer = _policy()
    prompt = _ids(tokenizer, PROMPTS[0])
    sample = HFEngine(model, tokenizer.pad_token_id, 4).generate(
        [SampleRequest(prompt, (3,))], SamplingSettings(1.0, 1.0, 6, ()))[0][0]
    ids = torch.tensor([list(prompt) + sample.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)
    assert sample.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_min_new_tokens_holds_back_the_stop_ids():
    model, tokenizer = _policy()
    prompt = _ids(tokenizer, PROMPTS[1])
    first = HFEngine(model, tokenizer.pad_token_id, 1).generate(
        [SampleRequest(prompt, (0,))], SamplingSettings(0.0, 1.0, 6, ()))[0][0].token_ids[0]
    stops = (first,)  # greedy would stop at once
    assert HFEngine(model, tokenizer.pad_token_id, 1).generate(
        [SampleRequest(prompt, (0,))], SamplingSettings(0.0, 1.0, 6, stops))[0][0].token_ids == [first]
    held = HFEngine(model, tokenizer.pad_token_id, 1).generate(
        [SampleRequest(prompt, (0,))], SamplingSettings(0.0, 1.0, 6, stops, min_new_tokens=4))[0][0]
    assert len(held.token_ids) >= 4 and first not in held.token_ids[:4]


def test_rows_that_ended_early_change_nothing_for_the_others():
    """Ended rows stay in the batch until they are a quarter of it: every sample equals the one
    drawn alone, whatever ended beside it and whenever the batch was compacted. In float64
    (tests/float64.py): in float32 a batch of 64 rows and a batch of one round differently on
    some CPU kernel sets (1.1e-5 apart under ATEN_CPU_CAPABILITY=default)."""
    model, tokenizer = _policy()
    model = model.double()
    settings = SamplingSettings(1.0, 1.0, 10, stop_token_ids(tokenizer))
    requests = [SampleRequest(_ids(tokenizer, p), tuple(range(10 * i, 10 * i + 4))) for i, p in enumerate(PROMPTS)]
    with float64_norms():
        together = HFEngine(model, tokenizer.pad_token_id, 64).generate(requests, settings)
        alone = [[HFEngine(model, tokenizer.pad_token_id, 1).generate([SampleRequest(r.prompt_ids, (seed,))],
                                                                       settings)[0][0] for seed in r.seeds]
                 for r in requests]
    lengths = [len(s.token_ids) for group in together for s in group]
    assert min(lengths) < 10 and max(lengths) == 10  # some ended early, others ran to the limit
    for group, alone_group in zip(together, alone):
        for sample, single in zip(group, alone_group):
            assert sample.token_ids == single.token_ids and sample.stopped == single.stopped
            # the float32 log-probs of float64 logits: equal up to the last bit of the cast
            assert sample.logprobs == pytest.approx(single.logprobs, abs=1e-6)


# ---------------------------------------------------------------- tool turns: stop strings, budgets per request


def _first_completion(tokenizer, tokens, string):
    """The index of the token whose text first completes `string` in the decoded tokens."""
    return next(k for k in range(len(tokens)) if string in tokenizer.decode(tokens[:k + 1]))


def test_a_row_pauses_after_a_stop_string_and_keeps_it_in_its_tokens():
    model, tokenizer = _policy()
    request = SampleRequest(_ids(tokenizer, PROMPTS[0]), (5, 6))
    free = HFEngine(model, tokenizer.pad_token_id, 8).generate([request], SamplingSettings(1.0, 1.0, 16, ()))[0]
    text = tokenizer.decode(free[0].token_ids)
    string = text[len(text) // 2: len(text) // 2 + 2]  # two characters from the middle of sample 0
    engine = HFEngine(model, tokenizer.pad_token_id, 8, tokenizer=tokenizer)
    paused = engine.generate([request], SamplingSettings(1.0, 1.0, 16, (), stop_strings=(string,)))[0]
    end = _first_completion(tokenizer, free[0].token_ids, string)
    assert paused[0].token_ids == free[0].token_ids[:end + 1]  # the same draws up to the pause, the string kept
    assert string in tokenizer.decode(paused[0].token_ids) and paused[0].paused and not paused[0].stopped
    assert paused[0].logprobs == pytest.approx(free[0].logprobs[:end + 1], abs=1e-6)
    if string not in tokenizer.decode(free[1].token_ids):  # sample 1 never writes it: sampled as before
        assert paused[1].token_ids == free[1].token_ids and not paused[1].paused


def test_stop_strings_without_a_tokenizer_are_refused():
    model, tokenizer = _policy()
    with pytest.raises(ValueError, match="stop strings need the tokenizer"):
        HFEngine(model, tokenizer.pad_token_id, 8).generate(
            [SampleRequest(_ids(tokenizer, "9"), (1,))], SamplingSettings(1.0, 1.0, 4, (), stop_strings=("x",)))


def test_each_request_keeps_its_own_budget_and_its_samples_do_not_depend_on_the_batch():
    model, tokenizer = _policy()
    settings = SamplingSettings(1.0, 1.0, 12, stop_token_ids(tokenizer))
    requests = [SampleRequest(_ids(tokenizer, p), (3 + i, 40 + i), max_new_tokens=budget)
                for i, (p, budget) in enumerate(zip(PROMPTS, [3, 12, 7, 30]))]
    together = HFEngine(model, tokenizer.pad_token_id, 16).generate(requests, settings)
    for request, group in zip(requests, together):
        alone = HFEngine(model, tokenizer.pad_token_id, 1).generate([request], settings)[0]
        full = HFEngine(model, tokenizer.pad_token_id, 1).generate(
            [SampleRequest(request.prompt_ids, request.seeds)], settings)[0]
        for sample, single, whole in zip(group, alone, full):
            assert len(sample.token_ids) <= request.budget(settings)
            assert sample.token_ids == single.token_ids == whole.token_ids[:request.budget(settings)]
            assert not sample.paused
