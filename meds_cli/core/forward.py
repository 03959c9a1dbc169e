"""What an algorithm may see of the no-grad sampling forward pass, and the model part it may
apply to hidden states (the output head, for the logit lens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ForwardView:
    """What an algorithm may look at in the sampling forward pass, for rows `rows` of the batch.
    `logits` are the response-position logits [b, R, V]; `hidden_states` the per-layer states
    (embedding output first) over the full sequence, present when the algorithm asked for them."""

    rows: slice
    logits: torch.Tensor
    hidden_states: tuple | None
    model: Any
    tokenizer: Any = None


def output_head(model):
    """(final norm, lm_head) of a causal LM, for the logit lens; works through peft and DDP wrappers."""
    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    body = getattr(inner, "model", None)
    norm = getattr(body, "norm", None) if body is not None else None
    return norm, inner.get_output_embeddings()
