"""Rollouts from an engine that runs apart from the trainer (the `hf-worker` process, a vLLM
server), and the bounded off-policy steps that let its sampling overlap the trainer's update
(`rollout.max_staleness: k`).

An engine apart takes jobs without blocking (the job members of sampling_engine.RolloutEngine):
`submit` queues a batch of requests and returns a ticket, `result` waits for it, `push_policy`
sends it the trainer's weights as policy version v (the training steps whose update it holds). It
samples its jobs in the order they were submitted, each from the newest weights it had when the
job began, and says which version that was and when it ran.

`RolloutPipeline` puts one in front of the trainer as an engine asked `now` (`generate` waits for
its requests' result), plus `prefetch`:
with k >= 1 the rollout source submits the first sampling round of each of the next k steps before it
updates (the same prompts and per-sample seeds those steps would draw: source.py), and when a
step asks for exactly those requests `generate` returns the job sampled meanwhile. A step t
trains on weights of version t - 1; a rollout sampled from version v is (t - 1) - v steps stale,
at most k by construction (a prefetched job is submitted at step t with version t - 1 already
pushed, for a step at most t + k), and a job staler than k would be sampled again, never trained on.
At k = 0 nothing is prefetched: every generate pushes the newest weights first and waits, the
synchronous run of today.

Every sample records the version that sampled it (Sample.policy_version, then
Rollouts.sampler_version). Per step the pipeline reports the time the trainer waited for
rollouts, the time the sampler sat idle (between jobs: waiting for work or for weights), and the
share of the step during which both computed.

Several training processes (training_processes.py): each has its own pipeline and engine, and
they call `generate`, `prefetch` and `step_metrics` in the same order, so each call ends with one
agreement on whether any process's engine failed; every process then ends in one line.

In flight at a checkpoint (k >= 1): `in_flight` gives the jobs submitted and not yet taken (the
step each is for, the policy version it samples from, its requests) and, where the pipeline was
given a `snapshot` of the trained weights (LoRA: the adapter, small), the weights of those
versions, kept from when they were pushed; `resubmit` sends them again to a fresh engine on
resume, each from its own version's weights, so the resumed run samples what the uninterrupted
one did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from meds_cli.core.errors import UserError
from meds_cli.engine.rollout.sampling_engine import (
    JobResult,
    RolloutEngine,
    Sample,
    SampleRequest,
    SamplesInProcess,
    SamplingSettings,
    stamped,
)
from meds_cli.engine.rollout.training_processes import ONE_PROCESS, TrainingProcesses

RUN_ENDS = "the run stops here, its last checkpoint kept"  # how a RolloutEngineGone line ends


class RolloutEngineGone(UserError):
    """The engine apart died or never became ready: the run ends in this one line (after the last
    checkpoint, which stays as it was)."""


# ---------------------------------------------------------------- pure functions (tested by hand)


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals joined where they overlap or touch, sorted; empty ones dropped."""
    out: list[list[float]] = []
    for start, end in sorted((a, b) for a, b in intervals if b > a):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def covered(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of `window` that `intervals` cover (each counted once)."""
    lo, hi = window
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in merged(intervals))


def overlap_share(sampler_busy: list[tuple[float, float]], trainer_waiting: list[tuple[float, float]],
                  window: tuple[float, float]) -> float:
    """The share of `window` (a step) during which the sampler computed while the trainer did
    not wait for it: |sampler busy within the step| - |sampler busy while the trainer waited|,
    over the step's length. (While the trainer waits for a job, it is idle, so a job it waits for
    does not overlap training.)"""
    length = window[1] - window[0]
    if length <= 0:
        return 0.0
    busy = merged(sampler_busy)
    both = covered(busy, window) - sum(covered(busy, (max(a, window[0]), min(b, window[1])))
                                       for a, b in merged(trainer_waiting) if b > a)
    return max(0.0, both) / length


def idle_between(jobs: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of `window` after the first job began during which the sampler ran no job: the
    time it waited for work or weights (before its first job it had nothing to wait for)."""
    busy = merged(jobs)
    if not busy:
        return 0.0
    start = max(window[0], busy[0][0])
    if window[1] <= start:
        return 0.0
    return (window[1] - start) - covered(busy, (start, window[1]))


def spans_since(spans: dict, since: float) -> dict:
    """An engine's job spans ({ticket: [started, ended or None]}) still of interest to a step that
    began at `since`: those running and those that ended after it."""
    return {ticket: span for ticket, span in spans.items() if span[1] is None or span[1] > since}


def staleness(versions: Sequence[int], current: int) -> list[int]:
    """Steps each rollout's policy is behind `current` (the version the trainer updates)."""
    return [current - v for v in versions]


