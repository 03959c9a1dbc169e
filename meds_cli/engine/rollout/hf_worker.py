"""The `hf-worker` rollout engine: the `hf` engine's decode loop in a worker process of its own,
with its own copy of the policy, so that sampling can overlap the trainer's update
(`rollout.max_staleness`, engine/rollout/pipeline.py) without vLLM.

The worker is started (spawned) with the trainer's model as it is when the engine is built
(saved once under the run's scratch folder, read and deleted by the worker): the same module,
adapter and weights, so version 0 needs no push. After each training step the trainer sends the
parameters it trains (the adapter with LoRA, every weight without), copied so that the update
after the push cannot reach them; the worker loads them before its next job. Jobs and weights go
through one queue, so the worker sees them in the order they were sent: a job samples from the
newest weights sent before it.

It decodes under the trainer's autocast (`autocast`: the accelerator's mixed_precision) on
`rollout.worker.cores` where given (its torch threads: one per core), else on the trainer's
thread count; the same seeds then give the same tokens as the colocated `hf` engine.
A worker that dies ends the run in one line (RolloutEngineGone).

With several training processes (DDP) each has a worker of its own, which samples that process's
share of the prompts; the processes hold the same weights after each step, so each sends its own
worker the same push, and `rollout.worker.cores` is dealt out among them (`cores_of_process`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from meds_cli.core.errors import UserError
from meds_cli.core.fields import Check, doc
from meds_cli.engine.rollout.pipeline import RUN_ENDS, JobResult, RolloutEngineGone, spans_since
from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
from meds_cli.engine.rollout.weight_sync import full_tensor

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
POLL_S = 0.2  # how often a wait looks whether the worker still lives


def cores_valid(text: str) -> bool:
    try:
        parse_cores(text)
    except ValueError:
        return False
    return True


CORES = Check(cores_valid, "a list of CPU numbers such as 1 or 0,2 or 2-5")


@dataclass
class WorkerConfig:
    """The `rollout.worker` config section (the hf-worker engine)."""

    cores: str | int = doc("", "CPU cores the worker runs on, as taskset lists them ('1', '0,2', '2-5'; '': the "
                               "trainer's, with its thread count); several training processes: a block each", CORES)


def parse_cores(text: str) -> list[int]:
    """CPU numbers from '1', '0,2' or '2-5' (taskset's list form); [] for ''."""
    cores: list[int] = []
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        first, _, last = part.partition("-")
        cores.extend(range(int(first), int(last or first) + 1))
    return cores


def cores_of_process(cores: list[int], rank: int, world: int) -> list[int]:
    """This process's worker's share of `cores` (consecutive blocks, one per process); [] for []."""
    if not cores:
        return []
    if len(cores) < world:
        raise UserError(f"rollout.worker.cores lists {len(cores)} core(s) for {world} training processes, each with "
                        f"a worker of its own: list at least {world}, or '' for the trainer's")
    return cores[rank * len(cores) // world:(rank + 1) * len(cores) // world]


def trained_weights(model) -> dict[str, torch.Tensor]:
    """The parameters the optimizer changes, as CPU copies (full tensors under FSDP2)."""
    return {name: full_tensor(p).cpu().clone() for name, p in model.named_parameters() if p.requires_grad}


_HOOK_TABLES = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
                "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")


@contextmanager
def _hooks_set_aside(model):
    """The model's module hooks, and the handles modules keep to them, set aside while it is saved
    for the worker, then put back. Hooks the trainer added (gradient checkpointing's on the input
    embeddings, a closure whose handle the model keeps) cannot be pickled, and the worker's no-grad
    decode has no use for them."""
    from torch.utils.hooks import RemovableHandle

    def handles(value) -> bool:  # a handle, or a list of them (transformers keeps _require_grads_hooks)
        items = value if isinstance(value, (list, tuple)) else [value]
        return bool(items) and all(isinstance(item, RemovableHandle) for item in items)

    kept = []
    for module in model.modules():
        kept += [(module, name, value) for name, value in vars(module).items()
                 if (name in _HOOK_TABLES and value) or handles(value)]
    for module, name, value in kept:
        setattr(module, name, type(value)() if isinstance(value, (dict, list, tuple)) else None)
    try:
        yield
    finally:
        for module, name, value in kept:
            setattr(module, name, value)


# ---------------------------------------------------------------- the messages between trainer and worker
# (through the two queues; module-level classes, so that the spawned worker unpickles them)


@dataclass(frozen=True)
class Weights:  # trainer -> worker: the trained weights of policy version `version`
    version: int
    weights: dict


@dataclass(frozen=True)
class Generate:  # trainer -> worker: a job, sampled after the weights sent before it
    ticket: int
    requests: list
    settings: SamplingSettings


@dataclass(frozen=True)
class Stop:  # trainer -> worker: stop after the current job
    pass


@dataclass(frozen=True)
class Ready:  # worker -> trainer: the model is loaded
    pid: int


@dataclass(frozen=True)
class Started:  # worker -> trainer: job `ticket` began at `at` (time.monotonic)
    ticket: int
    at: float


@dataclass(frozen=True)
class Done:  # worker -> trainer: job `ticket`'s samples, from policy version `version`
    ticket: int
    samples: list
    version: int
    started: float
    ended: float


@dataclass(frozen=True)
class Failed:  # worker -> trainer: the worker stops on this error (its traceback is on its stderr)
    error: str


def _worker_main(model_path: str, pad_token_id: int, batch_size: int, autocast: str, threads: int,
                 cores: list[int], jobs, results, tokenizer=None) -> None:
    """The worker process: load the model, then serve weights and jobs in order until told to stop."""
    from contextlib import nullcontext

    from meds_cli.engine.rollout.hf_sampler import HFEngine

    try:
        if cores:
            os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads)
        model = torch.load(model_path, weights_only=False)
        os.remove(model_path)
        model.eval()
        engine = HFEngine(model, pad_token_id, batch_size, tokenizer=tokenizer)
        device = next(model.parameters()).device.type
        dtype = AUTOCAST_DTYPES.get(autocast)
        version = 0
        results.put(Ready(os.getpid()))
        params = dict(model.named_parameters())
        while True:
            message = jobs.get()
            if isinstance(message, Stop):
                return
            if isinstance(message, Weights):
                version = message.version
                with torch.no_grad():
                    for name, tensor in message.weights.items():
                        params[name].copy_(tensor)
                continue
            started = time.monotonic()
            results.put(Started(message.ticket, started))
            with torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext():
                samples = engine.generate(message.requests, message.settings)
            results.put(Done(message.ticket, samples, version, started, time.monotonic()))
    except Exception as err:  # said by the trainer in one line; the traceback is the worker's stderr
        import traceback

        traceback.print_exc()
        results.put(Failed(f"{type(err).__name__}: {err}"))


