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
the versions' weights present with the model's names and shapes), and anything wrong is one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from meds_cli.core.read_back import read_json, require
from meds_cli.engine.rollout.pipeline import InFlightJob
from meds_cli.engine.rollout.sampling_engine import SampleRequest
from meds_cli.engine.run_folders.state_codec import read_tensors

FORMAT, VERSION = "meds-in-flight", 1
SEED_LIMIT = 2**62  # sample_rollouts draws seeds below it
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


def read_in_flight(folder: Path, rank: int, *, step: int, trained: dict[str, torch.Size],
                   vocab_size: int) -> tuple[list[InFlightJob], dict[int, dict] | None] | None:
    """This process's jobs of checkpoint `folder` (at `step`) and their versions' weights (None
    where they were not kept); None where the checkpoint records nothing in flight. `trained`: the
    shapes of the trained parameters (trained_shapes), which the weights must match."""
    path = jobs_file(folder, rank)
    if not path.is_file():
        return None
    record = read_json(path, advice=ADVICE)
    _require(record.get("format") == FORMAT and record.get("version") == VERSION, path,
             f"is not a {FORMAT} file of version {VERSION}")
    jobs_in = record.get("jobs")
    _require(isinstance(jobs_in, list), path, "has no list of jobs")
    jobs = [_job(item, path, step, vocab_size) for item in jobs_in]
    if record.get("weights") != "saved":
        return jobs, None
    return jobs, {v: _weights(weights_file(folder, v), trained) for v in sorted({job.version for job in jobs})}


def trained_shapes(model) -> dict[str, torch.Size]:
    """The full shapes of the parameters the optimizer trains (an FSDP2 shard's too)."""
    return {name: p.shape for name, p in model.named_parameters() if p.requires_grad}


def _job(item, path: Path, step: int, vocab_size: int) -> InFlightJob:
    _require(isinstance(item, dict), path, "has a job that is not an object")
    planned, version, requests = item.get("step"), item.get("policy_version"), item.get("requests")
    _require(_integer(planned) and planned > step, path, f"has a job for step {planned!r}, not one after step {step}")
    _require(_integer(version) and 0 <= version < step, path,
             f"has a job sampled from policy version {version!r}, not one of 0..{step - 1}")
    _require(isinstance(requests, list), path, f"has a job for step {planned} without a list of requests")
    return InFlightJob(planned, version, tuple(_request(r, path, vocab_size) for r in requests))


def _request(item, path: Path, vocab_size: int) -> SampleRequest:
    _require(isinstance(item, dict), path, "has a request that is not an object")
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
    return tensors


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, path: Path, problem: str) -> None:
    require(ok, path, problem, ADVICE)