# ---------------------------------------------------------------- the pipeline


@dataclass(frozen=True)
class InFlightJob:
    """A job submitted ahead and not yet taken: the step it is for, the policy version it samples
    from, and its requests (this process's share of that step's first round)."""

    step: int
    version: int
    requests: tuple[SampleRequest, ...]


@dataclass
class _Pending:
    key: tuple
    ticket: object
    job: InFlightJob


class RolloutPipeline(SamplesInProcess):
    """An engine apart as the trainer's rollout engine (see the module docstring). `processes`:
    the training processes, which agree on failures; `snapshot`: the trained weights as CPU
    copies (given where they are small: LoRA), kept per pushed version while a job samples from
    it, so that a checkpoint can hold them (`in_flight`). To its caller it is an engine like
    those of the trainer's process: a job submitted to it is sampled (`generate`) at once."""

    records_lens = False  # a LensProbe holds hooks on the trainer's model: not sent to another process

    def __init__(self, engine: RolloutEngine | None, max_staleness: int = 0, clock=time.monotonic, *,
                 processes: TrainingProcesses = ONE_PROCESS,
                 snapshot: Callable[[], dict] | None = None):
        # `clock`: the engine's job times are on it (time.monotonic)
        self.engine, self.max_staleness, self.clock = engine, max_staleness, clock
        self.processes, self.snapshot = processes, snapshot
        self.kept: dict[int, dict] = {}  # version -> its trained weights, while an in-flight job samples from it
        self.reads_policy_weights = False
        self.version = 0  # training steps whose update the trainer's weights hold
        self.pending: list[_Pending] = []
        self.waits: list[tuple[float, float]] = []  # the trainer waiting for results, this step
        self.sampled_again = 0
        if engine is not None:
            self._use(engine)

    def start(self, build: Callable[[], RolloutEngine]) -> None:
        """Build the engine (`build()`) on every process, agreeing on a failure to start (where
        another process's failed, this one's engine is stopped)."""
        try:
            self._agreed(lambda: self._use(build()))
        except RolloutEngineGone:
            self.close()
            raise

    def _use(self, engine: RolloutEngine) -> None:
        self.engine, self.name = engine, engine.name
        if not engine.keeps_versions:
            self.snapshot = None  # it sends its live weights only (a server sent full weights): nothing to keep
        # the version the engine was last sent: 0 where it starts from the trainer's initial weights
        # (the hf worker is handed the model), else -1: sent before its first job
        self.pushed = 0 if engine.starts_with_policy else -1

    @property
    def newest_version(self) -> int:
        """The newest policy version there is (the trainer's): a sample naming a later one is refused
        (rollout_check.py)."""
        return self.version

    # ------------------------------------------------------------ the trainer's calls

    def policy_updated(self) -> None:
        """An optimizer step: the weights the engine holds are behind until `policy_settled`."""

    def policy_settled(self, version: int) -> None:
        """A step's update is done: the trainer's weights are version `version`, sent with the next job."""
        self.version = version

    def release(self) -> None:
        """Nothing to free: the engine holds no memory of the trainer's devices."""

    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]:
        return self._agreed(lambda: self._generate(requests, settings))

    def _generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]:
        key = _key(requests, settings)
        for index, pending in enumerate(self.pending):
            if pending.key == key:
                del self.pending[index]
                self._forget_unused_weights()
                result = self._wait(pending.ticket)
                if self.version - result.version <= self.max_staleness:
                    return result.samples
                self.sampled_again += 1  # staler than allowed: never trained on
                break
        return self._wait(self._submit(requests, settings)).samples

    def prefetch(self, requests: Sequence[SampleRequest], settings: SamplingSettings, step: int) -> None:
        """Submit `requests` (the first round of step `step`) now; a later `generate` of the same
        requests takes their result."""
        if self.max_staleness < 1:
            raise ValueError("prefetching needs rollout.max_staleness >= 1")
        self._agreed(lambda: self._prefetch(tuple(requests), settings, step))

    def _prefetch(self, requests: tuple[SampleRequest, ...], settings: SamplingSettings, step: int) -> None:
        ticket = self._submit(requests, settings)
        self.pending.append(_Pending(_key(requests, settings), ticket, InFlightJob(step, self.pushed, requests)))

    def prefetched_steps(self) -> set[int]:
        return {p.job.step for p in self.pending}

    def forget_through(self, step: int) -> int:
        """Drop what was prefetched for steps up to `step` and not asked for (a step that drew other
        prompts than planned, as after DAPO's extra rounds): it is never trained on. Returns how
        many jobs were dropped."""
        dropped = [p for p in self.pending if p.job.step <= step]
        for pending in dropped:
            self.engine.forget(pending.ticket)
            self.pending.remove(pending)
        self._forget_unused_weights()
        return len(dropped)

    # ------------------------------------------------------------ in flight at a checkpoint

    def in_flight(self) -> tuple[list[InFlightJob], dict[int, dict] | None]:
        """The jobs submitted and not yet taken, in order, and the trained weights of the versions
        they sample from (None where the pipeline keeps none: full weights)."""
        jobs = [p.job for p in self.pending]
        if self.snapshot is None:
            return jobs, None
        return jobs, {job.version: self.kept[job.version] for job in jobs}

    def resubmit(self, jobs: Sequence[InFlightJob], weights: dict[int, dict] | None,
                 settings: SamplingSettings) -> None:
        """On resume, after `policy_settled` of the loaded step: submit `jobs` again (read from the
        checkpoint), each from its version's `weights`, in their order; the loaded weights are
        pushed before the next job, as in the uninterrupted run. Without `weights` (not kept: full
        weights) nothing is submitted: those steps sample from the loaded weights."""
        # every process pushes and submits as many: a record edited on one process would misalign them
        shape = [len(jobs), sum(job.step for job in jobs), sum(job.version for job in jobs), weights is not None]
        agreed = [self.processes.min(int(value)) == -self.processes.min(-int(value)) for value in shape]
        if not all(agreed):
            raise UserError("the checkpoint's records of the sampling in flight (in_flight_<rank>.json) differ between "
                            "processes; resume from another checkpoint (--step N) or start a new run")
        if weights is None:
            return

        def send():
            for job in jobs:
                if self.pushed != job.version:
                    self.engine.push_policy(job.version, weights[job.version])
                    self.pushed = job.version
                ticket = self.engine.submit(job.requests, settings)
                self.pending.append(_Pending(_key(job.requests, settings), ticket, job))
        self._agreed(send)
        if self.snapshot is not None:
            self.kept.update(weights)

    def step_metrics(self, window: tuple[float, float]) -> dict[str, float]:
        """The step's waiting and overlap (the module docstring), then a fresh record for the next."""
        return self._agreed(lambda: self._step_metrics(window))

    def _step_metrics(self, window: tuple[float, float]) -> dict[str, float]:
        jobs = [(a, window[1] if b is None else b) for a, b in self.engine.job_times(window[0])]
        row = {
            "time_wait_rollouts_s": sum(b - a for a, b in self.waits),
            "time_sampler_idle_s": idle_between(jobs, window),
            "overlap_share": overlap_share(jobs, self.waits, window),
            "rollouts_in_flight": float(len(self.pending)),
        }
        if self.sampled_again:
            row["rollouts_sampled_again"] = float(self.sampled_again)
        row["rollout/retries"] = float(self.engine.take_retries())  # requests sent again (rollout.server.retries)
        self.waits, self.sampled_again = [], 0
        return row

    def close(self) -> None:
        self.pending = []
        if self.engine is not None:
            self.engine.close()

    # ------------------------------------------------------------ internals

    def _submit(self, requests, settings):
        if self.pushed != self.version:
            self.engine.push_policy(self.version)
            self.pushed = self.version
        if self.max_staleness and self.snapshot is not None and self.pushed not in self.kept:
            self.kept[self.pushed] = self.snapshot()  # the trainer's weights are version `pushed` now
        return self.engine.submit(requests, replace(settings, lens=None))

    def _forget_unused_weights(self) -> None:
        """Keep only the versions a job still in flight samples from (and the newest pushed, which
        the next job may sample from)."""
        used = {p.job.version for p in self.pending} | {self.pushed}
        self.kept = {v: w for v, w in self.kept.items() if v in used}

    def agreed(self, work):
        """work() (a check of what the engine returned: rollout_check.py) on every process, each
        ending in one line where any process's failed."""
        return self._agreed(work)

    def _agreed(self, work):
        """work() on every process, then one agreement on whether any process's engine failed:
        every process ends in one line (its own, or that another process's engine failed)."""
        failure = None
        try:
            out = work()
        except RolloutEngineGone as error:
            failure = error
        if self.processes.any(failure is not None):
            raise failure or RolloutEngineGone(f"the rollout engine of another training process failed (its "
                                               f"own line says how); {RUN_ENDS}")
        return out

    def _wait(self, ticket) -> JobResult:
        t0 = self.clock()
        result = self.engine.result(ticket)
        self.waits.append((t0, self.clock()))
        return stamped(result)


def _key(requests: Sequence[SampleRequest], settings: SamplingSettings) -> tuple:
    """What makes two asks the same job: every prompt, every seed and the sampling settings."""
    return tuple(requests), replace(settings, lens=None)
