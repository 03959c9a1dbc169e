"""What a checkpoint of a run at `rollout.max_staleness` k >= 1 records of the sampling in flight,
so that a resume submits it again as the uninterrupted run had it (engine/rollout/pipeline.py):

  step_N/in_flight_<rank>.json   each process: the jobs submitted ahead and not yet trained on,
                                 in order: the step each is for, the policy version it samples
                                 from, its prompts (token ids) and per-sample seeds
  step_N/in_flight_policy_v<V>.safetensors
                                 process 0, with LoRA: the trained weights (the adapter) of each
                                 version V a job samples from; full weights are not kept (the
                                 previous versions of a whole model are too big), and then the
                                 resume samples those steps again from the loaded weights

    {"format": "meds-in-flight", "version": 1, "weights": "saved" | "not saved: ...",
     "jobs": [{"step": 3, "policy_version": 1,
               "requests": [{"prompt_ids": [12, 40, 7], "seeds": [431..., 977...]}, ...]}, ...]}

A checkpoint is someone else's file by the time it is read: everything is checked (types, ranges,
no key the format does not have, no step twice, no seed twice in a job, each job's prompts and
seeds those its step draws, the versions' weights present, finite, with the model's names and
shapes), and anything wrong is one line: nothing of a refused record is sampled or trained on.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import torch

from meds_cli.core.read_back import read_json, require
from meds_cli.engine.rollout.pipeline import InFlightJob
from meds_cli.engine.rollout.sampling_engine import SEED_LIMIT, SampleRequest
from meds_cli.engine.run_folders.state_codec import read_tensors

FORMAT, VERSION = "meds-in-flight", 1
NOT_KEPT = "not saved: full fine-tuning keeps no earlier weights, so a resume samples these steps from the loaded ones"


ADVICE = "Resume from another checkpoint (--step N) or start a new run"  # for a damaged record


def jobs_file(folder: Path, rank: int) -> Path:
    return Path(folder) / f"in_flight_{rank}.json"


def weights_file(folder: Path, version: int) -> Path:
    return Path(folder) / f"in_flight_policy_v{version}.safetensors"


def save_in_flight(folder: Path, rank: int, jobs: list[InFlightJob], weights: dict[int, dict] | None) -> None:
    """Write this process's jobs; process 0 also the weights of their versions (None: not kept)."""
    from safetensors.torch import save_file

    record = {"format": FORMAT, "version": VERSION, "weights": "saved" if weights is not None else NOT_KEPT,
              "jobs": [{"step": job.step, "policy_version": job.version,
                        "requests": [{"prompt_ids": list(r.prompt_ids), "seeds": list(r.seeds)} for r in job.requests]}
                       for job in jobs]}
    jobs_file(folder, rank).write_text(json.dumps(record, indent=1) + "\n")
    if rank == 0 and weights is not None:
        for version, tensors in weights.items():
            save_file({n: t.contiguous() for n, t in tensors.items()}, str(weights_file(folder, version)))


# the keys of the record, of a job and of a request: no other is read, so none other is accepted
RECORD_KEYS = {"format", "version", "weights", "jobs"}
JOB_KEYS = {"step", "policy_version", "requests"}
REQUEST_KEYS = {"prompt_ids", "seeds"}