class HFWorkerEngine:
    """See the module docstring (a SeparateEngine of engine/rollout/pipeline.py)."""

    name = "hf-worker"
    records_lens = False
    reads_policy_weights = False
    starts_with_policy = True  # spawned with the trainer's model: version 0 is there
    keeps_versions = True  # any version's trained weights can be sent to it

    def __init__(self, model, pad_token_id: int, batch_size: int, *, scratch_dir: Path, autocast: str = "no",
                 cores: Sequence[int] = (), start_timeout_s: float = 300.0, tokenizer=None):
        """`tokenizer`: sent to the worker once, for the stop strings of tool turns (SamplingSettings)."""
        import torch.multiprocessing as mp

        self.model = model
        scratch_dir = Path(scratch_dir)
        scratch_dir.mkdir(parents=True, exist_ok=True)
        model_path = scratch_dir / f"hf-worker-model-{os.getpid()}.pt"
        with _hooks_set_aside(model):  # the module itself: architecture, adapter and weights
            torch.save(model, model_path)
        context = mp.get_context("spawn")
        self.jobs, self.results = context.Queue(), context.Queue()
        threads = len(cores) if cores else torch.get_num_threads()
        self.process = context.Process(
            target=_worker_main, daemon=True, name="meds-hf-worker",
            args=(str(model_path), pad_token_id, batch_size, autocast, threads, list(cores), self.jobs, self.results,
                  tokenizer))
        self.process.start()
        self.tickets = 0
        self.done: dict[int, Done] = {}
        self.forgotten: set[int] = set()
        self.times: dict[int, list] = {}  # ticket -> [started, ended or None]
        message = self._next_message(timeout_s=start_timeout_s, doing="starting")
        if not isinstance(message, Ready):
            raise RuntimeError(f"the rollout worker said {message!r} before it was ready")
        model_path.unlink(missing_ok=True)
        self.scratch_dir = scratch_dir

    # ------------------------------------------------------------ SeparateEngine

    def push_policy(self, version: int, weights: dict | None = None) -> None:
        weights = trained_weights(self.model) if weights is None else weights
        self._check_alive("receiving weights")
        self.jobs.put(Weights(version, weights))

    def submit(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> int:
        self._check_alive("taking a job")
        self.tickets += 1
        self.jobs.put(Generate(self.tickets, list(requests), settings))
        return self.tickets

    def result(self, ticket: int) -> JobResult:
        while ticket not in self.done:
            self._take(self._next_message(timeout_s=None, doing="sampling"))
        done = self.done.pop(ticket)
        for group in done.samples:
            for sample in group:
                sample.source = self._describe()  # named where a sample is refused (rollout_check.py)
        return JobResult(done.samples, done.version, done.started, done.ended)

    def job_times(self, since: float) -> list[tuple[float, float | None]]:
        while True:  # what the worker said so far, without waiting
            try:
                message = self.results.get_nowait()
            except queue.Empty:
                break
            self._take(message)
        self.times = spans_since(self.times, since)
        return [(a, b) for a, b in self.times.values()]

    def forget(self, ticket: int) -> None:
        self.done.pop(ticket, None)
        self.forgotten.add(ticket)

    def take_retries(self) -> int:
        return 0  # a job it takes is sampled once: nothing is sent again

    def close(self) -> None:
        """Stop the worker: the jobs it has not begun are dropped (a run that ends early, on a refused
        rollout say, may have queued many: rollout.max_staleness), then it is told to stop after its
        current job, and terminated if it does not."""
        self._drop_queued_jobs()
        if self.process.is_alive():
            self.jobs.put(Stop())
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        with contextlib.suppress(OSError):  # made for the model file only: no empty scratch/ left in the run
            self.scratch_dir.rmdir()  # (only when empty: another engine's files stay)
        # What the worker never read stays in the pipe: the queue's feeder thread must not wait at
        # exit to write it to a pipe nobody reads (the process would never exit).
        self.jobs.cancel_join_thread()
        self.results.cancel_join_thread()

    def _drop_queued_jobs(self) -> None:
        """Take back the messages the worker has not read (this process holds the queue's other end)."""
        while True:
            try:
                self.jobs.get(timeout=0.05)
            except queue.Empty:
                return
            except (OSError, ValueError, EOFError):  # a queue already closed
                return

    # ------------------------------------------------------------ internals

    def _take(self, message) -> None:
        if isinstance(message, Started):
            self.times[message.ticket] = [message.at, None]
        elif isinstance(message, Done):
            self.times[message.ticket] = [message.started, message.ended]
            if message.ticket not in self.forgotten:
                self.done[message.ticket] = message
        elif isinstance(message, Failed):
            raise RolloutEngineGone(f"{self._describe()} failed: {message.error}; {RUN_ENDS}")

    def _describe(self) -> str:
        return f"the rollout worker (hf-worker, pid {self.process.pid})"

    def _check_alive(self, doing: str) -> None:
        if not self.process.is_alive():
            raise RolloutEngineGone(f"{self._describe()} died (exit code {self.process.exitcode}) before {doing}; "
                                    f"{RUN_ENDS}")

    def _next_message(self, *, timeout_s: float | None, doing: str):
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                message = self.results.get(timeout=POLL_S)
            except queue.Empty:
                if not self.process.is_alive():
                    raise RolloutEngineGone(
                        f"{self._describe()} died (exit code {self.process.exitcode}) while {doing}; "
                        f"{RUN_ENDS}") from None
                if deadline is not None and time.monotonic() > deadline:
                    self.close()
                    raise RolloutEngineGone(f"{self._describe()} was not ready after {timeout_s:g} s") from None
                continue
            if isinstance(message, Failed):
                raise RolloutEngineGone(f"{self._describe()} failed while {doing}: {message.error}; {RUN_ENDS}")
            return message
