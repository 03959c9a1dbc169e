"""Generation of rollouts: samples from the rollout engine (meds_cli/engine/rollout/sampling_engine.py:
`hf` or `vllm`, built by meds_cli/engine/rollout/engines.py) laid out as a Rollouts batch
(meds_cli/core/rollouts.py). The forward pass that scores them is in meds_cli/engine/training/scoring.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from meds_cli.core.forward import LensProbe
from meds_cli.core.records import Problem
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.rollout.hf_sampler import HFEngine
from meds_cli.engine.rollout.rollout_check import checked_samples
from meds_cli.engine.rollout.sampling_engine import (
    SEED_LIMIT,
    RolloutEngine,
    Sample,
    SampleRequest,
    SamplingSettings,
    stop_token_ids,
)
from meds_cli.engine.rollout.tool_turns import sample_tool_responses
from meds_cli.engine.rollout.tools.settings import tool_settings_of
from meds_cli.engine.rollout.tools.turn_loop import ToolResponse

# ---------------------------------------------------------------- generation


def sampling_settings(rollout_cfg, tokenizer, *, temperature: float | None = None,
                      top_p: float | None = None, lens: LensProbe | None = None) -> SamplingSettings:
    """The rollout section's sampling settings (temperature / top_p overridable, as for greedy
    evals; `lens`: logit-lens values to record per token), its tool settings where rollout.tools
    names any (then sampled turn by turn: docs/tools.md)."""
    return SamplingSettings(temperature=rollout_cfg.temperature if temperature is None else temperature,
                            top_p=rollout_cfg.top_p if top_p is None else top_p,
                            max_new_tokens=rollout_cfg.max_new_tokens, stop_ids=stop_token_ids(tokenizer),
                            min_new_tokens=rollout_cfg.min_new_tokens, lens=lens,
                            tools=tool_settings_of(rollout_cfg) if rollout_cfg.enabled else None)


def draw_seeds(prompts: int, group_size: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """One seed per sample, `group_size` per prompt, the next draw of `generator` (None: torch's
    global RNG). Every seed a rollout is sampled with comes from here (the rollout source's planned
    rounds too), so two draws of one generator state give the same requests."""
    return torch.randint(0, SEED_LIMIT, (prompts, group_size), generator=generator).tolist()


def sample_rollouts(engine: RolloutEngine, tokenizer, prompts: list[str], problems: list[Problem], group_size: int,
                    settings: SamplingSettings, *, vocab_size: int | None = None,
                    seeds: list[list[int]] | None = None,
                    any_process: Callable[[bool], bool] | None = None) -> Rollouts:
    """`group_size` responses for every prompt from the rollout engine. Prompts go to the engine as
    token ids (the chat template already holds any BOS); each sample's seed is one of `seeds` (the
    rollout source's, drawn from a generator of the step: source.py), else drawn from torch's
    global RNG (draw_seeds), so a resumed run samples the same responses.
    No prompts: the engine is still called (its call may be collective, as vLLM's tensor-parallel
    pooling is) and the batch is empty. What the engine returns is checked before anything else
    reads it (rollout_check.py); `vocab_size`: the ids the policy can score (its embedding rows,
    which may pad the tokenizer's vocabulary; None: the tokenizer's). `any_process`: True on
    every training process when True on one (Collectives.any; None: this process alone): with
    tools, each process then makes as many engine calls as the others, in the same order, whatever
    number of turns its own responses take (tools/turn_loop.py)."""
    seeds = draw_seeds(len(prompts), group_size) if seeds is None else seeds
    requests = sample_requests(tokenizer, prompts, seeds)
    vocab_size = len(tokenizer) if vocab_size is None else vocab_size
    if settings.tools is not None:  # turn by turn, code blocks run between turns (tool_turns.py)
        responses = sample_tool_responses(engine, tokenizer, requests, settings, vocab_size,
                                          any_process=any_process)
        return rollouts_from_tool_responses(tokenizer, [r.prompt_ids for r in requests], responses, problems,
                                            group_size, settings.stop_ids)
    samples = engine.generate(requests, settings)
    checked_samples(engine, requests, samples, settings, vocab_size)
    return rollouts_from_samples(tokenizer, [r.prompt_ids for r in requests], samples, problems, group_size,
                                 settings.stop_ids)


def sample_requests(tokenizer, prompts: list[str], seeds) -> list[SampleRequest]:
    """One engine request per prompt: its token ids as the template wrote them (no BOS added:
    a chat template already holds it) and the seeds of its samples."""
    prompt_ids = tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if prompts else []
    return [SampleRequest(tuple(ids), tuple(s)) for ids, s in zip(prompt_ids, seeds)]


def sample_responses(model, tokenizer, prompts: list[str], problems: list[Problem], group_size: int, *,
                     temperature: float, top_p: float, max_new_tokens: int, batch_size: int,
                     min_new_tokens: int = 0) -> Rollouts:
    """sample_rollouts with the `hf` engine on `model` (scripts and tests that hold a bare model)."""
    settings = SamplingSettings(temperature, top_p, max_new_tokens, stop_token_ids(tokenizer), min_new_tokens)
    engine = HFEngine(model, tokenizer.pad_token_id, batch_size)
    return sample_rollouts(engine, tokenizer, prompts, problems, group_size, settings)


def decode_responses(tokenizer, samples: list[Sample], stop_ids) -> list[str]:
    """Response texts without their stop tokens."""
    stop = set(stop_ids)
    return tokenizer.batch_decode([[t for t in s.token_ids if t not in stop] for s in samples],
                                  skip_special_tokens=True)


def segment_decoder(tokenizer, stop_ids) -> Callable[[list[int]], str]:
    """The text of a run of token ids as decode_responses decodes a response: stop tokens left out,
    special tokens skipped (ToolResponse.text decodes each segment of a response sampled with tools
    with it, training and eval alike)."""
    stop = set(stop_ids)
    return lambda ids: tokenizer.decode([t for t in ids if t not in stop], skip_special_tokens=True)


def rollouts_from_tool_responses(tokenizer, prompt_ids: list[tuple[int, ...]], responses: list[list[ToolResponse]],
                                 problems: list[Problem], group_size: int, stop_ids) -> Rollouts:
    """The Rollouts of responses sampled with tools (docs/tools.md, "What an engine hands the
    trainer"): the ids from each response's layout (observations included, attention 1 on every
    response token), the loss mask 0 on observations, the sampler's log-probs at the model's
    tokens, the text with its observation spans (each segment decoded by segment_decoder), the
    tool stats; a response stopped where the model ended it on a stop id (ToolResponse.ended_on).
    The eval's generated_with_tools (eval_backends.py) reads a response the same way."""
    stop = set(stop_ids)
    as_samples = [[Sample(r.layout()[0], r.ended_on(stop), r.logprobs(), policy_version=r.policy_version)
                   for r in group] for group in responses]
    batch = rollouts_from_samples(tokenizer, prompt_ids, as_samples, problems, group_size, stop_ids)
    flat = [r for group in responses for r in group]
    for row, response in enumerate(flat):
        mask = response.layout()[1]
        batch.response_mask[row, :len(mask)] = torch.tensor(mask, dtype=batch.response_mask.dtype)
    text_of = segment_decoder(tokenizer, stop)
    texts = [response.text(text_of) for response in flat]
    return replace(batch, response_texts=[text for text, _ in texts], observation_spans=[spans for _, spans in texts],
                   tool_stats=[response.stats for response in flat])


