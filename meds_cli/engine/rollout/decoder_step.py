"""One decode step of a Llama-layout decoder (Llama, Qwen2: SmolLM2, Qwen2.5) run over its layers'
parts directly, for the `hf` decode loop on packed weights.

At a few rows a decode step's arithmetic is small, and reaching it through some 250 module calls
a step (peft's LoRA wrappers, the packed layers' forwards, transformers' decorators and layer
calls) costs a sixth of the step: SmolLM2 at 8 rows, 82-86 ms a step through the model's forward
against 69-71 ms here; 117-119 against 102-106 ms at 32 rows, 194-197 against 171-176 at 64.
The step calls the same functions in the same order as transformers' modeling code (the model's
own norms, rotary embedding, `apply_rotary_pos_emb`, causal mask, cache update, configured
attention function and MLP activation), and takes each linear layer's product from its packed
group (engine/rollout/packed_linear.py) as the layer's forward would, so its logits are
bit-identical to the model's forward (tests/test_decoder_step.py compares them).

It applies only where that holds, and `plan` returns None otherwise: model types llama and qwen2
with full attention in every layer and sdpa or eager attention; every linear layer packed (inside
packed_linears) and any LoRA adapter merged (inside merged_lora); no hook or replaced forward on
any module, except a logit-lens recorder's, whose states the step hands it itself (MEDS), and
Accelerate's mixed-precision wrapper of the model's forward while its autocast is on (bf16 on a
CPU: the weights are then bf16 copies, engine/rollout/packed_linear.py).
A step whose row count the weights are not packed for returns None too: the loop runs the
model's forward, which packs them.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers.masking_utils import create_causal_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from meds_cli.core.forward import peft_base
from meds_cli.engine.rollout.packed_linear import packed_group

MODEL_TYPES = ("llama", "qwen2")
ATTENTION = ("sdpa", "eager")
# transformers names the mask's cache argument `cache` from 5.20 on, `past_key_values` before
_MASK_CACHE = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


@dataclass
class _Layer:
    module: torch.nn.Module  # the decoder layer
    qkv: object  # packed groups: query/key/value stacked, output, gate/up stacked, down
    out: object
    gate_up: object
    down: object


class DecoderStep:
    """`step(tokens, attention_mask, positions, cache)`: the last position's logits [rows, V], or
    None where the weights are not packed for this many rows."""

    def __init__(self, body, layers: list[_Layer], head_group, config, lens=None):
        self.body, self.layers, self.head_group, self.config, self.lens = body, layers, head_group, config, lens
        self.groups = [head_group] + [g for layer in layers for g in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        first = layers[0].module.self_attn
        modeling = inspect.getmodule(type(first))
        self.rotary = modeling.apply_rotary_pos_emb
        self.attention = ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation,
                                                               modeling.eager_attention_forward)

    @classmethod
    def plan(cls, model, lens=None) -> DecoderStep | None:
        """The step for `model`, or None where it does not apply. With `lens` (an active
        LensRecorder) its hooks are allowed: the step records the states they would have."""
        inner = peft_base(getattr(model, "module", model))
        config, body = getattr(inner, "config", None), getattr(inner, "model", None)
        if (config is None or body is None or getattr(config, "model_type", None) not in MODEL_TYPES
                or getattr(config, "_attn_implementation", None) not in ATTENTION
                or any(t != "full_attention" for t in getattr(config, "layer_types", None) or ())
                or getattr(config, "pretraining_tp", 1) != 1
                or inner.training or not _untouched(model, lens.hook_ids if lens is not None else set())
                or type(getattr(body, "embed_tokens", None)) is not torch.nn.Embedding):
            return None
        layers = []
        for layer in getattr(body, "layers", ()):
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            groups = [_group_of(getattr(attn, "q_proj", None), 3), _group_of(getattr(attn, "o_proj", None), 1),
                      _group_of(getattr(mlp, "gate_proj", None), 2), _group_of(getattr(mlp, "down_proj", None), 1)]
            if any(g is None for g in groups) or getattr(attn, "sliding_window", None) is not None:
                return None
            layers.append(_Layer(layer, *groups))
        head = _group_of(inner.get_output_embeddings(), 1)
        if not layers or head is None:
            return None
        return cls(body, layers, head, config, lens)

    def __call__(self, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache):
        rows = tokens.shape[0]
        if not all(group.ready_for(rows) for group in self.groups):
            return None
        body = self.body
        hidden = body.embed_tokens.forward(tokens)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                  position_ids=positions, **{_MASK_CACHE: cache})
        cos, sin = body.rotary_emb.forward(hidden, position_ids=positions)
        lens = self.lens
        if lens is not None:
            lens.keep(0, hidden)
        for number, layer in enumerate(self.layers, start=1):
            block, attn, mlp = layer.module, layer.module.self_attn, layer.module.mlp
            normed = block.input_layernorm.forward(hidden)
            query, key, value = layer.qkv.multiply(normed)
            heads = (rows, 1, -1, attn.head_dim)
            query, key = self.rotary(query.view(heads).transpose(1, 2), key.view(heads).transpose(1, 2), cos, sin)
            key, value = cache.update(key, value.view(heads).transpose(1, 2), attn.layer_idx)
            attended, _ = self.attention(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling,
                                         position_ids=positions)
            hidden = hidden + layer.out.multiply(attended.reshape(rows, 1, -1).contiguous())[0]
            normed = block.post_attention_layernorm.forward(hidden)
            gate, up = layer.gate_up.multiply(normed)
            hidden = hidden + layer.down.multiply(mlp.act_fn.forward(gate) * up)[0]
            if lens is not None and number < len(self.layers):
                lens.keep(number, hidden)
        normed = body.norm.forward(hidden)
        if lens is not None:
            lens.keep(len(self.layers), normed)
        return self.head_group.multiply(normed)[0][:, -1]


def _group_of(layer, members: int):
    """The packed group `layer` (or the base layer of its LoRA wrapper) leads, with its `members`
    layers; None where it is not packed that way."""
    if layer is None:
        return None
    base = layer.get_base_layer() if hasattr(layer, "base_layer") else layer
    group = packed_group(base)
    return group if group is not None and len(group.layers) == members and group.layers[0] is base else None


def _live_adapter(module) -> bool:
    """Whether `module` is a LoRA wrapper with an active adapter not merged into its base weight
    (its forward then adds the adapter's path to the base layer's)."""
    if not hasattr(module, "base_layer") or getattr(module, "disable_adapters", False):
        return False
    adapters = {a for a in getattr(module, "active_adapters", ()) if a in getattr(module, "lora_A", {})}
    return bool(adapters) and set(getattr(module, "merged_adapters", ())) != adapters


def _untouched(model, allowed_hooks: set[int]) -> bool:
    """Every module runs as the step runs it: no forward hooks but `allowed_hooks` (ids), no
    forward replaced except the packed linear layers', no LoRA adapter live beside its base layer."""
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return False
    for m in model.modules():
        if set(m._forward_hooks) - allowed_hooks or set(m._forward_pre_hooks) - allowed_hooks:
            return False
        if ("forward" in m.__dict__ and packed_group(m) is None and not _autocast_wrapper(m, model)) \
                or _live_adapter(m):
            return False
    return True


def _autocast_wrapper(module, model) -> bool:
    """Whether `module` is the model itself with Accelerate's mixed-precision forward (autocast,
    outputs to float32; Accelerate keeps the original as `_original_forward`), met while that
    autocast is on anyway: the trainer samples under the update's autocast (bf16 on a CPU), so
    the step, computing under it, computes what the wrapper would."""
    return (module is model and hasattr(module, "_original_forward")
            and torch.is_autocast_enabled(next(module.parameters()).device.type))
