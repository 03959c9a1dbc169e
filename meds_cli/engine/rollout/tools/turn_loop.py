"""The turn loop of tool-integrated reasoning, for any engine, and the token layout it returns.

`sample_with_tools(generate_turn, prompts, runtime, limits)`: every response is sampled turn by
turn; an engine continues a batch of token-id contexts until a stop string, EOS or a length
limit (`generate_turn`), the loop finds a code block closed at the end of a paused turn, runs the
blocks of all paused responses at once in the sandbox, appends each output as an observation and
asks the engine to go on. The engine needs no tokenizer of its own and never sees a tool.

The result keeps each response's turns apart: model segments (trained on) and observation
segments (context only). `response_layout` turns them into the token ids, the loss mask (1 on
model tokens, 0 on observation tokens) and the positions of the model tokens, where the sampler's
log-probs belong; verl's tool agent loop returns the same (its response_mask).

Several training processes each run the loop on their own responses, which may need different
numbers of turns, while an engine call may be collective (a pipeline's agreement on failures,
vLLM's tensor-parallel pooling). With `any_process` (True on every process when True on one) every
process makes the same engine calls in the same order: a round runs while any process has a live
response, and each of its two calls (with stop strings, then without) is made, with no contexts
where a process has none, whenever any process has some.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from meds_cli.engine.rollout.tools.blocks import (
    closed_block,
    cut_to_tokens,
    limit_note,
    observation_text,
    stop_strings,
)
from meds_cli.engine.rollout.tools.python_session import CallResult, PythonSession, run_blocks
from meds_cli.engine.rollout.tools.settings import ToolSettings


@dataclass
class Turn:
    """What an engine returns for one context: the new token ids, the sampler's log-prob of each
    when it has them, and whether the sequence ended (EOS or the length limit: `finished`) rather
    than paused at a stop string. The stop string stays in the returned tokens."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    finished: bool = True
    policy_version: int | None = None  # the policy version that sampled it, where the engine says (engines apart)


# generate_turn(contexts, max_new_tokens, stop, seeds): continue each context (prompt + response so
# far) by at most max_new_tokens[i] tokens, pausing after any string of `stop` (none when empty),
# drawing from seeds[i] (turn_seed: the response's seed and the turn's index).
GenerateTurn = Callable[[list[list[int]], list[int], list[str], list[int]], Sequence[Turn]]

SEED_MASK = 2**62 - 1  # turn seeds stay below sampling_engine.SEED_LIMIT (2**62)


