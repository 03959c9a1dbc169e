"""The `vllm` rollout engine: vLLM colocated in each training process, as TRL's colocate mode.

Each process holds its own vLLM instance on its GPU (a share of the memory,
`rollout.vllm.gpu_memory_utilization`; tensor parallel over `tensor_parallel_size` processes of
the node, which then pool their prompts). The engine follows the policy:
  - after an optimizer step the trainer calls `policy_updated` (cheap); the next `generate`
    first brings the engine up to date, once, however many steps were taken:
      * LoRA (`sync: adapter`): the adapter's full tensors are gathered, process 0 saves them to
        the run's scratch folder (shared by every process; the others wait) and each engine uses
        it as a new LoRARequest (a new id each time, so vLLM never serves a cached older adapter);
      * full weights, or LoRA with `sync: merged`: the weights (adapter folded in) are loaded into
        the engine in place and its prefix cache is reset (cached keys of old weights are stale);
  - while the trainer scores and updates, `release` puts vLLM to sleep where it offers sleep mode (level 1:
    weights to CPU, KV cache dropped; level 2: weights dropped too, only with a full-weight push,
    which wakes the weights first, loads, then wakes the KV cache);
  - prompts go in as token ids (TokensPrompt: no second BOS), one request per prompt asking for
    its whole group (`n`) from the engine's seed, as TRL and verl ask, or, with
    `seed_per_request` (the default off a CUDA GPU), one request per sample with its own seed: see
    `seeds_per_request`; the same stop ids as the `hf` engine (EOS ignored, so that set is the only one);
    the sampler's log-probs come back (`logprobs_mode=processed_logprobs`: after temperature
    and top-p, the distribution actually sampled).

vLLM's classes arrive through `api` (LLM, SamplingParams, LoRARequest, TokensPrompt), so the
default tests drive this orchestration with a fake that records the calls; tests/test_vllm_real.py
runs it against the real vLLM (its CPU build, `make test-vllm`). It has not run on a GPU here.

This module also holds what only vLLM needs: its config section (`rollout.vllm`, VLLMConfig), the
settings vLLM would refuse (refused when the config loads), and the LoRA ranks it accepts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, replace
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Sequence

import torch

from meds_cli.core.errors import UserError
from meds_cli.core.fields import Check, at_least, choice, doc
from meds_cli.engine.model_io.model import DTYPES
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings, split_by_request
from meds_cli.engine.rollout.weight_sync import adapter_weights, merged_weights, process_rank, wait_for_processes

# vLLM platforms (current_platform.device_type) where `seed_per_request: auto` asks for groups
BATCHED_SAMPLING_PLATFORMS = ("cuda",)
MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams refuses a higher temperature
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM 0.32 accepts


@dataclass
class VLLMConfig:
    """The `rollout.vllm` config section."""

    gpu_memory_utilization: float = doc(0.3, "share of each GPU's memory the colocated vLLM holds (weights + KV cache)",
                                        Check(lambda v: 0 < v <= 1, "in (0, 1]"))
    tensor_parallel_size: int = doc(1, "GPUs per vLLM instance; the processes of a group pool their prompts",
                                    at_least(1))
    sleep_level: int = doc(1, "while the trainer updates: 0 stay awake, 1 weights to CPU and KV cache freed, "
                              "2 weights freed too (needs a full-weight sync); off where the platform has no "
                              "sleep mode (CPU)", Check(lambda v: v in (0, 1, 2), "0, 1 or 2"))
    sync: str = choice("adapter", ["adapter", "merged"],
                       "with LoRA: push the adapter as a new LoRARequest each step, or load merged weights in place")
    dtype: str = choice("bfloat16", ["bfloat16", "float16", "float32", "auto"], "what vLLM computes in (auto: what "
                        "the trainer computes in; on a CPU without native bfloat16, float32 is several times faster)")
    max_model_len: int = doc(0, "longest prompt + response vLLM reserves KV cache for (0: the task's longest "
                                "prompt + rollout.max_new_tokens, or the model's limit where no task is known)",
                             at_least(0))
    max_num_batched_tokens: int = doc(0, "tokens vLLM's scheduler runs in one step, prompt chunks included: its "
                                         "activation memory (0: vLLM's default)", at_least(0))
    seed_per_request: bool | str = doc(
        "auto", "true: one vLLM request per sample with its own seed, reproducible to the bit and across a resume, "
        "but vLLM then samples row by row (much slower on a GPU); false: one request per prompt for its group, drawn "
        "from the engine's seed (TRL's and verl's way); auto: false on a CUDA GPU, true elsewhere (CPU)",
        Check(lambda v: v in ("auto", True, False), "auto, true or false"))
    enforce_eager: bool = doc(False, "no torch.compile and no CUDA graphs: the engine starts in seconds but decodes "
                              "slower on a GPU (on a CPU, compiling takes minutes)")


def check_vllm_settings(temperatures: dict[str, float]) -> None:
    """Refuse, in one line, the sampling settings vLLM would refuse with a traceback later;
    `temperatures`: config key -> value of every temperature the engine will be asked for."""
    for key, value in temperatures.items():
        if value > MAX_TEMPERATURE:
            raise UserError(f"{key}={value} is above {MAX_TEMPERATURE:g}, the highest temperature vLLM samples at; "
                            f"lower it or use rollout.engine=hf")


AUTOCAST_COMPUTE = {"bf16": "bfloat16", "fp16": "float16"}  # the accelerator's mixed_precision -> compute dtype


def trainer_compute_dtype(mixed_precision: str | None, weights_dtype: torch.dtype) -> str:
    """What the trainer's forwards compute in: its autocast's dtype, else its weights' own."""
    return AUTOCAST_COMPUTE.get(mixed_precision or "no", str(weights_dtype).replace("torch.", ""))


