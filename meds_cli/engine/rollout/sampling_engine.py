"""The rollout engine interface: token ids and sampling settings in, token ids (and the
sampler's own log-probs) out.

Every engine implements the one protocol, RolloutEngine: those that sample in the trainer's
process (`hf`: a decode loop over the training model itself; `vllm`: a colocated vLLM instance
that receives the policy after each optimizer step), those that run apart (`hf-worker`,
`vllm-server`), and the pipeline that puts one of these before the trainer (pipeline.py). The
trainer and the eval harness only see this interface, so the engine is a config choice
(`rollout.engine`), looked up in the registry of engines.py.

A request is one prompt and one seed per sample: a sample's randomness belongs to the sample,
not to the batch it happens to be drawn in, so the same (prompt, seed) gives the same response
however requests are grouped.

Tool-integrated reasoning (engine/rollout/tools/) samples a response turn by turn: the settings
then carry `stop_strings` (a sample pauses after the first of them, the string kept in its tokens:
`Sample.paused`) and each request its own token budget (`SampleRequest.max_new_tokens`: what is
left of the response's), so that one call serves every response of a round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, Sequence

from meds_cli.core.forward import LensProbe
from meds_cli.engine.rollout.tools.settings import ToolSettings


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float  # 0: greedy
    top_p: float
    max_new_tokens: int
    stop_ids: tuple[int, ...]  # a response ends after the first of these (kept in the response)
    min_new_tokens: int = 0  # stop ids are refused before this many tokens (benchmarks force lengths)
    lens: LensProbe | None = None  # values to record per sampled token (engines with records_lens)
    # a sample pauses after the first of these strings in the text it sampled (kept in its tokens:
    # Sample.paused); tool-integrated reasoning's code-block ends (tools/blocks.py stop_strings)
    stop_strings: tuple[str, ...] = ()
    # rollout.tools and its limits: batch.py then samples turn by turn, running code blocks between
    # turns (tools/turn_loop.py); an engine is always asked without them (tool_turns.turn_settings)
    tools: ToolSettings | None = None


SEED_LIMIT = 2**62  # a sample's seed is below it


@dataclass(frozen=True)
class SampleRequest:
    prompt_ids: tuple[int, ...]  # the prompt as the model sees it: no BOS added by the engine
    seeds: tuple[int, ...]  # one per sample: len(seeds) responses are drawn
    max_new_tokens: int | None = None  # this request's token budget, at most the settings' (None: theirs)

    @property
    def n(self) -> int:
        return len(self.seeds)

    def budget(self, settings: SamplingSettings) -> int:
        """New tokens this request's samples may take."""
        return settings.max_new_tokens if self.max_new_tokens is None else min(self.max_new_tokens,
                                                                               settings.max_new_tokens)


def split_by_request(requests: Sequence[SampleRequest], flat: list) -> list[list]:
    """`flat`, one item per sample with the requests' samples in order, as one list per request
    (the shape engines return: the samples of requests[i] at [i], in seed order)."""
    out, start = [], 0
    for request in requests:
        out.append(flat[start:start + request.n])
        start += request.n
    return out


@dataclass
class Sample:
    token_ids: list[int]  # the response, its stop token included when it stopped
    stopped: bool  # ended on a stop id (False: cut at max_new_tokens, or paused)
    logprobs: list[float] | None = field(default=None)  # the sampler's log-prob of each token, where it has them
    lens: Any = field(default=None)  # torch.Tensor [tokens, len(layers)] of settings.lens, where recorded
    policy_version: int | None = field(default=None)  # the policy version that sampled it (engines apart: pipeline.py)
    source: str | None = field(default=None)  # who sampled it (a server, a worker): named if refused (rollout_check)
    paused: bool = field(default=False)  # ended after one of settings.stop_strings: not finished, the turn loop goes on


@dataclass(frozen=True)
class JobResult:
    """What a job returns (RolloutEngine.result): the samples per request (the layout of
    `generate`), the policy version it sampled from and when it ran (time.monotonic, the same
    clock in every process of the machine; a remote server's job is timed by the client)."""

    samples: list[list[Sample]]
    version: int
    started: float
    ended: float


def stamped(result: JobResult) -> JobResult:
    """`result` with each sample naming the policy version that sampled it (Sample.policy_version)."""
    for samples in result.samples:
        for sample in samples:
            sample.policy_version = result.version
    return result


