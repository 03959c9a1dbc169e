"""The direct decode step of Llama-layout models: logits bit-identical to the model's forward,
the same samples through the engine, and the model's forward wherever the step does not apply."""

import pytest
import torch

from meds_cli.core.forward import LensProbe, cache_keyword, output_cache, position_ids_for
from meds_cli.core.packed_matmul import packings_available
from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.model_io.tiny import tiny_tokenizer
from meds_cli.engine.rollout.decoder_step import DecoderStep
from meds_cli.engine.rollout.hf_sampler import HFEngine, merged_lora
from meds_cli.engine.rollout.lens_probe import LensRecorder
from meds_cli.engine.rollout.packed_linear import PACKED_MIN_NEW_TOKENS, can_pack, packed_linears
from meds_cli.engine.rollout.reserved_cache import reserve_cache
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings, stop_token_ids
from tests.tiny_policy import lora_policy

pytestmark = pytest.mark.skipif(not can_pack(torch.zeros(2, 2)), reason="torch has no MKL packed matmul here")


def qwen2_policy(seed: int):
    """A tiny Qwen2 (biases on query/key/value, 4 query heads sharing 2 key/value heads) with a
    LoRA adapter that changes its outputs."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = apply_lora(Qwen2ForCausalLM(config), LoraConfig(rank=8))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model.eval(), tokenizer


POLICIES = {"llama": lambda: lora_policy(5), "qwen2": lambda: qwen2_policy(5)}
PROMPTS = ["12+7=", "a long prompt: 3*4+5=", "x"]  # left padding for two of the three


def _prefilled(model, tokenizer, rows_per_prompt: int = 2):
    """(cache, attention mask, positions, next tokens) after a prefill of PROMPTS, each prompt's
    keys and values copied to `rows_per_prompt` rows."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(input_ids)
    for i, row in enumerate(ids):
        input_ids[i, width - len(row):], mask[i, width - len(row):] = torch.tensor(row), 1
    positions = position_ids_for(mask)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = output_cache(out)
    rows = torch.arange(len(ids)).repeat_interleave(rows_per_prompt)
    reserve_cache(cache, rows, width + 16)
    tokens = out.logits[:, -1].argmax(-1)[rows][:, None]
    return cache, mask[rows], positions[rows, -1:] + 1, tokens


def _count_direct_steps(monkeypatch) -> list:
    """What every DecoderStep call returns from now on (None where the model's forward ran)."""
    returned, call = [], DecoderStep.__call__

    def counted(self, *args):
        returned.append(call(self, *args))
        return returned[-1]

    monkeypatch.setattr(DecoderStep, "__call__", counted)
    return returned


@pytest.mark.parametrize("packing", packings_available())
@pytest.mark.parametrize("architecture", sorted(POLICIES))
def test_the_direct_step_gives_the_models_logits_bit_for_bit(architecture, packing):
    model, tokenizer = POLICIES[architecture]()
    with torch.no_grad(), merged_lora(model), packed_linears(model, packing=packing):
        cache, mask, positions, tokens = _prefilled(model, tokenizer)
        step = DecoderStep.plan(model)
        assert step is not None
        compared = 0
        for _ in range(6):
            mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
            direct = step(tokens, mask, positions, cache)
            if direct is not None:  # the weights packed for these rows (from the second step on)
                cache.crop(-1)  # the same step again through the model's forward
                compared += 1
            logits = model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                           **{cache_keyword(model): cache}).logits[:, -1]
            if direct is not None:
                assert torch.equal(direct, logits)
            tokens, positions = logits.argmax(-1, keepdim=True), positions + 1
        assert compared >= 4


@pytest.mark.parametrize("packing", packings_available())
@pytest.mark.parametrize("architecture", sorted(POLICIES))
def test_engine_samples_are_the_same_with_and_without_direct_steps(architecture, packing, monkeypatch):
    model, tokenizer = POLICIES[architecture]()
    requests = [SampleRequest(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]), (3 * i, 3 * i + 1, 3 * i + 2))
                for i, p in enumerate(PROMPTS)]
    settings = SamplingSettings(1.0, 0.9, PACKED_MIN_NEW_TOKENS + 4, stop_token_ids(tokenizer))
    direct_steps = _count_direct_steps(monkeypatch)
    direct = HFEngine(model, tokenizer.pad_token_id, 16, packing=packing).generate(requests, settings)
    assert sum(logits is not None for logits in direct_steps) >= PACKED_MIN_NEW_TOKENS
    through_forward = HFEngine(model, tokenizer.pad_token_id, 16, packing=packing,
                               direct_steps=False).generate(requests, settings)
    for a, b in zip(direct, through_forward):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.logprobs == y.logprobs and x.stopped == y.stopped


def test_a_row_count_the_weights_are_not_packed_for_runs_the_models_forward():
    model, tokenizer = lora_policy(5)
    with torch.no_grad(), merged_lora(model), packed_linears(model):
        cache, mask, positions, tokens = _prefilled(model, tokenizer)
        step = DecoderStep.plan(model)
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        assert step(tokens, mask, positions, cache) is None  # first decode step: nothing packed yet


def test_where_the_step_does_not_apply_there_is_no_plan():
    model, tokenizer = lora_policy(5)
    with torch.no_grad():
        assert DecoderStep.plan(model) is None  # weights not packed
        with packed_linears(model):
            assert DecoderStep.plan(model) is None  # packed, but the adapters are not merged
        with merged_lora(model), packed_linears(model):
            assert DecoderStep.plan(model) is not None
            with LensRecorder(model, LensProbe((1, 2))) as lens:
                assert DecoderStep.plan(model) is None  # hooks must see every layer
                assert DecoderStep.plan(model, lens) is not None  # unless they are the recorder's own
            model.base_model.model.config._attn_implementation = "flex_attention"
            assert DecoderStep.plan(model) is None
            model.base_model.model.config._attn_implementation = "sdpa"
            handle = model.base_model.model.model.norm.register_forward_hook(lambda *a: None)
            assert DecoderStep.plan(model) is None
            handle.remove()
            assert DecoderStep.plan(model) is not None
            value = model.base_model.model.model.layers[1].self_attn.v_proj
            value.merged_adapters = []  # one adapter live: its forward adds a path the step would skip
            assert DecoderStep.plan(model) is None
            value.merged_adapters = ["default"]
            model.train()
            assert DecoderStep.plan(model) is None
            model.eval()
            assert DecoderStep.plan(model) is not None


@pytest.mark.parametrize("layers", [(0, 2, 4), (1, 3)])
def test_lens_values_are_the_same_with_and_without_direct_steps(layers, monkeypatch):
    model, tokenizer = lora_policy(5)
    direct_steps = _count_direct_steps(monkeypatch)
    requests = [SampleRequest(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]), (2 * i, 2 * i + 1))
                for i, p in enumerate(PROMPTS)]
    settings = SamplingSettings(1.0, 1.0, PACKED_MIN_NEW_TOKENS + 2, (), lens=LensProbe(layers))
    direct = HFEngine(model, tokenizer.pad_token_id, 8).generate(requests, settings)
    assert sum(logits is not None for logits in direct_steps) >= PACKED_MIN_NEW_TOKENS - 1
    through_forward = HFEngine(model, tokenizer.pad_token_id, 8, direct_steps=False).generate(requests, settings)
    for a, b in zip(direct, through_forward):
        for x, y in zip(a, b):
            assert x.token_ids == y.token_ids and x.logprobs == y.logprobs
            assert x.lens.shape == (PACKED_MIN_NEW_TOKENS + 2, len(layers)) and torch.equal(x.lens, y.lens)