def engine_dtype(setting: str, trainer_dtype: str) -> str:
    """rollout.vllm.dtype as vLLM is given it: `auto` follows the trainer's compute dtype, so the
    sampler's log-probs and the trainer's differ only by kernels, not by precision."""
    return trainer_dtype if setting == "auto" else setting


def sampler_precision_line(engine: str, sampler_dtype: str, trainer_dtype: str) -> str | None:
    """The one start-up line saying the sampler and the trainer compute in different precisions
    (their log-probs then differ before any update: a mean |d logp| of 0.02-0.05 between float32
    vLLM and bf16 training on this CPU), or None where they agree."""
    if sampler_dtype == trainer_dtype:
        return None
    return (f"precision: the sampler (rollout.engine={engine}) computes in {sampler_dtype}, the trainer in "
            f"{trainer_dtype}; their log-probs differ before any update (mismatch/* metrics; rollout.is_correction=tis "
            f"corrects for it; rollout.vllm.dtype=auto follows the trainer)")


def supported_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of rank `rank`."""
    for size in VLLM_LORA_RANKS:
        if rank <= size:
            return size
    raise UserError(f"LoRA rank {rank} is larger than vLLM supports ({VLLM_LORA_RANKS[-1]}); "
                    f"lower model.lora.rank or use rollout.engine=hf")


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def vllm_api() -> SimpleNamespace:
    """vLLM's classes, imported on first use (vllm is optional)."""
    # Colocated: the engine core runs in this process, so weights are handed over by reference
    # (and a script that builds the engine at import time needs no `if __name__ == "__main__"`).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams  # noqa: PLC0415 - optional dependency
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.platforms import current_platform

    return SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, LoRARequest=LoRARequest, TokensPrompt=TokensPrompt,
                           sleep_mode_available=current_platform.is_sleep_mode_available,
                           platform=current_platform.device_type)


def refusal_text(err: ValueError) -> str:
    """One line from vLLM's refusal: pydantic's message of the first failed check, else the first line."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        try:
            return " ".join(str(errors()[0]["msg"]).split())
        except (TypeError, IndexError, KeyError):
            pass
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def seeds_per_request(option: bool | str, platform: str) -> bool:
    """Whether each sample goes to vLLM as its own request with its own seed (rollout.vllm.seed_per_request).

    A seeded request has its own torch generator, so its sample depends on (prompt, seed) only: the
    same whatever else is in the batch, and again after a resume. vLLM draws such requests one
    by one instead of in its batched sampler, which costs little on CPU and much on a GPU. On CPU
    the calls are already cut into waves for seeded requests (`_waves`: vLLM 0.32's CPU scheduler
    cannot split their prompts), and that seeded path is the one tests/test_vllm_real.py checks
    there. So `auto` is false on a CUDA GPU and true elsewhere (CPU; other accelerators keep the
    per-sample seeds until measured). Without them a run is reproducible only as vLLM's batched
    sampling is (same engine seed, same batches, same kernels; not across a resume)."""
    return platform not in BATCHED_SAMPLING_PLATFORMS if option == "auto" else bool(option)


def free_cuda_cache() -> None:
    """Hand PyTorch's cached, unused CUDA blocks back to the driver (verl and TRL do so around
    vLLM's sleep and wake-up: memory the trainer freed otherwise stays in PyTorch's cache, out of
    vLLM's reach). Nothing without CUDA."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def say_on_stderr(text: str) -> None:
    print(text, file=sys.stderr)


