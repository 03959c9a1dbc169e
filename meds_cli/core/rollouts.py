"""Rollouts: G sampled responses per prompt, the record every algorithm hook receives.

Layout of a batch of B = P * G sequences (groups are contiguous: rows g*G .. g*G+G-1):
  input_ids [B, Lp + R]: the prompt left-padded to Lp, then the response right-padded to R.
  response_mask [B, R]: 1 on the policy's own response tokens up to and including the first EOS.
The logits at column Lp - 1 + j predict response token j, so per-token quantities of the
response (old log-probs, entropy, ...) are [B, R] tensors.

Responses sampled with tools (docs/tools.md) hold observations: tool output the model read but did
not write. Their tokens are attended (attention_mask 1) but not the policy's (response_mask 0), as
verl's response_mask: every loss, ratio, clip fraction, KL, entropy mean and length that reads
response_mask leaves them out, while the forwards (padded or packed) keep them as context.
`observation_spans` says where they are in `response_texts`; `answer_texts` is what graders and
voters read: the text without them, so an answer the tool printed is not the model's answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F

from meds_cli.core.records import Problem, Verdict


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
    # [B, R], the rollout engine's own log-probs, where it gives them (0.0 on observations)
    sampler_logp: torch.Tensor | None = None
    # per response [its tokens, L]: logit-lens values the engine recorded (SamplingSettings.lens)
    sampler_lens: list[torch.Tensor] | None = None
    sampler_version: torch.Tensor | None = None  # [B] long: the policy version that sampled each response, where known
    verdicts: list[Verdict] = field(default_factory=list)  # grader's view; label-free algorithms never read it
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)  # each [B]
    rewards: torch.Tensor | None = None  # [B], after shaping
    advantages: torch.Tensor | None = None  # [B] or [B, R]
    extras: dict[str, Any] = field(default_factory=dict)  # per-response data an algorithm collects
    # per response: [(start, end), ...] character spans of response_texts that are observations
    # (tool output); empty when sampled without tools
    observation_spans: list[list[tuple[int, int]]] = field(default_factory=list)
    # per response: its use of tools (engine/rollout/tools ToolStats) when sampled with tools; else empty
    tool_stats: list[Any] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return len(self.problems)

    @property
    def response_lengths(self) -> torch.Tensor:
        """[B] the policy's tokens of each response (observation tokens not counted): the length
        every algorithm reads (DAPO's overlong shaping, length-normalised losses, the metrics)."""
        return self.response_mask.sum(-1).long()

    @property
    def observation_mask(self) -> torch.Tensor:
        """[B, R] float: 1 on observation tokens (attended response tokens the policy did not write)."""
        attended = self.attention_mask[:, self.prompt_width:].to(self.response_mask.device) != 0
        return (attended & (self.response_mask == 0)).to(self.response_mask.dtype)

    @property
    def observation_lengths(self) -> torch.Tensor:
        """[B] observation tokens of each response (0 without tools)."""
        return self.observation_mask.sum(-1).long()

    @property
    def answer_texts(self) -> list[str]:
        """The responses' texts as graders and voters read them: observation spans removed."""
        if not self.observation_spans:
            return list(self.response_texts)
        return [without_spans(text, spans) for text, spans in zip(self.response_texts, self.observation_spans,
                                                                  strict=True)]

    def groups(self) -> list[slice]:
        """The rows of each group, in order: slice(g*G, g*G + G) for group g."""
        return group_slices(self.size, self.group_size)

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
            if name in _TOOL_SIDE and not value:  # a part sampled without tools, beside one with them
                return [[] if name == "observation_spans" else None for _ in range(part.size)]
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
_RESPONSE_SIDE = ("response_ids", "response_mask", "old_logp", "ref_logp", "entropy", "sampler_logp")
_TOOL_SIDE = ("observation_spans", "tool_stats")
_PER_RESPONSE = tuple(f.name for f in fields(Rollouts) if f.name not in ("problems", "group_size", "prompt_width"))


def without_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with the character spans `spans` (sorted, not overlapping) cut out."""
    kept, at = [], 0
    for start, end in spans:
        kept.append(text[at:start])
        at = end
    return "".join(kept) + text[at:]


def group_slices(size: int, group_size: int) -> list[slice]:
    """slice(g*G, g*G + G) for every group of a batch of `size` rows laid out group by group."""
    return [slice(start, min(start + group_size, size)) for start in range(0, size, group_size)]
