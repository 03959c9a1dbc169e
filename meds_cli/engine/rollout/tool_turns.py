"""Any rollout engine, driven turn by turn for tool-integrated reasoning (rollout.tools, docs/tools.md).

`sample_tool_responses(engine, tokenizer, requests, settings, vocab_size)` runs the turn loop
(tools/turn_loop.sample_with_tools) with the engine as its `generate_turn`: each round's contexts
go to `engine.generate` as requests, identical consecutive contexts with the same budget grouped
into one request (the first turn's requests are then exactly the ones asked without tools: a
prompt and its G seeds, which is what an engine apart prefetched: pipeline.py), each context with
its own token budget (SampleRequest.max_new_tokens) and seed (turn_loop.turn_seed). Every turn's
samples pass rollout_check.py as every engine's do; a sample that paused at a stop string is a turn
that did not finish. batch.py lays the responses out as a Rollouts batch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from meds_cli.engine.rollout.rollout_check import checked_samples
from meds_cli.engine.rollout.sampling_engine import RolloutEngine, SampleRequest, SamplingSettings, split_by_request
from meds_cli.engine.rollout.tools.blocks import stop_strings
from meds_cli.engine.rollout.tools.turn_loop import ToolResponse, ToolRuntime, Turn, TurnLimits, sample_with_tools


def turn_settings(settings: SamplingSettings) -> SamplingSettings:
    """What an engine is asked with: `settings` without the tool settings, and with tools the
    code blocks' stop strings (the first turn's; a response past its call limit is asked without).
    Logit-lens values are not recorded turn by turn."""
    if settings.tools is None:
        return settings
    return replace(settings, tools=None, lens=None, stop_strings=tuple(stop_strings(settings.tools.code_tags)))


class EngineTurns:
    """turn_loop's generate_turn over a RolloutEngine (the module docstring)."""

    def __init__(self, engine: RolloutEngine, settings: SamplingSettings, vocab_size: int):
        self.engine, self.settings, self.vocab_size = engine, turn_settings(settings), vocab_size

    def __call__(self, contexts: list[list[int]], budgets: list[int], stop: list[str], seeds: list[int]) -> list[Turn]:
        settings = replace(self.settings, stop_strings=tuple(stop))
        requests: list[SampleRequest] = []
        for context, budget, seed in zip(contexts, budgets, seeds, strict=True):
            own = None if budget >= settings.max_new_tokens else budget
            last = requests[-1] if requests else None
            if last is not None and last.max_new_tokens == own and last.prompt_ids == tuple(context):
                requests[-1] = replace(last, seeds=last.seeds + (seed,))
            else:
                requests.append(SampleRequest(tuple(context), (seed,), own))
        samples = self.engine.generate(requests, settings)
        checked_samples(self.engine, requests, samples, settings, self.vocab_size)
        return [Turn(s.token_ids, s.logprobs, finished=not s.paused, policy_version=s.policy_version)
                for group in samples for s in group]


def sample_tool_responses(engine: RolloutEngine, tokenizer, requests: Sequence[SampleRequest],
                          settings: SamplingSettings, vocab_size: int, workers: int | None = None,
                          any_process: Callable[[bool], bool] | None = None) -> list[list[ToolResponse]]:
    """Every request's responses sampled with tools (settings.tools), one list per request in seed
    order; `workers`: the sandbox's parallel processes (None: the CPU budget's); `any_process`: the
    training processes' agreement, so that each makes the same engine calls (turn_loop.py; None:
    this process alone)."""
    runtime = ToolRuntime(tokenizer, settings.tools, workers=workers)
    prompts = [list(r.prompt_ids) for r in requests for _ in r.seeds]
    seeds = [seed for r in requests for seed in r.seeds]
    flat = sample_with_tools(EngineTurns(engine, settings, vocab_size), prompts, runtime,
                             TurnLimits.of(settings.tools, settings.max_new_tokens), seeds, any_process)
    return split_by_request(requests, flat)
