"""The tiny model with a LoRA adapter that changes its outputs, for sampler and lens tests."""

import torch

from meds_cli.engine.config import LoraConfig
from meds_cli.engine.model_io.model import apply_lora
from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer


def lora_policy(seed: int, layers: int = 4):
    """(model in eval mode, tokenizer). Both adapter matrices come from the test's own generator:
    peft draws lora_A from the global RNG, which would make the model depend on the tests that ran
    before, and starts lora_B at zero, which would leave the outputs unchanged."""
    model, tokenizer = tiny_model_and_tokenizer(layers=layers)
    model = apply_lora(model, LoraConfig(rank=8))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    return model.eval(), tokenizer
