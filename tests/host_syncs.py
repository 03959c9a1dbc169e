"""Counts the calls that make a CUDA device wait for the host to read a result, on any device.

On a GPU, reading a tensor's value (`.item()`, `.tolist()`, `bool()`/`int()` of a tensor, an
`if` on one), and every operation whose output size depends on the values (`nonzero`, indexing
with a boolean mask, `masked_select`, `unique`), blocks the host until the GPU has finished
everything queued before it. On CPU nothing waits, but the same calls happen: a
TorchFunctionMode sees each of them, so a test on CPU counts what the code does on a GPU.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
DATA_SIZED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "repeat_interleave"}
INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}


def _holds_bool_tensor(index) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostSyncs(TorchFunctionMode):
    """Within the block, `self.count` is the number of host syncs so far; `self.kinds` by call."""

    def __init__(self):
        super().__init__()
        self.kinds = Counter()

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS or name in DATA_SIZED and not (name == "repeat_interleave" and "output_size" in kwargs):
            self.kinds[name] += 1
        elif name in INDEXING and len(args) > 1 and _holds_bool_tensor(args[1]):
            self.kinds[f"{name}[bool mask]"] += 1
        elif name == "where" and len(args) + len(kwargs) == 1:
            self.kinds["where(condition)"] += 1
        return func(*args, **kwargs)
