"""Rollouts: G sampled responses per prompt, and the no-grad forward pass that scores them.

Layout of a batch of B = P * G sequences (groups are contiguous: rows g*G .. g*G+G-1):
  input_ids [B, Lp + R]: the prompt left-padded to Lp, then the response right-padded to R.
  response_mask [B, R]: 1 on response tokens up to and including the first EOS.
The logits at column Lp - 1 + j predict response token j, so per-token quantities of the
response (old log-probs, entropy, ...) are [B, R] tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
import torch.nn.functional as F

from benchmarks.registry import Problem, Verdict


@dataclass
class Rollouts:
    problems: list[Problem]  # one per group
    group_size: int
    input_ids: torch.Tensor  # [B, Lp + R]
    attention_mask: torch.Tensor  # [B, Lp + R]
    prompt_width: int  # Lp
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] float
    response_texts: list[str]
    truncated: torch.Tensor  # [B] bool: no EOS within the length limit
    old_logp: torch.Tensor | None = None  # [B, R]
    ref_logp: torch.Tensor | None = None  # [B, R], reference policy (adapter disabled)
    entropy: torch.Tensor | None = None  # [B, R]
    verdicts: list[Verdict] = field(default_factory=list)  # grader's view; label-free algorithms never read it
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)  # each [B]
    rewards: torch.Tensor | None = None  # [B], after shaping
    advantages: torch.Tensor | None = None  # [B] or [B, R]
    extras: dict[str, Any] = field(default_factory=dict)  # per-response data an algorithm collects

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return len(self.problems)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1).long()

    def select_groups(self, keep: torch.Tensor) -> "Rollouts":
        """A new Rollouts with only the groups where `keep` [P] is True (per-response fields follow)."""
        rows = keep.repeat_interleave(self.group_size).nonzero().squeeze(-1).tolist()

        def take(value):
            if isinstance(value, torch.Tensor):
                return value[rows]
            if isinstance(value, list):
                return [value[i] for i in rows] if value else []  # an unset per-response list stays empty
            if isinstance(value, dict):
                return {k: take(v) for k, v in value.items()}
            return value

        per_response = {name: take(getattr(self, name)) for name in _PER_RESPONSE}
        problems = [p for p, k in zip(self.problems, keep.tolist()) if k]
        return Rollouts(problems=problems, group_size=self.group_size, prompt_width=self.prompt_width, **per_response)

    @staticmethod
    def concat(parts: list["Rollouts"], pad_id: int) -> "Rollouts":
        """Join batches from several generation rounds, re-padding to a common width."""
        parts = [p for p in parts if p.size]
        if not parts:
            raise ValueError("Rollouts.concat needs at least one non-empty batch")
        if len(parts) == 1:
            return parts[0]
        prompt_width = max(p.prompt_width for p in parts)
        width = max(p.response_ids.shape[1] for p in parts)

        def padded(part, name):
            value = getattr(part, name)
            if value is None or name not in _PROMPT_SIDE + _RESPONSE_SIDE:
                return value
            left = prompt_width - part.prompt_width if name in _PROMPT_SIDE else 0
            fill = pad_id if name.endswith("_ids") else 0
            return F.pad(value, (left, width - part.response_ids.shape[1]), value=fill)

        def join(values):
            if any(v is None for v in values):
                return None
            if isinstance(values[0], torch.Tensor):
                return torch.cat(values)
            if isinstance(values[0], dict):
                return {k: join([v[k] for v in values]) for k in values[0]}
            return [item for value in values for item in value]

        joined = {name: join([padded(p, name) for p in parts]) for name in _PER_RESPONSE + ("problems",)}
        return Rollouts(group_size=parts[0].group_size, prompt_width=prompt_width, **joined)


# How fields join across batches of different widths: [B, Lp + R] tensors are padded on both
# sides, [B, R] tensors on the right; every other per-response field is concatenated as it is.
_PROMPT_SIDE = ("input_ids", "attention_mask")
_RESPONSE_SIDE = ("response_ids", "response_mask", "old_logp", "ref_logp", "entropy")
_PER_RESPONSE = tuple(f.name for f in fields(Rollouts) if f.name not in ("problems", "group_size", "prompt_width"))


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


@dataclass
class ForwardView:
    """What an algorithm may look at in the sampling forward pass, for rows `rows` of the batch.
    `logits` are the response-position logits [b, R, V]; `hidden_states` the per-layer states
    (embedding output first) over the full sequence, present when the algorithm asked for them."""

    rows: slice
    logits: torch.Tensor
    hidden_states: tuple | None
    model: Any
    tokenizer: Any = None


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
