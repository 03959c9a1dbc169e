"""What a rollout engine returns is input from outside the trainer, as a run folder read back is
(core/read_back.py): a server or worker may send NaN log-probs, token ids outside the vocabulary,
more tokens than were asked for, or fewer samples. Every engine's samples pass one check here
(`check_samples`, called where engine output becomes a batch: batch.sample_rollouts) before
anything is graded or trained; the vllm-server engine also checks each answer as it arrives
(`sample_fault`), so that a request can be sent again (rollout.server.retries).

A violation ends the run in one line (RolloutRefused) naming the engine, the server or worker,
the request and the first offending value, after the last checkpoint: nothing of the bad batch
is trained. The check is one pass over lists already on the host, with the common case (nothing
wrong) in C loops: min/max of the ids, the sum of the log-probs (scripts/bench_rollout_check.py
prints its cost beside building the batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from meds_cli.engine.rollout.pipeline import RUN_ENDS, RolloutEngineGone
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings

# A log-prob is <= 0; an engine computing in low precision may round one a hair above.
LOGPROB_TOLERANCE = 1e-3


class RolloutRefused(RolloutEngineGone):
    """An engine's samples failed the check: the run ends in this one line, nothing of them trained."""


@dataclass(frozen=True)
class Limits:
    """What every sample must keep to: ids below `vocab_size` (the rows the policy can score), at
    most `max_new_tokens` of them, a stop id only as the last token (and there when it stopped)."""

    vocab_size: int
    max_new_tokens: int
    stop_ids: frozenset[int]
    budget_name: str = "rollout.max_new_tokens"  # what max_new_tokens is, in a refusal

    @classmethod
    def of(cls, settings: SamplingSettings, vocab_size: int) -> "Limits":
        return cls(int(vocab_size), settings.max_new_tokens, frozenset(settings.stop_ids))

    def of_request(self, request: SampleRequest, settings: SamplingSettings) -> "Limits":
        """These limits with `request`'s own token budget, where it has one (a tool turn's)."""
        if request.max_new_tokens is None:
            return self
        return replace(self, max_new_tokens=request.budget(settings), budget_name="the request's token budget")


def sample_fault(sample: Sample, limits: Limits) -> str | None:
    """What is wrong with one sample, as the words after '... answered X with', naming the first
    offending value; None when nothing is."""
    tokens = sample.token_ids
    count = len(tokens)
    if count > limits.max_new_tokens:
        return f"{count} tokens, more than {limits.budget_name}={limits.max_new_tokens}"
    if count and (min(tokens) < 0 or max(tokens) >= limits.vocab_size):
        position, token = next((i, t) for i, t in enumerate(tokens) if not 0 <= t < limits.vocab_size)
        return (f"token id {token} at position {position}, outside the vocabulary (0..{limits.vocab_size - 1})")
    if count > 1 and not limits.stop_ids.isdisjoint(tokens[:-1]):
        position, token = next((i, t) for i, t in enumerate(tokens[:-1]) if t in limits.stop_ids)
        return f"stop id {token} at position {position}, before the response's end"
    if sample.stopped and (not count or tokens[-1] not in limits.stop_ids):
        return f"a response marked stopped whose last token ({tokens[-1] if count else 'none'}) is not a stop id"
    if sample.paused and sample.stopped:
        return "a response marked both stopped (a stop id) and paused (a stop string)"
    logprobs = sample.logprobs
    if logprobs is not None:
        if len(logprobs) != count:
            return f"{len(logprobs)} log-probs for {count} tokens"
        # NaN and infinities carry into the sum; a finite sum and max settle the common case in C
        if count and not (math.isfinite(sum(logprobs)) and max(logprobs) <= LOGPROB_TOLERANCE):
            bad = next(((i, v) for i, v in enumerate(logprobs) if not (math.isfinite(v) and v <= LOGPROB_TOLERANCE)),
                       None)
            if bad is not None:  # else a sum of huge finite values overflowed: nothing wrong
                return f"log-prob {bad[1]!r} at position {bad[0]}, not a finite number <= 0"
    # Logit-lens values come from the trainer's own model (the hf engine records them): their count
    # is checked, not their size (a probe layer's raw logits may overflow a 16-bit type, as in the
    # scoring pass that computes the same values).
    lens = sample.lens
    if lens is not None and lens.shape[0] != count:
        return f"logit-lens values for {lens.shape[0]} tokens, not {count}"
    return None


def version_fault(sample: Sample, newest: int | None) -> str | None:
    """A policy version the trainer never sent (`newest`: the newest it sent; None: not tracked)."""
    version = sample.policy_version
    if version is None or newest is None or 0 <= version <= newest:
        return None
    return f"policy version {version}, not one sent (0..{newest})"


def describe_request(request: SampleRequest, seed: int, index: int | None = None) -> str:
    where = f"request {index} " if index is not None else ""
    return f"{where}(seed {seed}, prompt of {len(request.prompt_ids)} tokens)"


def refused(engine: str, source: str | None, request: str, problem: str) -> RolloutRefused:
    """The one line of a refused rollout."""
    return RolloutRefused(f"rollout refused ({engine} engine): {source or f'the {engine} engine'} answered {request} "
                          f"with {problem}; {RUN_ENDS}")


def check_samples(engine: str, requests: Sequence[SampleRequest], samples: list[list[Sample]],
                  settings: SamplingSettings, vocab_size: int, newest_version: int | None = None) -> None:
    """Refuse (RolloutRefused) what `engine` returned for `requests` unless it is one list per
    request, one sample per seed, each keeping to Limits and naming a version that was sent."""
    if len(samples) != len(requests):
        raise refused(engine, None, f"{len(requests)} requests", f"{len(samples)} lists of samples")
    limits = Limits.of(settings, vocab_size)
    for index, (request, group) in enumerate(zip(requests, samples)):
        if len(group) != request.n:
            raise refused(engine, None, f"request {index} ({request.n} samples asked)", f"{len(group)} samples")
        own = limits.of_request(request, settings)
        for seed, sample in zip(request.seeds, group):
            problem = sample_fault(sample, own) or version_fault(sample, newest_version)
            if problem is not None:
                raise refused(engine, sample.source, describe_request(request, seed, index), problem)


def checked_samples(engine, requests: Sequence[SampleRequest], samples: list[list[Sample]],
                    settings: SamplingSettings, vocab_size: int) -> None:
    """check_samples of what `engine` returned; an engine apart (pipeline.py) agrees on the outcome
    over the training processes, so that every process ends in one line."""
    agreed = getattr(engine, "agreed", lambda work: work())
    agreed(lambda: check_samples(getattr(engine, "name", type(engine).__name__), requests, samples, settings,
                                 vocab_size, getattr(engine, "newest_version", None)))