def tensor_parallel_gather(size: int) -> Callable:
    """For tensor parallelism across colocated processes: a function that pools one process's
    items with those of the other processes of its group of `size` consecutive ranks, returning
    (every process's items in rank order, this process's index)."""
    import torch.distributed as dist

    world = dist.get_world_size()
    if world % size:
        raise UserError(f"rollout.vllm.tensor_parallel_size={size} must divide the {world} processes")
    group, _ = dist.new_subgroups_by_enumeration([list(range(i, i + size)) for i in range(0, world, size)])

    def gather(mine: list) -> tuple[list[list], int]:
        parts: list = [None] * size
        dist.all_gather_object(parts, mine, group=group)
        return parts, dist.get_rank(group)

    return gather


def _load_into_worker(worker, weights):
    """Runs on each vLLM worker (collective_rpc): load (name, tensor) pairs (any iterable, read
    once) into its model.
    vLLM 0.32's workers reload in place (`reload_weights`), which also works where loading turned
    the parameters into kernel formats that a second `load_weights` cannot read (its CPU build);
    older workers take the weights through the model's own `load_weights`."""
    reload = getattr(worker, "reload_weights", None)
    if callable(reload):
        reload(weights_iterator=iter(weights), is_checkpoint_format=True)
        retie_output_head(served_model(worker.model_runner))
    else:
        served_model(worker.model_runner).load_weights(weights=weights)


def retie_output_head(model) -> None:
    """With tied embeddings vLLM's output head is the embedding tensor, never loaded by name, and
    an in-place reload leaves the head (and, on CPU, the matmul weights packed from it) at the old
    embedding: tie it to the new one and let the head prepare its kernels again."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return
    head.tie_weights(embed)
    head.quant_method.process_weights_after_loading(head)


def served_model(model_runner):
    """The model a vLLM model runner serves: `get_model()` unwraps what `.model` may hold (a
    CUDA-graph or compile wrapper); runners without the accessor hold the model itself."""
    get_model = getattr(model_runner, "get_model", None)
    return get_model() if callable(get_model) else model_runner.model


def _scheduler_config(llm):
    """vLLM's scheduler settings (token budget per step, most requests at once), where it shows them."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return getattr(config, "scheduler_config", None)