def turn_seed(seed: int, turn: int) -> int:
    """The seed of a response's `turn`-th engine call: its own seed for the first (so the first
    turn draws what the response draws without tools), then a splitmix64 mix of (seed, turn): the
    same (prompt, seed) gives the same response however requests are grouped or ordered."""
    if turn == 0:
        return seed
    z = (seed + turn * 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (z ^ (z >> 31)) & SEED_MASK


@dataclass(frozen=True)
class TurnLimits:
    max_new_tokens: int  # tokens of one response, model and observation tokens together
    max_tool_calls: int
    tool_output_tokens: int

    @classmethod
    def of(cls, settings: ToolSettings, max_new_tokens: int) -> TurnLimits:
        return cls(max_new_tokens, settings.max_tool_calls, settings.tool_output_tokens)


@dataclass
class Segment:
    token_ids: list[int]
    from_model: bool
    logprobs: list[float] | None = None  # model segments only, when the sampler gave them


@dataclass
class ToolStats:
    """One response's use of tools, for the step metrics and the eval report."""

    calls: int = 0  # blocks run
    errors: int = 0  # blocks that failed other than by time-out (an exception, the memory limit, a signal)
    timeouts: int = 0
    over_limit: int = 0  # blocks written after the call limit (not run)
    observation_tokens: int = 0
    tool_seconds: float = 0.0  # wall-clock seconds of the sandbox runs


def response_layout(segments: Sequence[Segment]) -> tuple[list[int], list[int], list[int]]:
    """(token ids, loss mask, positions of the model tokens) of one response's segments."""
    token_ids, mask = [], []
    for segment in segments:
        token_ids += segment.token_ids
        mask += [int(segment.from_model)] * len(segment.token_ids)
    return token_ids, mask, [position for position, keep in enumerate(mask) if keep]


def response_logprobs(segments: Sequence[Segment]) -> list[float] | None:
    """The sampler's log-probs at every position of the response (0.0 on observation tokens, which
    the mask leaves out), or None when a model segment came without them."""
    values = []
    for segment in segments:
        if not segment.from_model:
            values += [0.0] * len(segment.token_ids)
        elif segment.logprobs is None:
            return None
        else:
            values += segment.logprobs
    return values


def response_text(segments: Sequence[Segment], decode: Callable[[list[int]], str]) -> tuple[str, list[tuple[int, int]]]:
    """(the response's text, the character spans of its observations in it): each segment decoded
    on its own and joined, so the spans are exact (Rollouts.observation_spans; graders read the
    text without them, Rollouts.answer_texts)."""
    text, spans = "", []
    for segment in segments:
        piece = decode(segment.token_ids)
        if not segment.from_model:
            spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


@dataclass
class ToolResponse:
    """One response sampled with tools."""

    segments: list[Segment] = field(default_factory=list)
    stats: ToolStats = field(default_factory=ToolStats)
    # The engine ended the last turn (EOS or the token budget), rather than the loop after an
    # observation that filled the budget.
    finished: bool = False
    turns: int = 0  # engine calls so far
    policy_version: int | None = None  # the oldest policy version among its turns, where the engine says

    @property
    def length(self) -> int:
        return sum(len(segment.token_ids) for segment in self.segments)

    def layout(self) -> tuple[list[int], list[int], list[int]]:
        return response_layout(self.segments)

    def logprobs(self) -> list[float] | None:
        return response_logprobs(self.segments)

    def text(self, decode: Callable[[list[int]], str]) -> tuple[str, list[tuple[int, int]]]:
        return response_text(self.segments, decode)

    def ended_on(self, stop_ids) -> bool:
        """Whether the model ended it on one of `stop_ids` (its last turn finished on one), rather than
        the token budget or an observation that filled it: what the trainer and the eval call not
        truncated."""
        ids = self.model_ids_since_observation()
        return self.finished and bool(ids) and ids[-1] in stop_ids

    def model_ids_since_observation(self) -> list[int]:
        last = self.segments[-1] if self.segments else None
        return last.token_ids if last is not None and last.from_model else []

    def add_model(self, turn: Turn) -> None:
        self.turns += 1
        if turn.policy_version is not None:
            versions = [v for v in (self.policy_version, turn.policy_version) if v is not None]
            self.policy_version = min(versions)
        logprobs = None if turn.logprobs is None else list(turn.logprobs)
        last = self.segments[-1] if self.segments else None
        if last is not None and last.from_model:  # a pause that was no block: the same model segment goes on
            last.token_ids = last.token_ids + list(turn.token_ids)
            last.logprobs = None if last.logprobs is None or logprobs is None else last.logprobs + logprobs
        else:
            self.segments.append(Segment(list(turn.token_ids), True, logprobs))

    def add_observation(self, token_ids: list[int]) -> None:
        self.segments.append(Segment(token_ids, False))
        self.stats.observation_tokens += len(token_ids)


class ToolRuntime:
    """What the loop needs besides the engine: the tokenizer (encode/decode as in transformers),
    the block formats and a Python session per response, run in parallel sandboxed processes."""

    def __init__(self, tokenizer, settings: ToolSettings, workers: int | None = None):
        self.tokenizer, self.settings, self.workers = tokenizer, settings, workers
        self.stop_strings = stop_strings(settings.code_tags)

    def new_session(self) -> PythonSession:
        return PythonSession(time_limit_s=self.settings.tool_time_limit_s)

    def find_block(self, token_ids: list[int]) -> str | None:
        return closed_block(self.tokenizer.decode(token_ids), self.settings.code_tags)

    def run(self, calls: list[tuple[PythonSession, str]]) -> list[CallResult]:
        return run_blocks(calls, self.workers) if calls else []

    def observation_ids(self, model_ids: list[int], output: str, output_tokens: int) -> list[int]:
        text = observation_text(self.tokenizer.decode(model_ids), cut_to_tokens(output, self.tokenizer, output_tokens))
        return self.tokenizer.encode(text, add_special_tokens=False)


def sample_with_tools(generate_turn: GenerateTurn, prompts: Sequence[list[int]], runtime: ToolRuntime,
                      limits: TurnLimits, seeds: Sequence[int] | None = None,
                      any_process: Callable[[bool], bool] | None = None) -> list[ToolResponse]:
    """Sample one response per prompt (token ids), running its code blocks as they close; `seeds`:
    one per response (None: 0, 1, ...), each turn drawn from turn_seed(seed, turn); `any_process`:
    the training processes' agreement (the module docstring; None: this process alone)."""
    any_process = any_process or (lambda flag: flag)
    seeds = list(range(len(prompts))) if seeds is None else list(seeds)
    responses = [ToolResponse() for _ in prompts]
    sessions = [runtime.new_session() for _ in prompts]
    tools_open = [True] * len(prompts)  # closed once a block past the call limit got its note
    live = list(range(len(prompts)))
    while any_process(bool(live)):
        # One engine call per set of stop strings: responses whose tools are closed run to the end.
        for with_tools in (True, False):
            group = [i for i in live if tools_open[i] == with_tools]
            if not any_process(bool(group)):
                continue
            contexts = [list(prompts[i]) + responses[i].layout()[0] for i in group]
            budgets = [limits.max_new_tokens - responses[i].length for i in group]
            turns = generate_turn(contexts, budgets, runtime.stop_strings if with_tools else [],
                                  [turn_seed(seeds[i], responses[i].turns) for i in group])
            for i, turn in zip(group, turns, strict=True):
                responses[i].add_model(turn)
                responses[i].finished = turn.finished
                if turn.finished or not turn.token_ids or not with_tools:
                    live.remove(i)  # ended, stalled, or sampled to the end without tools
        calls, callers = [], []
        for i in list(live):
            response = responses[i]
            if response.length >= limits.max_new_tokens:
                live.remove(i)
                continue
            source = runtime.find_block(response.model_ids_since_observation())
            if source is None:
                continue  # paused at a stop string that closed no code block: sample on
            if response.stats.calls >= limits.max_tool_calls:
                response.stats.over_limit += 1
                tools_open[i] = False
                _observe(response, runtime, limit_note(limits.max_tool_calls), limits)
            else:
                calls.append((sessions[i], source))
                callers.append(i)
        for i, result in zip(callers, runtime.run(calls)):
            stats = responses[i].stats
            stats.calls += 1
            stats.timeouts += result.timed_out
            stats.errors += result.failed and not result.timed_out
            stats.tool_seconds += result.seconds
            _observe(responses[i], runtime, result.output, limits)
        live = [i for i in live if responses[i].length < limits.max_new_tokens]
    return responses


def _observe(response: ToolResponse, runtime: ToolRuntime, output: str, limits: TurnLimits) -> None:
    """Append the observation, cut to the response's remaining token budget."""
    ids = runtime.observation_ids(response.model_ids_since_observation(), output, limits.tool_output_tokens)
    response.add_observation(ids[: limits.max_new_tokens - response.length])
