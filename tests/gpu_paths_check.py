"""Run under `accelerate launch` (2 CPU processes, gloo): the GPU-only paths of issue 37 that
show on CPU as collectives, with fakes in place of vLLM.

    gpu_paths_check.py MODE OUT

MODE
  collect  DAPO's dynamic sampling with uneven quotas (process 0 keeps every group, process 1
           none) against an engine whose generate is a collective over every process, as vLLM's
           tensor-parallel prompt pooling is: every process must enter every engine call.
  eval     the quick eval with eval.problems=1 and 3 over 2 processes, same engine.
  adapter  FSDP2 + LoRA, a vLLM engine (fake api) pushing the adapter: the file it writes must
           equal the unsharded model's adapter, pushed outside and inside sampling's gather.
  peak     FSDP2 + LoRA, the merged weight push: the most parameter bytes held unsharded at once
           while the fake vLLM reads the weights, against the model's size.

Each process writes OUT/rank-N.json; tests/test_gpu_paths.py reads them.
"""

import json
import os
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist

from meds_cli.engine.rollout.sampling_engine import Sample
from meds_cli.engine.training.sharding import close_process_group
from tests.conftest import tiny_config


class CollectiveEngine:
    """A rollout engine whose generate is a collective over every process (as vLLM's
    tensor-parallel gather is); it answers each sample with one token and a stop id."""

    name = "collective-fake"
    records_lens = False
    reads_policy_weights = False  # it answers without the policy

    def __init__(self, stop_id: int):
        self.stop_id, self.calls, self.requests = stop_id, 0, []

    def generate(self, requests, settings):
        sizes = [None] * dist.get_world_size()
        dist.all_gather_object(sizes, len(requests))
        self.calls += 1
        self.requests.append(len(requests))
        return [[Sample([5, self.stop_id], True) for _ in r.seeds] for r in requests]

    def policy_updated(self):
        pass

    def policy_settled(self, version):
        pass

    def release(self):
        pass

    def close(self):
        pass


def trainer_with_collective_engine(out: Path, *overrides: str):
    from meds_cli.engine.trainer import Trainer

    cfg = tiny_config("rollout.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=2",
                      "train.micro_batch_size=8", *overrides, output_dir=out / "run")
    trainer = Trainer(cfg, out / "run")
    trainer.engine = CollectiveEngine(trainer.tokenizer.eos_token_id)
    return trainer


def check_collect(out: Path) -> dict:
    trainer = trainer_with_collective_engine(out, "algo.name=dapo", "dapo.dynamic_sampling=true",
                                             "dapo.max_gen_batches=3")
    # Uneven quotas: process 0 keeps every group it samples (its quota fills in round 1),
    # process 1 none (it samples every round the algorithm allows).
    keep_all = trainer.rank == 0
    trainer.algorithm.keep_groups = lambda batch: torch.full((batch.num_groups,), keep_all)
    timing = {"time_generate_s": 0.0, "time_score_s": 0.0, "generated_tokens": 0}
    _, _, info = trainer.collect(timing)
    result = {"engine_calls": trainer.engine.calls, "requests": trainer.engine.requests, **info}
    close_process_group(trainer.acc)
    return result


def check_eval(out: Path) -> dict:
    result = {}
    for problems in (1, 3):
        trainer = trainer_with_collective_engine(out / f"eval-{problems}", f"eval.problems={problems}")
        metrics = trainer.quick_eval()
        result[str(problems)] = {"engine_calls": trainer.engine.calls, "requests": trainer.engine.requests,
                                 "problems": metrics.get("eval/problems")}
        if problems == 3:
            close_process_group(trainer.acc)
    return result


# ---------------------------------------------------------------- FSDP2 + LoRA with the vLLM engine


