"""A KV cache written in place for the `hf` decode loop.

transformers' DynamicCache grows each layer's keys and values by concatenation: every decode step
copies the whole cache once per layer, so a step's cost grows with the response even where the
attention itself is cheap, and at a few hundred tokens that copy rivals reading the weights
(scripts/profile_decode.py shows it as aten::cat). The decode loop knows from the start how long
a response can be, so each full-attention layer gets one buffer of that capacity: a step writes
its new position in place, and the layer hands attention a view of the filled part. The values
are the same tensors element for element, so nothing sampled changes. A buffer holds the
longest response from the start (on a GPU that memory is taken at once; on CPU a page is
taken when a step first writes to it).

Layers of another kind (sliding windows, linear attention) keep their own update.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of the first `length` positions of
    buffers [rows, heads, capacity, head_dim]; update() writes in place while there is room and
    falls back to concatenation past the capacity."""

    # transformers' mask builder reads the padding mask's values back to the host at every decode
    # step, to skip the mask where nothing is padded, unless the cache is compileable (fixed
    # buffers, as this one's are): then it builds the mask on the device, with no read.
    is_compileable = True

    def __init__(self, layer: DynamicLayer, rows: torch.Tensor, capacity: int):
        super().__init__()
        self.device = layer.keys.device
        self.length = layer.keys.shape[-2]
        self._key_buffer = _reserve(layer.keys, rows, capacity)
        self._value_buffer = _reserve(layer.values, rows, capacity)
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self._key_buffer[:, :, :self.length]
        self.values = self._value_buffer[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:  # longer than reserved: grow as DynamicLayer does
            self._key_buffer = torch.cat([self.keys, key_states], dim=-2)
            self._value_buffer = torch.cat([self.values, value_states], dim=-2)
        else:
            self._key_buffer[:, :, self.length:end] = key_states
            self._value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if len(indices) <= self._key_buffer.shape[0]:
            # fewer rows (finished ones dropped): moved to the front of the same buffers, whose
            # pages are already taken; a new buffer would fault its pages in again on CPU
            kept = len(indices)
            self._key_buffer[:kept, :, :self.length] = self.keys[indices]
            self._value_buffer[:kept, :, :self.length] = self.values[indices]
            self._key_buffer, self._value_buffer = self._key_buffer[:kept], self._value_buffer[:kept]
        else:
            # only the filled positions are copied: on CPU the rest of a buffer is never touched,
            # so it takes no memory until a step writes there
            capacity = self._key_buffer.shape[-2]
            self._key_buffer = _reserve(self.keys, indices, capacity)
            self._value_buffer = _reserve(self.values, indices, capacity)
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        rows = torch.arange(self.keys.shape[0], device=self.device).repeat_interleave(repeats)
        self.batch_select_indices(rows)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, not {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)
        self._views()


def _reserve(states: torch.Tensor, rows: torch.Tensor, capacity: int) -> torch.Tensor:
    """A [len(rows), heads, capacity, head_dim] buffer holding states[rows] in its first positions."""
    buffer = states.new_empty((len(rows), states.shape[1], max(capacity, states.shape[-2]), states.shape[-1]))
    buffer[:, :, :states.shape[-2]] = states[rows]
    return buffer


def reserve_cache(cache, rows: torch.Tensor, capacity: int) -> bool:
    """Give each full-attention layer of `cache` (a transformers Cache after a prefill) the rows
    `rows` of its keys and values in a buffer of `capacity` positions, written in place from now
    on. Returns whether every layer could; the layers that could not are still selected to
    `rows`, so the cache is usable either way."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        cache.batch_select_indices(rows)
        return False
    every = True
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.dim() == 4:
            layers[i] = ReservedLayer(layer, rows, capacity)
        else:
            layer.batch_select_indices(rows)
            every = False
    return every
