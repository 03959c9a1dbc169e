"""MKL's packed matmul for the decode loop's linear layers: the same products as the layer's own
(to float32 rounding), layers restored on exit, and left alone where it does not apply."""

import dataclasses

import pytest
import torch

from meds_cli.core.packed_matmul import packings_available
from meds_cli.engine.rollout import packed_linear
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.packed_linear import PACKED_MIN_NEW_TOKENS, can_pack, packed_linears
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings, stop_token_ids
from tests.tiny_policy import lora_policy

pytestmark = pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="torch has no MKL packed matmul here")


def _layer(in_features: int = 96, out_features: int = 160, bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(in_features, out_features, bias=bias)


@pytest.mark.parametrize("packing", packings_available())
@pytest.mark.parametrize("shape", [(1, 96), (8, 96), (3, 1, 96), (256, 96)])
def test_packed_layer_computes_the_layers_product(shape, packing):
    layer = _layer()
    x = torch.randn(shape)
    with torch.no_grad():
        expected = x.double() @ layer.weight.double().T + layer.bias.double()
        with packed_linears(layer, packing=packing) as patched:
            assert patched == 1
            first, got = layer(x), layer(x.clone())  # the second input with this row count runs packed
            packed = layer.forward.group.packed
            assert packed.packing == packing and packed.rows == x.numel() // 96
    assert torch.equal(first, torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert got.shape == (*shape[:-1], 160) and got.dtype == torch.float32
    # float32 products of 96 terms: a few ulps of the largest value
    assert (got.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_layers_get_their_own_forward_back():
    layer, wrapped = _layer(bias=False), _layer()
    calls = []

    def hook_wrapper(x):  # how accelerate's hooks sit on a module: an instance attribute
        calls.append(1)
        return torch.nn.Linear.forward(wrapped, x)

    wrapped.forward = hook_wrapper
    x = torch.randn(4, 96)
    with torch.no_grad():
        before = layer(x)
        with packed_linears(torch.nn.Sequential(layer, wrapped)) as patched:
            assert patched == 2 and "forward" in layer.__dict__ and wrapped.forward is not hook_wrapper
            wrapped(x)
        assert "forward" not in layer.__dict__ and wrapped.forward is hook_wrapper
        assert torch.equal(layer(x), before)
    assert calls == [1]  # the packed layer called through the wrapper it replaced


def test_where_packing_does_not_apply_the_layer_runs_as_before():
    double = _layer().double()
    with packed_linears(double) as patched:
        assert patched == 0
    layer = _layer()
    x = torch.randn(4, 96, requires_grad=True)
    with packed_linears(layer):
        layer(x).sum().backward()  # gradients flow: the layer's own forward ran
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.bfloat16
    assert x.grad is not None and layer.weight.grad is not None


def _count_packs(monkeypatch) -> list[int]:
    """The row counts weights get packed for from now on, in order."""
    packs, pack = [], packed_linear._PackedGroup._pack

    def counted(group, rows):
        packs.append(rows)
        return pack(group, rows)

    monkeypatch.setattr(packed_linear._PackedGroup, "_pack", counted)
    return packs


def _three_prompts(tokenizer) -> list[SampleRequest]:
    prompts = ["12+7=", "a long prompt: 3*4+5=", "x"]
    return [SampleRequest(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]), (7 * i, 7 * i + 1, 7 * i + 2))
            for i, p in enumerate(prompts)]


@pytest.mark.parametrize("packing", packings_available())
def test_sampling_with_packed_weights_draws_the_same_samples(monkeypatch, packing):
    model, tokenizer = lora_policy(3)
    requests = _three_prompts(tokenizer)
    settings = SamplingSettings(1.0, 0.95, PACKED_MIN_NEW_TOKENS + 4, stop_token_ids(tokenizer))
    packs = _count_packs(monkeypatch)
    packed = HFEngine(model, tokenizer.pad_token_id, 8, packing=packing).generate(requests, settings)
    assert 8 in packs  # the batch of 8 rows (of 9) is packed at its second step
    unpacked = HFEngine(model, tokenizer.pad_token_id, 8, packing="none").generate(requests, settings)
    assert all("forward" not in m.__dict__ for m in model.modules())
    for a, b in zip(packed, unpacked):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)



