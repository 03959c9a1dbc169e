"""What an algorithm may see of the model's forward passes: its declaration of what it reads
(ForwardNeeds), the no-grad scoring pass (ForwardView), the values a rollout engine records while
sampling (LensProbe), and the model parts applied to hidden states (the output head, for the
logit lens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class LensProbe:
    """Logit-lens values a rollout engine with `records_lens` records while it samples: for every
    sampled token, its logit read through the output head from the hidden state, at each of
    `layers`, of the position that predicted it. Layers are numbered as transformers'
    `hidden_states` (0 = embedding output, N = after the final norm); `final_norm` applies the
    final norm to the others before the head. MEDS reads its features from these (the forward
    that sampled a token already computed every state the lens needs), so it needs no second
    forward over the responses."""

    layers: tuple[int, ...]
    final_norm: bool = False


VIEW_STAGES = (None, "shaping", "rewards")  # later to earlier: the earliest read wins when needs merge


@dataclass(frozen=True)
class ForwardNeeds:
    """What an algorithm reads from forwards other than the update's, declared once per run
    (Algorithm.forward_needs); the trainer plans the scoring pass from it.

    view:          when observe_forward's view is first read: "rewards" (by reward_components or
                   keep_groups: the pass covers every sampled group), "shaping" (by shape_rewards
                   or later: the groups that train) or None (never).
    hidden_states: the view must carry every layer's hidden states.
    lens:          logit-lens values for the rollout engine to record while it samples, handed
                   to observe_probe (only asked of an engine that records them)."""

    view: str | None = None
    hidden_states: bool = False
    lens: LensProbe | None = None

    def __post_init__(self):
        if self.view not in VIEW_STAGES:
            raise ValueError(f"ForwardNeeds.view '{self.view}'; accepted: rewards, shaping, None")

    def merged(self, other: ForwardNeeds) -> ForwardNeeds:
        """Both sets of needs: the earlier view, hidden states if either wants them, the one probe."""
        if self.lens is not None and other.lens is not None and self.lens != other.lens:
            raise ValueError("two different logit-lens probes for one rollout engine")
        view = max(self.view, other.view, key=VIEW_STAGES.index)
        return ForwardNeeds(view, self.hidden_states or other.hidden_states, self.lens or other.lens)


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


def peft_base(model):
    """The transformers model inside peft's wrapper (the model itself where there is none): the
    one unwrap every reader of the model's own layout (layers, head, forward signature) uses."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def output_head(model):
    """(final norm, lm_head) of a causal LM, for the logit lens; works through peft and DDP wrappers."""
    inner = peft_base(getattr(model, "module", model))
    body = getattr(inner, "model", None)
    norm = getattr(body, "norm", None) if body is not None else None
    return norm, inner.get_output_embeddings()


def position_ids_for(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() computes them (the decode loop's prefill
    and the scoring forwards both use them, so a token sits at the same position in each)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def decoder_layers(model):
    """The decoder layers of a causal LM (`model.model.layers` in Llama, Qwen2, Mistral, Gemma),
    through peft and DDP wrappers, or None where the model is laid out otherwise."""
    inner = peft_base(getattr(model, "module", model))
    layers = getattr(getattr(inner, "model", None), "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) else None


def full_precision(t: torch.Tensor) -> torch.Tensor:
    """fp32 for half-precision values (bf16 logits lose too much for log-probs and lens values);
    fp64 and fp32 stay as they are, so a model run in float64 (the equality tests) is compared in
    float64 end to end."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def lens_token_logits(states: list[torch.Tensor], layers: list[int], last_layer: int, tokens: torch.Tensor, head,
                      norm=None) -> torch.Tensor:
    """The logit lens: [b, L] logit (fp32, or fp64 for an fp64 model) of token tokens[i] read through the output
    head from states[k][i], the hidden state [b, H] of layer layers[k]. `norm` (the final norm) is applied
    to every layer but `last_layer`, whose state transformers returns normalised already. A plain
    linear head needs only its row of each token (a dot product, not a projection onto the whole
    vocabulary); any other head is applied in full."""
    h = torch.stack([norm(state) if norm is not None and n != last_layer else state
                     for n, state in zip(layers, states)], dim=1)  # [b, L, H]
    weight = getattr(head, "weight", None)
    if isinstance(head, torch.nn.Linear) and weight is not None:
        w = full_precision(weight[tokens.to(weight.device)])  # [b, H]: the head's row of each token
        values = (full_precision(h) * w.unsqueeze(1)).sum(-1)
        if head.bias is not None:
            values = values + full_precision(head.bias[tokens]).unsqueeze(1)
        return values
    full = full_precision(head(h))  # an unusual head (wrapped, scaled): project fully
    return full.gather(-1, tokens.view(-1, 1, 1).expand(-1, h.shape[1], 1)).squeeze(-1)


def output_cache(out):
    """The KV cache a forward with use_cache returned (transformers 5 names it `cache`)."""
    cache = out.get("cache")
    return cache if cache is not None else getattr(out, "past_key_values", None)


def cache_keyword(model) -> str:
    """The forward's name for a KV cache: transformers 5 renamed `past_key_values` to `cache`
    (the old name warns)."""
    import inspect

    inner = peft_base(getattr(model, "module", model))
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
