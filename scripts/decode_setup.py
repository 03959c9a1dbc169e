"""What the decode benchmarks share: the policy they sample from and the requests they send.

The policy is the model with a LoRA adapter whose B matrices are drawn (a trained-looking adapter,
not peft's zero init, so merging it is real work); the requests are `size` samples of the first
arithmetic problems in the chat template, `group` samples per prompt.
"""

from __future__ import annotations

import torch


def decoding_policy(model_name: str, lora_rank: int, threads: int):
    """(model in eval mode, tokenizer, the arithmetic task) with `threads` torch threads (0: as
    meds configures this process); `lora_rank` 0: no adapter."""
    from benchmarks.tasks import build_task
    from meds_cli.core.cpu_budget import configure_torch_threads
    from meds_cli.engine.config import LoraConfig, TaskConfig
    from meds_cli.engine.model_io.model import apply_lora, load_model_and_tokenizer

    if threads:
        torch.set_num_threads(threads)
    else:
        configure_torch_threads()
    model, tokenizer = load_model_and_tokenizer(model_name)
    if lora_rank:
        torch.manual_seed(0)  # peft draws lora_A from the global generator: the same adapter in every process
        model = apply_lora(model, LoraConfig(rank=lora_rank, alpha=2 * lora_rank))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.01)
    model.eval()
    return model, tokenizer, build_task(TaskConfig(name="arithmetic", prompt_style="chat"), 0)


def prompts_for(task, tokenizer, size: int, group: int) -> list[str]:
    """The prompts of `size` samples, `group` per prompt (at least one prompt)."""
    return [task.prompt(p, tokenizer) for p in task.train[:max(1, size // group)]]


def engine_requests(prompts: list[str], tokenizer, size: int, group: int):
    """The engine's requests for `size` samples of `prompts`, seeds 0, 1, 2, ... in order."""
    from meds_cli.engine.rollout.sampling_engine import SampleRequest

    return [SampleRequest(tuple(tokenizer(p, add_special_tokens=False)["input_ids"]),
                          tuple(range(i * group, i * group + min(group, size))))
            for i, p in enumerate(prompts)]
