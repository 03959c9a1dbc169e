"""What an algorithm may see of the no-grad sampling forward pass, and the model part it may
apply to hidden states (the output head, for the logit lens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class ForwardView:
    """What an algorithm may look at in the sampling forward pass, for rows `rows` of the batch.
    `response_logits()` gives the response-position logits [b, R, V] (fp32, temperature 1): the
    scoring pass never holds them whole, so they are computed on the first call (`make_logits`)
    and kept for the view's lifetime; `hidden_states` the per-layer states (embedding output
    first) over the full sequence, present when the algorithm asked for them; `device` where the
    pass ran."""

    rows: slice
    logits: torch.Tensor | None = None  # set when made, or given directly
    hidden_states: tuple | None = None
    model: Any = None
    tokenizer: Any = None
    make_logits: Callable[[], torch.Tensor] | None = field(default=None, repr=False)
    device: torch.device | None = None

    def response_logits(self) -> torch.Tensor:
        if self.logits is None:
            if self.make_logits is None:
                raise RuntimeError("this forward view carries no logits")
            self.logits = self.make_logits()
        return self.logits


def output_head(model):
    """(final norm, lm_head) of a causal LM, for the logit lens; works through peft and DDP wrappers."""
    inner = getattr(model, "module", model)
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    body = getattr(inner, "model", None)
    norm = getattr(body, "norm", None) if body is not None else None
    return norm, inner.get_output_embeddings()
