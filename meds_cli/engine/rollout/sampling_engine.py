"""The rollout engine interface: token ids and sampling settings in, token ids (and the
sampler's own log-probs) out.

Two engines implement it: `hf` (a decode loop over the training model itself, in this process)
and `vllm` (a colocated vLLM instance that receives the policy after each optimizer step). The
trainer and the eval harness only see this interface, so the engine is a config choice
(`rollout.engine: hf | vllm | auto`).

A request is one prompt and one seed per sample: a sample's randomness belongs to the sample,
not to the batch it happens to be drawn in, so the same (prompt, seed) gives the same response
however requests are grouped.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from meds_cli.core.errors import UserError
from meds_cli.core.forward import LensProbe

ENGINES = ("hf", "vllm", "auto")


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float  # 0: greedy
    top_p: float
    max_new_tokens: int
    stop_ids: tuple[int, ...]  # a response ends after the first of these (kept in the response)
    min_new_tokens: int = 0  # stop ids are refused before this many tokens (benchmarks force lengths)
    lens: LensProbe | None = None  # values to record per sampled token (engines with records_lens)


@dataclass(frozen=True)
class SampleRequest:
    prompt_ids: tuple[int, ...]  # the prompt as the model sees it: no BOS added by the engine
    seeds: tuple[int, ...]  # one per sample: len(seeds) responses are drawn

    @property
    def n(self) -> int:
        return len(self.seeds)


@dataclass
class Sample:
    token_ids: list[int]  # the response, its stop token included when it stopped
    stopped: bool  # ended on a stop id (False: cut at max_new_tokens)
    logprobs: list[float] | None = field(default=None)  # the sampler's log-prob of each token, where it has them
    lens: Any = field(default=None)  # torch.Tensor [tokens, len(layers)] of settings.lens, where recorded


class RolloutEngine(Protocol):
    """What the trainer and the eval harness call. `policy_updated` is cheap (it only records
    that the weights changed); an engine that holds its own copy of the policy brings it up to
    date before it next generates. `release` frees what the engine holds while the trainer
    updates (vLLM's sleep mode); the next `generate` takes it back."""

    name: str
    records_lens: bool  # honours SamplingSettings.lens

    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]: ...

    def policy_updated(self) -> None: ...

    def release(self) -> None: ...


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_engine(name: str, *, key: str = "rollout.engine") -> str:
    """'hf' or 'vllm'; 'auto' picks vLLM only where it is installed and a GPU is present."""
    if name not in ENGINES:
        raise UserError(f"unknown {key} '{name}'; accepted: {', '.join(ENGINES)}")
    if name == "auto":
        return "vllm" if vllm_available() and cuda_available() else "hf"
    if name == "vllm":
        if not vllm_available():
            raise UserError(f"{key}=vllm needs the vllm package, which is not installed (pip install vllm); use hf")
        if not cuda_available():
            raise UserError(f"{key}=vllm needs a CUDA GPU and none is visible; use hf")
    return name


def stop_token_ids(tokenizer) -> tuple[int, ...]:
    """The ids that end a response: the tokenizer's EOS and the end-of-turn tokens of chat
    templates (SmolLM2 and Qwen: <|im_end|>; Llama 3: <|eot_id|>), which may differ from EOS."""
    ids = {tokenizer.eos_token_id}
    vocab = tokenizer.get_vocab()
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
        if token in vocab:
            ids.add(vocab[token])
    return tuple(sorted(i for i in ids if i is not None))


def supported_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of rank `rank`."""
    for size in VLLM_LORA_RANKS:
        if rank <= size:
            return size
    raise UserError(f"LoRA rank {rank} is larger than vLLM supports ({VLLM_LORA_RANKS[-1]}); "
                    f"lower model.lora.rank or use rollout.engine=hf")


VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