def test_short_responses_multiply_the_weights_unpacked(monkeypatch):
    model, tokenizer = lora_policy(3)
    requests = _three_prompts(tokenizer)
    packs = _count_packs(monkeypatch)
    short = SamplingSettings(1.0, 1.0, PACKED_MIN_NEW_TOKENS - 1, (), min_new_tokens=PACKED_MIN_NEW_TOKENS - 1)
    samples = HFEngine(model, tokenizer.pad_token_id, 8).generate(requests, short)
    assert packs == [] and all(len(s.token_ids) == PACKED_MIN_NEW_TOKENS - 1 for group in samples for s in group)
    long_enough = dataclasses.replace(short, max_new_tokens=PACKED_MIN_NEW_TOKENS, min_new_tokens=PACKED_MIN_NEW_TOKENS)
    HFEngine(model, tokenizer.pad_token_id, 8).generate(requests, long_enough)
    assert 8 in packs

def test_a_new_row_count_is_packed_on_its_second_call():
    """MKL's copy serves the row count it was packed for: another is packed on its second call."""
    layer = _layer()
    with torch.no_grad(), packed_linears(layer, packing="mkl"):
        for rows, packed_after in [(5, 0), (5, 5), (5, 5), (3, 5), (3, 3), (40, 3), (3, 3), (300, 3), (300, 3)]:
            layer(torch.randn(rows, 96))
            group = layer.forward.group
            assert (group.packed.rows if group.packed else 0) == packed_after


@pytest.mark.skipif("onednn" not in packings_available(), reason="torch has no oneDNN packed matmul here")
def test_the_onednn_copy_is_made_once_and_serves_every_row_count(monkeypatch):
    layer = _layer()
    packs = _count_packs(monkeypatch)
    with torch.no_grad(), packed_linears(layer, packing="onednn"):
        for rows in (300, 5, 5, 3, 40, 3, 256, 300):
            x = torch.randn(rows, 96)
            got = layer(x)
            # packed at the second call of a row count (5), then every input up to PACKED_ROWS_MOST runs packed
            assert (layer.forward.group.outputs is not None) == (rows <= 256 and packs == [5])
            torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert packs == [5]


def test_nothing_is_packed_without_room_for_the_copies(monkeypatch):
    import meds_cli.engine.rollout.packed_linear as packed_linear

    layer = _layer()
    weight_bytes = layer.weight.numel() * 4
    monkeypatch.setattr(packed_linear, "free_memory", lambda device: 4 * 3 * weight_bytes - 1)
    with packed_linears(layer) as patched:
        assert patched == 0 and "forward" not in layer.__dict__
    monkeypatch.setattr(packed_linear, "free_memory", lambda device: 4 * 3 * weight_bytes)
    with packed_linears(layer) as patched:
        assert patched == 1


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(96, n) for n in (96, 32, 32))
        self.o_proj = torch.nn.Linear(96, 96)


def test_layers_on_one_input_share_one_stacked_matmul():
    attention = _Attention()
    x = torch.randn(6, 96)
    with torch.no_grad():
        expected = [layer(x) for layer in (attention.q_proj, attention.k_proj, attention.v_proj)]
        with packed_linears(attention) as patched:
            q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
            assert patched == 4 and q.forward.group is k.forward.group is v.forward.group
            assert attention.o_proj.forward.group is not q.forward.group
            q(x.clone())
            y = x.clone()
            got = [q(y), k(y), v(y)]
            assert q.forward.group.packed.rows == 6 and q.forward.group.outputs is not None
            for a, b in zip(got, expected):
                assert a.shape == b.shape and (a - b).abs().max() <= 1e-5 * b.abs().max()
            # another input, or the same one changed in place, is multiplied again
            z = torch.randn(6, 96)
            assert torch.allclose(k(z), torch.nn.functional.linear(z, k.weight, k.bias), atol=1e-5)
            y.mul_(2)
            assert torch.allclose(v(y), 2 * (expected[2] - v.bias) + v.bias, atol=1e-5)
