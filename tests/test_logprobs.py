"""Chunked log-probs and entropy (meds_cli/engine/training/logprobs.py): the same numbers and gradients as
the full-logit computation on a tiny-hidden model with Qwen's 151,936-token vocabulary, at a
fraction of the peak memory."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meds_cli.engine.training.logprobs import token_logprobs_and_entropy

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 151936


@pytest.fixture(scope="module")
def big_vocab_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def reference_stats(logits, tokens, temperature):
    """log softmax(logits / T)[token] and the entropy of softmax(logits / T), in one piece."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_values_equal_full_logits(big_vocab_model, temperature):
    model = big_vocab_model
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 12))
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    hidden, logits = out.hidden_states[-1][:, :-1], out.logits[:, :-1]
    assert torch.allclose(model.lm_head(hidden), logits, atol=1e-5)  # the last hidden state is after the norm
    tokens = ids[:, 1:]
    mask = torch.ones_like(tokens, dtype=torch.float)
    mask[0, 7:] = 0  # a response that ended early
    expected_logp, expected_entropy = reference_stats(logits, tokens, temperature)
    for chunk in (1, 5, 7, 64):  # chunks that do and do not divide the 33 kept positions
        with torch.no_grad():
            logp, entropy = token_logprobs_and_entropy(hidden, model.lm_head, tokens, temperature=temperature,
                                                       mask=mask, chunk_tokens=chunk)
        assert logp.dtype == torch.float32 and logp.shape == tokens.shape
        assert torch.allclose(logp, expected_logp * mask, atol=1e-4), chunk
        assert torch.allclose(entropy, expected_entropy * mask, atol=1e-4), chunk
        assert torch.equal(logp[0, 7:], torch.zeros(4))
    # a softer temperature really changes the numbers (the argument is used)
    if temperature != 1.0:
        assert not torch.allclose(expected_logp, reference_stats(logits, tokens, 1.0)[0], atol=1e-3)


def test_chunked_gradients_equal_full_logits(big_vocab_model):
    head = big_vocab_model.lm_head
    torch.manual_seed(2)
    hidden = torch.randn(2, 9, 16)
    tokens = torch.randint(0, VOCAB, (2, 9))
    weights = torch.randn(2, 9)  # d loss / d logp, as an advantage would give

    def grads(chunked: bool):
        h = hidden.clone().requires_grad_()
        head.zero_grad(set_to_none=True)
        if chunked:
            logp, _ = token_logprobs_and_entropy(h, head, tokens, temperature=0.6, chunk_tokens=4)
        else:
            logp, _ = reference_stats(head(h), tokens, 0.6)
        (logp * weights).sum().backward()
        return h.grad.clone(), head.weight.grad.clone()

    (h_full, w_full), (h_chunk, w_chunk) = grads(False), grads(True)
    assert h_full.abs().sum() > 0
    assert torch.allclose(h_chunk, h_full, atol=1e-5)
    assert torch.allclose(w_chunk, w_full, atol=1e-6)
    head.zero_grad(set_to_none=True)


def test_bad_arguments_are_refused():
    head = torch.nn.Linear(4, 10)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(torch.zeros(1, 2, 4), head, torch.zeros(1, 2, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs_and_entropy(torch.zeros(1, 2, 4), head, torch.zeros(1, 2, dtype=torch.long), chunk_tokens=0)


def peak_mib(variant: str, length: int, chunk: int) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_logprob_memory.py"), "--child", variant, "--batch", "1",
           "--length", str(length), "--vocab", str(VOCAB), "--hidden", "8", "--chunk-tokens", str(chunk)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory is read from Linux /proc")
def test_peak_memory_of_scoring_and_loss_falls_by_the_chunk_factor():
    """Scoring + loss of one micro-batch (scripts/bench_logprob_memory.py, each variant in its own
    process, the kernel's resident-set high-water mark). The full-logit way holds several fp32
    [b, R, V] copies at once (logits, the exp inside logsumexp, softmax and its product for the
    entropy; in the backward the logits' gradient); chunked, the same few copies exist for one
    chunk at a time, plus the head's gradient, so memory falls by about the number of chunks."""
    length, chunk = 128, 16
    full = length * VOCAB * 4 / 2**20  # one fp32 [1, R, V]
    before, after = peak_mib("before", length, chunk), peak_mib("after", length, chunk)
    if before["method"] != "VmHWM after clear_refs":
        pytest.skip("the kernel refused to reset the high-water mark")
    assert before["loss"] == pytest.approx(after["loss"], rel=1e-5)
    assert before["grad_sum"] == pytest.approx(after["grad_sum"], rel=1e-4)
    chunk_logits = full * chunk / length
    head_grad = VOCAB * 8 * 4 / 2**20
    assert before["peak_mib"] > 3 * full  # several full-size copies
    assert after["peak_mib"] < 5 * chunk_logits + 2 * head_grad + 16  # a few chunk-size copies
    assert before["peak_mib"] / after["peak_mib"] > 4  # 8 chunks: expected about 5-6 with the overheads