class VLLMEngine:
    """See the module docstring. `policy`: the training model (pushed after updates), or None for
    a fixed model (eval); `adapter_path`: a fixed LoRA adapter to serve (eval of a checkpoint);
    `model_len`: the longest prompt plus response the caller will ask for, the KV cache's size
    where options.max_model_len is 0 (0: the model's own limit)."""

    name = "vllm"
    records_lens = False  # vLLM exposes no hidden states: MEDS reads its features from the scoring pass
    # It samples from its own copy, sent unit by unit (weight_sync.py): the trainer does not gather
    # a sharded policy for it.
    reads_policy_weights = False

    def __init__(self, source: str, *, options: VLLMConfig, seed: int = 0, policy=None, lora_rank: int | None = None,
                 adapter_path: Path | None = None, scratch_dir: Path | None = None, processes: int = 1,
                 tp_gather: Callable | None = None, api: SimpleNamespace | None = None,
                 say: Callable[[str], None] = say_on_stderr, model_len: int = 0):
        lora = lora_rank is not None
        if options.sleep_level == 2 and lora and options.sync == "adapter" and policy is not None:
            raise UserError("rollout.vllm.sleep_level=2 frees the base weights, which an adapter push does not "
                            "restore; use sleep_level 1 or rollout.vllm.sync=merged")
        if policy is not None and scratch_dir is None and lora and options.sync == "adapter":
            raise ValueError("pushing a LoRA adapter needs a scratch folder")
        self.api = api or vllm_api()
        if options.sleep_level and not self.api.sleep_mode_available():
            say(f"rollout.vllm.sleep_level={options.sleep_level}: vLLM has no sleep mode on this platform "
                f"({self.api.platform}), so it stays awake while the trainer updates")
            options = replace(options, sleep_level=0)
        self.options, self.policy, self.scratch_dir = options, policy, scratch_dir
        self.push_adapter = lora and options.sync == "adapter" and policy is not None
        self.tp_gather = tp_gather
        self.per_sample_seeds = seeds_per_request(options.seed_per_request, self.api.platform)
        kwargs = dict(model=source, tokenizer=source, dtype=options.dtype, seed=seed,
                      gpu_memory_utilization=options.gpu_memory_utilization,
                      tensor_parallel_size=options.tensor_parallel_size,
                      enable_sleep_mode=options.sleep_level > 0, logprobs_mode="processed_logprobs")
        if options.max_model_len or model_len:
            kwargs["max_model_len"] = options.max_model_len or model_len
        if options.max_num_batched_tokens:
            kwargs["max_num_batched_tokens"] = options.max_num_batched_tokens
        if options.enforce_eager:
            kwargs["enforce_eager"] = True
        elif self.api.platform == "cpu":
            say("vLLM compiles the model before its first batch, which takes minutes on a CPU; "
                "rollout.vllm.enforce_eager=true starts in seconds")
        if processes > 1:  # colocated in every training process: vLLM joins the launcher's process group
            kwargs["distributed_executor_backend"] = "external_launcher"
        if self.push_adapter or adapter_path is not None:
            kwargs.update(enable_lora=True, max_lora_rank=supported_lora_rank(lora_rank or 1), max_loras=1)
        try:
            self.llm = self.api.LLM(**kwargs)
        except ValueError as err:  # vLLM's own config checks (pydantic's ValidationError is a ValueError)
            raise UserError(f"vLLM refused its settings: {refusal_text(err)}") from None
        self.lora_request = (self.api.LoRARequest("checkpoint", 1, str(Path(adapter_path).resolve()))
                             if adapter_path is not None else None)
        self.policy_version = 0  # optimizer steps seen
        self.engine_version = -1 if policy is not None else 0  # -1: push before the first generate (a resumed policy)
        self.adapters_pushed = 0
        self.asleep = False
        self.weights_dropped = False  # level-2 sleep: the engine holds no weights until the next push

    # ---------------------------------------------------------------- the trainer's calls

    def policy_updated(self) -> None:
        self.policy_version += 1

    def policy_settled(self, version: int) -> None:
        """Nothing more: the optimizer steps counted by policy_updated bring it up to date."""

    def close(self) -> None:
        """Nothing to stop: the colocated instance lives and ends with this process."""

    def release(self) -> None:
        if self.options.sleep_level and not self.asleep:
            self.llm.sleep(level=self.options.sleep_level)
            free_cuda_cache()
            self.asleep = True
            self.weights_dropped = self.options.sleep_level == 2

    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]:
        self._bring_up_to_date()
        mine = [(r.prompt_ids, seed, r.budget(settings)) for r in requests for seed in r.seeds]
        everyone, index = self._share_with_tp_group(mine)
        flat = self._generate_flat([item for part in everyone for item in part], settings)
        start = sum(len(part) for part in everyone[:index])
        return split_by_request(requests, flat[start:start + len(mine)])

    # ---------------------------------------------------------------- internals

    def _bring_up_to_date(self) -> None:
        stale = self.policy is not None and (self.engine_version != self.policy_version or self.weights_dropped)
        if not self.asleep:
            if stale:
                self._push()
            return
        free_cuda_cache()  # the training's freed activations, still in PyTorch's cache, back for vLLM
        if stale and not self.push_adapter and self.weights_dropped:
            # Level 2: wake the weights alone, load them, then wake the KV cache (a lower peak).
            self.llm.wake_up(tags=["weights"])
            self._push()
            self.llm.wake_up(tags=["kv_cache"])
        else:
            self.llm.wake_up()
            if stale:
                self._push()
        self.asleep = self.weights_dropped = False

    def _push(self) -> None:
        if self.push_adapter:
            self._push_adapter()
        else:
            # One FSDP2 unit at a time, cast to vLLM's dtype: never the whole model at once (weight_sync.py).
            dtype = DTYPES[self.options.dtype]  # "auto": vLLM keeps the checkpoint's, the weights are sent as they are
            self._load_weights(merged_weights(self.policy, None if dtype == "auto" else dtype))
            self.llm.reset_prefix_cache()
        self.engine_version = self.policy_version

    def _push_adapter(self) -> None:
        """Every process gathers the adapter's full tensors (under FSDP2 its weights are shards,
        whether or not sampling gathered them), process 0 writes it into the scratch folder every
        process shares, the others wait for the file, then every engine serves it (TRL and verl
        write once too)."""
        self.adapters_pushed += 1
        number = self.adapters_pushed
        folder = Path(self.scratch_dir) / f"adapter-{number}"
        weights = adapter_weights(self.policy)
        if process_rank() == 0:
            self.policy.save_pretrained(str(folder), state_dict=weights)
            stale_folder = Path(self.scratch_dir) / f"adapter-{number - 1}"
            if stale_folder.is_dir():  # every engine served that id in its last generate; never asked for again
                shutil.rmtree(stale_folder, ignore_errors=True)
        wait_for_processes()
        self.lora_request = self.api.LoRARequest(f"policy-{number}", number, str(folder.resolve()))

    def _load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hand (name, tensor) pairs to vLLM's workers as they come: colocated, the workers run in
        this process, so an iterator is read in place and each tensor freed once loaded."""
        rpc = getattr(self.llm, "collective_rpc", None)
        if rpc is not None:
            rpc(_load_into_worker, args=(weights,))
        else:  # vLLM before collective_rpc
            served_model(self.llm.llm_engine.model_executor.driver_worker.model_runner).load_weights(weights=weights)

    def _share_with_tp_group(self, mine: list) -> tuple[list[list], int]:
        """With tensor parallelism every process of a group must submit the same prompts: pool
        them (in rank order) and return (all parts, this process's index among them)."""
        if self.options.tensor_parallel_size == 1 or self.tp_gather is None:
            return [mine], 0
        return self.tp_gather(mine)

    def _generate_flat(self, items: list[tuple[tuple[int, ...], int]], settings: SamplingSettings) -> list[Sample]:
        return [sample for wave in self._waves(items) for sample in self._generate_wave(wave, settings)]

    def _waves(self, items: list[tuple[tuple[int, ...], int]]) -> list[list]:
        """The items in calls vLLM prefills whole. On CPU, vLLM 0.32 fails on a seeded request
        whose prompt its scheduler splits over two steps ('CPU Generator does not use offset':
        it rewinds the request's generator, which CPU generators cannot), and it splits a prompt
        when a step's token budget runs out; so each call holds at most max_num_seqs requests and
        prompts within the budget. One call elsewhere."""
        scheduler = _scheduler_config(self.llm)
        if self.api.platform != "cpu" or scheduler is None:
            return [items] if items else []
        budget, most = scheduler.max_num_batched_tokens, scheduler.max_num_seqs
        waves, wave, used = [], [], 0
        for item in items:
            cost = len(item[0]) + 1  # its prompt, and a decode token for each request already running
            if wave and (used + cost > budget or len(wave) == most):
                waves.append(wave)
                wave, used = [], 0
            wave.append(item)
            used += cost
        return waves + ([wave] if wave else [])

    def _vllm_requests(self, items: list[tuple[tuple[int, ...], int]]) -> list[tuple[tuple[int, ...], int, int | None]]:
        """(prompt ids, n, seed) of each vLLM request for `items` (prompt ids, sample seed), whose
        samples come back in the items' order: one per item with its seed, or one per run of
        consecutive items with the same prompt (a request's group) with no seed of its own."""
        if self.per_sample_seeds:
            return [(ids, 1, int(seed), budget) for ids, seed, budget in items]
        return [(ids, len(list(run)), None, budget) for (ids, budget), run in groupby(items, key=itemgetter(0, 2))]

    def _generate_wave(self, items: list[tuple[tuple[int, ...], int]], settings: SamplingSettings) -> list[Sample]:
        api = self.api
        requests = self._vllm_requests(items)
        prompts = [api.TokensPrompt(prompt_token_ids=list(ids)) for ids, _, _, _ in requests]
        # a tool turn pauses at its stop strings, kept in the output (vLLM needs the text to find them)
        strings = {}
        if settings.stop_strings:
            strings = {"stop": list(settings.stop_strings), "include_stop_str_in_output": True}
        params = [api.SamplingParams(n=n, temperature=settings.temperature, top_p=settings.top_p,
                                     max_tokens=budget, min_tokens=settings.min_new_tokens,
                                     stop_token_ids=list(settings.stop_ids), ignore_eos=True, seed=seed,
                                     logprobs=0, detokenize=bool(strings), **strings)
                  for _, n, seed, budget in requests]
        outputs = self.llm.generate(prompts, params, lora_request=self.lora_request, use_tqdm=False)
        samples = []
        for completion in (c for output in outputs for c in sorted(output.outputs, key=lambda c: c.index)):
            tokens = list(completion.token_ids)
            logprobs = None
            if completion.logprobs is not None:
                logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, tokens)]
            # vLLM names what ended a "stop": the stop id (an int) or the stop string (a tool turn's pause)
            at_stop = completion.finish_reason == "stop"
            paused_at = isinstance(getattr(completion, "stop_reason", None), str)
            samples.append(Sample(tokens, at_stop and not paused_at, logprobs, paused=at_stop and paused_at))
        return samples