def sharded_lora_model(acc):
    """The tiny Llama with a non-zero LoRA adapter, its unsharded adapter (cloned before
    sharding) and its unsharded size in bytes, then sharded with FSDP2 over every process."""
    from meds_cli.engine.config import LoraConfig
    from meds_cli.engine.model_io.model import apply_lora
    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
    from meds_cli.engine.training import sharding

    torch.manual_seed(0)
    model, _ = tiny_model_and_tokenizer()
    model = apply_lora(model, LoraConfig(rank=4, alpha=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    from peft import get_peft_model_state_dict

    adapter = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    def size(params) -> int:
        return sum(p.numel() * p.element_size() for p in params)

    layers = sharding.decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    # the root unit: embeddings, final norm and output head (one tensor when tied)
    sizes = {"model_bytes": size(model.parameters()), "layer_bytes": max(size(m.parameters()) for m in layers),
             "root_bytes": size(p for p in model.parameters() if id(p) not in in_layers),
             "largest_weight_bytes": max(size([p]) for p in model.parameters())}
    sharded = sharding.shard_model(model, sharding.device_mesh(acc))
    return model, sharded, adapter, sizes


def vllm_engine(model, scratch: Path, events: list, sync: str):
    from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine
    from tests.test_vllm_engine import fake_api

    return VLLMEngine("/models/tiny", options=VLLMConfig(sync=sync, dtype="float32"), seed=0, policy=model,
                      lora_rank=4, scratch_dir=scratch, api=fake_api(events))


def check_adapter(out: Path) -> dict:
    from accelerate import Accelerator
    from safetensors.torch import load_file

    from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
    from meds_cli.engine.training.sharding import gathered_parameters

    acc = Accelerator(cpu=True)
    model, sharded, adapter, _ = sharded_lora_model(acc)
    engine = vllm_engine(model, out / "scratch", [], "adapter")
    settings = SamplingSettings(1.0, 1.0, 2, (99,))
    result = {}
    for where in ("outside", "inside"):
        engine.policy_updated()
        if where == "inside":
            with gathered_parameters(sharded):
                engine.generate([SampleRequest((1, 2), (3,))], settings)
        else:
            engine.generate([SampleRequest((1, 2), (3,))], settings)
        try:
            written = load_file(str(Path(engine.lora_request.lora_path) / "adapter_model.safetensors"))
        except Exception as err:  # noqa: BLE001 - the test reports what today's code wrote
            result[where] = {"error": f"{type(err).__name__}: {err}"[:300]}
            continue
        result[where] = {
            "same_keys": sorted(written) == sorted(adapter),
            "equal": sorted(written) == sorted(adapter) and all(
                written[k].shape == adapter[k].shape and torch.equal(written[k], adapter[k]) for k in adapter),
            "path": engine.lora_request.lora_path}
    close_process_group(acc)
    return result


def check_peak(out: Path) -> dict:
    """The fake vLLM reads the pushed weights one at a time; before each it measures what is held
    unsharded: the policy's parameters that are not DTensor shards, and the pushed tensors still
    alive (a list pushed at once keeps every one alive)."""
    from accelerate import Accelerator
    from torch.distributed.tensor import DTensor

    from meds_cli.engine.rollout.sampling_engine import SampleRequest, SamplingSettings
    from meds_cli.engine.training.sharding import gathered_parameters

    acc = Accelerator(cpu=True)
    model, sharded, _, sizes = sharded_lora_model(acc)
    events: list = []
    engine = vllm_engine(model, out / "scratch", events, "merged")
    alive: list[weakref.ref] = []
    peak = [0]

    def held() -> int:
        seen, total = set(), 0
        tensors = [p for p in model.parameters() if not isinstance(p, DTensor)]
        tensors += [t for t in (ref() for ref in alive) if t is not None]
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total

    def measuring_load(weights):
        count = 0
        for _, tensor in weights:
            alive.append(weakref.ref(tensor))
            peak[0] = max(peak[0], held())
            count += 1
            del tensor
        events.append(("load_weights", count))

    engine.llm.worker.model_runner.get_model().load_weights = measuring_load
    request, settings = [SampleRequest((1, 2), (3,))], SamplingSettings(1.0, 1.0, 2, (99,))
    result = dict(sizes)
    try:
        engine.generate(request, settings)  # the push as the trainer makes it now: parameters sharded
        result["peak_unsharded_bytes"] = peak[0]
    except RuntimeError as err:  # reported by the test
        result["error"] = f"{type(err).__name__}: {err}"[:300]
    # For comparison (not a bound): the push inside sampling's gather, where the trainer used to make it.
    peak[0] = 0
    engine.policy_updated()
    with gathered_parameters(sharded):
        engine.generate(request, settings)
        # the push leaves sampling's gather as it found it: an hf decode loop goes on without collectives
        result["still_gathered"] = not any(isinstance(p, DTensor) for p in model.parameters())
    result["peak_inside_gather_bytes"] = peak[0]
    loads = [e for e in events if e[0] == "load_weights"]
    close_process_group(acc)
    return {**result, "tensors_loaded": sum(n for _, n in loads)}


MODES = {"collect": check_collect, "eval": check_eval, "adapter": check_adapter, "peak": check_peak}


def main(mode: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    result = MODES[mode](out)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    (out / f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps({"world": world, **result}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