def read_in_flight(folder: Path, rank: int, *, step: int, trained: dict[str, torch.Size], vocab_size: int,
                   planned: Callable[[int], Sequence[SampleRequest]] | None = None
                   ) -> tuple[list[InFlightJob], dict[int, dict] | None] | None:
    """This process's jobs of checkpoint `folder` (at `step`) and their versions' weights (None
    where they were not kept); None where the checkpoint records nothing in flight. `trained`: the
    shapes of the trained parameters (trained_shapes), which the weights must match; `planned`:
    the requests a step's first round draws (the trainer's plan), which each job's must equal."""
    path = jobs_file(folder, rank)
    if not path.is_file():
        return None
    record = read_json(path, advice=ADVICE)
    _require(record.get("format") == FORMAT and record.get("version") == VERSION, path,
             f"is not a {FORMAT} file of version {VERSION}")
    _no_other_keys(record, RECORD_KEYS, path, "the record")
    jobs_in = record.get("jobs")
    _require(isinstance(jobs_in, list), path, "has no list of jobs")
    weights = record.get("weights")
    _require(weights == "saved" or (isinstance(weights, str) and weights.startswith("not saved")), path,
             f"says weights {weights!r}, not 'saved' or 'not saved: ...'")
    jobs = [_job(item, path, step, vocab_size) for item in jobs_in]
    steps = [job.step for job in jobs]
    twice = next((s for s in steps if steps.count(s) > 1), None)
    _require(twice is None, path, f"has two jobs for step {twice}")
    for job in jobs:
        if planned is not None:
            _require(tuple(planned(job.step)) == job.requests, path,
                     f"has a job for step {job.step} whose prompts or seeds are not those step {job.step} draws")
    if weights != "saved":
        return jobs, None
    return jobs, {v: _weights(weights_file(folder, v), trained) for v in sorted({job.version for job in jobs})}


def trained_shapes(model) -> dict[str, torch.Size]:
    """The full shapes of the parameters the optimizer trains (an FSDP2 shard's too)."""
    return {name: p.shape for name, p in model.named_parameters() if p.requires_grad}


def _job(item, path: Path, step: int, vocab_size: int) -> InFlightJob:
    _require(isinstance(item, dict), path, "has a job that is not an object")
    _no_other_keys(item, JOB_KEYS, path, "a job")
    planned, version, requests = item.get("step"), item.get("policy_version"), item.get("requests")
    _require(_integer(planned) and planned > step, path, f"has a job for step {planned!r}, not one after step {step}")
    _require(_integer(version) and 0 <= version < step, path,
             f"has a job sampled from policy version {version!r}, not one of 0..{step - 1}")
    _require(isinstance(requests, list), path, f"has a job for step {planned} without a list of requests")
    job = InFlightJob(planned, version, tuple(_request(r, path, vocab_size) for r in requests))
    seeds = [seed for request in job.requests for seed in request.seeds]
    twice = next((seed for seed, count in Counter(seeds).items() if count > 1), None)
    _require(twice is None, path, f"has a job for step {planned} with seed {twice} twice")
    return job


def _request(item, path: Path, vocab_size: int) -> SampleRequest:
    _require(isinstance(item, dict), path, "has a request that is not an object")
    _no_other_keys(item, REQUEST_KEYS, path, "a request")
    prompt, seeds = item.get("prompt_ids"), item.get("seeds")
    _require(isinstance(prompt, list) and all(_integer(t) and 0 <= t < vocab_size for t in prompt), path,
             f"has a prompt that is not a list of token ids below {vocab_size}")
    _require(isinstance(seeds, list) and seeds and all(_integer(s) and 0 <= s < SEED_LIMIT for s in seeds), path,
             "has a request whose seeds are not a list of integers in [0, 2**62)")
    return SampleRequest(tuple(prompt), tuple(seeds))


def _weights(path: Path, trained: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    _require(path.is_file(), path, "is missing: the jobs in flight sample from its weights")
    tensors = read_tensors(path)
    odd = sorted(set(tensors) ^ set(trained))
    _require(not odd, path, f"does not hold this model's trained weights ({odd[0] if odd else ''})")
    wrong = [n for n, t in tensors.items() if t.shape != trained[n] or not t.is_floating_point()]
    _require(not wrong, path, f"holds {wrong[0] if wrong else ''} in another shape or type than the model's")
    not_finite = next((n for n, t in tensors.items() if not bool(torch.isfinite(t).all())), None)
    _require(not_finite is None, path, f"holds {not_finite} with values that are not finite (NaN or infinite)")
    return tensors


def _no_other_keys(item: dict, keys: set, path: Path, what: str) -> None:
    other = sorted(str(k) for k in set(item) - keys)
    _require(not other, path, f"has key {other[0] if other else ''!r} in {what}, which the format does not have")


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, path: Path, problem: str) -> None:
    require(ok, path, problem, ADVICE)
