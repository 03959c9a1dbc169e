"""Generation and scoring of rollouts: batched HF generate, and the no-grad forward pass that
fills old log-probs, entropy and reference log-probs (the batch layout is in meds_cli/core/rollouts.py).
"""

from __future__ import annotations

from typing import Callable

import torch

from meds_cli.core.forward import ForwardView
from meds_cli.core.records import Problem
from meds_cli.core.rollouts import Rollouts


# ---------------------------------------------------------------- generation


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() computes them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def sample_responses(model, tokenizer, prompts: list[str], problems: list[Problem], group_size: int, *,
                     temperature: float, top_p: float, max_new_tokens: int, batch_size: int) -> Rollouts:
    """Sample `group_size` responses for every prompt with batched HF generate (left padding)."""
    device = next(model.parameters()).device
    eos_ids = _eos_ids(tokenizer)
    pad_id = tokenizer.pad_token_id
    texts = [p for p in prompts for _ in range(group_size)]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_ids, prompt_mask = enc["input_ids"], enc["attention_mask"]
    responses = []
    do_sample = temperature > 0
    for start in range(0, len(texts), batch_size):
        ids = prompt_ids[start:start + batch_size].to(device)
        mask = prompt_mask[start:start + batch_size].to(device)
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=do_sample, max_new_tokens=max_new_tokens,
            temperature=temperature if do_sample else None, top_p=top_p if do_sample else None, top_k=0 if do_sample else None,
            eos_token_id=eos_ids, pad_token_id=pad_id,
        )
        responses.extend(out[:, ids.shape[1]:].cpu())
    return _assemble(tokenizer, prompt_ids, prompt_mask, responses, problems, group_size, eos_ids, max_new_tokens)


def _eos_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    # Chat models end a turn with their own token (SmolLM2: <|im_end|>), which may differ from eos.
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(token) if token in tokenizer.get_vocab() else None
        if tid is not None:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


def _assemble(tokenizer, prompt_ids, prompt_mask, responses, problems, group_size, eos_ids, max_new_tokens) -> Rollouts:
    """Cut each response after its first EOS and lay the batch out as described above."""
    pad_id = tokenizer.pad_token_id
    eos = torch.tensor(eos_ids)
    cut, truncated = [], []
    for resp in responses:
        is_eos = torch.isin(resp, eos)
        if is_eos.any():
            end = int(is_eos.nonzero()[0]) + 1
            cut.append(resp[:end])
            truncated.append(False)
        else:
            cut.append(resp)
            truncated.append(True)
    width = max(1, max(len(c) for c in cut))
    response_ids = torch.full((len(cut), width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(cut), width))
    for i, c in enumerate(cut):
        response_ids[i, :len(c)] = c
        response_mask[i, :len(c)] = 1.0
    texts = tokenizer.batch_decode([c[~torch.isin(c, eos)] for c in cut], skip_special_tokens=True)
    return Rollouts(
        problems=problems, group_size=group_size,
        input_ids=torch.cat([prompt_ids, response_ids], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask.long()], dim=1),
        prompt_width=prompt_ids.shape[1], response_ids=response_ids, response_mask=response_mask,
        response_texts=texts, truncated=torch.tensor(truncated),
    )


# ---------------------------------------------------------------- scoring forward pass


def response_forward(model, input_ids, attention_mask, prompt_width: int, *, hidden_states: bool = False):
    """Forward pass returning response-position logits [b, R, V] (fp32) and optionally all hidden states."""
    width = input_ids.shape[1] - prompt_width
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask),
                output_hidden_states=hidden_states, use_cache=False, logits_to_keep=width + 1)
    logits = out.logits[:, :-1].float()  # position Lp-1+j predicts response token j
    return logits, (out.hidden_states if hidden_states else None)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token], without materialising the full log-softmax twice."""
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@torch.no_grad()
def score_rollouts(model, rollouts: Rollouts, micro_batch_size: int, *, with_reference: bool,
                   wants_hidden_states: bool = False, observe: Callable[[ForwardView], None] | None = None,
                   disable_adapter=None, tokenizer=None) -> None:
    """Fill old_logp, entropy (and ref_logp) in micro-batches; hand each micro-batch's view to `observe`."""
    old, ent, ref = [], [], []
    device = next(model.parameters()).device
    for start in range(0, rollouts.size, micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        ids = rollouts.input_ids[rows].to(device)
        mask = rollouts.attention_mask[rows].to(device)
        tokens = rollouts.response_ids[rows].to(device)
        logits, hidden = response_forward(model, ids, mask, rollouts.prompt_width, hidden_states=wants_hidden_states)
        old.append(token_logprobs(logits, tokens).cpu())
        ent.append(token_entropy(logits).cpu())
        if observe is not None:
            observe(ForwardView(rows=rows, logits=logits, hidden_states=hidden, model=model, tokenizer=tokenizer))
        if with_reference:
            with disable_adapter():
                ref_logits, _ = response_forward(model, ids, mask, rollouts.prompt_width)
            ref.append(token_logprobs(ref_logits, tokens).cpu())
    mask = rollouts.response_mask
    rollouts.old_logp = torch.cat(old) * mask
    rollouts.entropy = torch.cat(ent) * mask
    rollouts.ref_logp = torch.cat(ref) * mask if with_reference else None