def rollouts_from_samples(tokenizer, prompt_ids: list[tuple[int, ...]], samples: list[list[Sample]],
                          problems: list[Problem], group_size: int, stop_ids) -> Rollouts:
    """Lay the engine's samples out as described in meds_cli/core/rollouts.py: prompts
    left-padded, responses (stop token included) right-padded, the sampler's log-probs (and
    logit-lens values) beside them where the engine gave them."""
    rows = [(ids, sample) for ids, group in zip(prompt_ids, samples) for sample in group]
    pad = tokenizer.pad_token_id
    # No rows (a process that had nothing to ask still enters the engine's call): an empty batch.
    width_p = max((len(ids) for ids, _ in rows), default=0)
    width_r = max(1, max((len(s.token_ids) for _, s in rows), default=0))
    prompt = torch.full((len(rows), width_p), pad, dtype=torch.long)
    prompt_mask = torch.zeros((len(rows), width_p), dtype=torch.long)
    response = torch.full((len(rows), width_r), pad, dtype=torch.long)
    response_mask = torch.zeros((len(rows), width_r))
    with_logprobs = all(s.logprobs is not None for _, s in rows)
    sampler_logp = torch.zeros((len(rows), width_r)) if with_logprobs else None
    for i, (ids, sample) in enumerate(rows):
        if ids:
            prompt[i, width_p - len(ids):] = torch.tensor(ids)
            prompt_mask[i, width_p - len(ids):] = 1
        n = len(sample.token_ids)
        response[i, :n] = torch.tensor(sample.token_ids, dtype=torch.long)
        response_mask[i, :n] = 1.0
        if with_logprobs:
            sampler_logp[i, :n] = torch.tensor(sample.logprobs)
    return Rollouts(
        problems=problems, group_size=group_size,
        input_ids=torch.cat([prompt, response], dim=1),
        attention_mask=torch.cat([prompt_mask, response_mask.long()], dim=1),
        prompt_width=width_p, response_ids=response, response_mask=response_mask,
        response_texts=decode_responses(tokenizer, [s for _, s in rows], stop_ids),
        truncated=torch.tensor([not s.stopped for _, s in rows]), sampler_logp=sampler_logp,
        sampler_lens=[s.lens for _, s in rows] if all(s.lens is not None for _, s in rows) else None,
        sampler_version=(torch.tensor([s.policy_version for _, s in rows], dtype=torch.long)
                         if rows and all(s.policy_version is not None for _, s in rows) else None),
    )