class RolloutEngine(Protocol):
    """Every member a rollout engine may be asked for; tests/test_engine_protocol.py checks that
    every registered engine (engines.py) has them all, so nothing reads an engine through a
    getattr default.

    An engine is asked in one of two ways, and implements one of them itself, the other coming
    from a small shared base below:

      now        `generate` samples and returns. The engines in the trainer's process (hf, vllm)
                 implement it, and get the job members from SamplesInProcess (a job is sampled
                 the moment it is submitted). The trainer's rollout source (source.py) and the
                 eval harness ask this way.
      as jobs    `submit` queues requests without blocking and returns a ticket, `result` waits
                 for it, `push_policy` sends the trainer's weights as policy version v. The
                 engines apart (hf-worker, vllm-server) implement it, and get `generate` and the
                 weight pair from SamplesApart. The trainer drives them through
                 pipeline.RolloutPipeline, which overlaps their jobs with the update
                 (rollout.max_staleness) and is itself an engine asked `now`.

    The weights change in two calls, one pair: `policy_updated` after every optimizer step (cheap:
    it records that the weights changed; an engine with its own copy of the policy brings it up to
    date before it next samples), and `policy_settled(version)` once a step's update is over (the
    weights are version `version`, the steps whose update they hold). `release` frees what the
    engine holds while the trainer updates (vLLM's sleep mode); the next `generate` takes it back.
    `close` stops what the engine started (a worker, a server); nothing for one that lives and
    ends with this process."""

    # ---- what it is
    name: str
    records_lens: bool  # honours SamplingSettings.lens
    # samples from the training model's own parameters (hf), so a sharded policy is gathered for it;
    # False for an engine with its own copy (vLLM, an engine apart), which is sent the weights instead
    reads_policy_weights: bool
    starts_with_policy: bool  # it holds the trainer's initial weights (version 0) from the start
    keeps_versions: bool  # it can be pushed an earlier version's weights (a resumed job's); False: the live ones only

    # ---- sampling now
    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]: ...

    def policy_updated(self) -> None: ...

    def policy_settled(self, version: int) -> None: ...

    def release(self) -> None: ...

    # ---- sampling as jobs, each from the newest weights pushed when it begins, in submission order
    def submit(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> object: ...

    def result(self, ticket) -> JobResult: ...

    # weights: the trained parameters of `version` (a resubmitted job's, kept in a checkpoint); None: the model's now
    def push_policy(self, version: int, weights: dict | None = None) -> None: ...

    def forget(self, ticket) -> None: ...  # its result is not wanted (a prefetch no step asked for)

    # (started, ended or None while it runs) of every job that ran after `since`, as known now
    def job_times(self, since: float) -> list[tuple[float, float | None]]: ...

    def take_retries(self) -> int: ...  # requests sent again since the last call (0 where nothing retries)

    # ---- the end
    def close(self) -> None: ...


@dataclass
class _Jobs:
    """What SamplesInProcess keeps: the version last pushed, and the spans of its jobs."""

    version: int = 0
    spans: dict[int, tuple[float, float]] = field(default_factory=dict)


class SamplesInProcess:
    """The job members of RolloutEngine for an engine that samples in the trainer's process: a
    job is sampled when it is submitted, from the weights of then, so its ticket is its result.
    Pushing a version is the weight pair: the engine follows the trainer's live weights."""

    starts_with_policy = True  # it samples the live weights (hf), or is brought up to date before it samples (vllm)
    keeps_versions = False  # the live weights only

    @cached_property
    def _jobs(self) -> _Jobs:
        return _Jobs()  # made on first use, so that the engine's own __init__ stays as it is

    def submit(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> JobResult:
        jobs = self._jobs
        started = time.monotonic()
        samples = self.generate(requests, settings)
        ended = time.monotonic()
        jobs.spans[len(jobs.spans)] = (started, ended)
        return JobResult(samples, jobs.version, started, ended)

    def result(self, ticket: JobResult) -> JobResult:
        return ticket

    def push_policy(self, version: int, weights: dict | None = None) -> None:
        if weights is not None:
            raise ValueError(f"the {self.name} engine samples the trainer's live weights: an earlier version's "
                             "cannot be pushed to it (keeps_versions is False)")
        self.policy_updated()
        self.policy_settled(version)
        self._jobs.version = version

    def forget(self, ticket: JobResult) -> None:
        """Nothing to drop: the job was sampled when submitted, and its ticket holds it."""

    def job_times(self, since: float) -> list[tuple[float, float | None]]:
        jobs = self._jobs
        jobs.spans = {ticket: span for ticket, span in jobs.spans.items() if span[1] > since}
        return list(jobs.spans.values())

    def take_retries(self) -> int:
        return 0  # a request is sampled once


class SamplesApart:
    """`generate`, the weight pair and `release` for an engine that runs apart, whose own members
    are the jobs: `generate` is one job, waited for; the settled weights are pushed at once.
    (pipeline.RolloutPipeline, which drives such an engine in training, pushes them lazily,
    before the next job, and overlaps jobs with the update.)"""

    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]:
        return stamped(self.result(self.submit(requests, settings))).samples

    def policy_updated(self) -> None:
        """Nothing yet: its copy of the weights is sent when the update is over (policy_settled)."""

    def policy_settled(self, version: int) -> None:
        self.push_policy(version)

    def release(self) -> None:
        """Nothing to free: it holds nothing of the trainer's devices."""


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end a response: the tokenizer's EOS and the end-of-turn tokens of chat
    templates (SmolLM2 and Qwen: <|im_end|>; Llama 3: <|eot_id|>), which may differ from EOS."""
    ids = {tokenizer.eos_token_id}
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
        if token in vocab:
            ids.add(vocab[token])
    return tuple(sorted(i for i in ids if i is not None))
