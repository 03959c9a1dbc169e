"""Float32 weights copied once into a matmul library's own layout, and multiplied from it.

A weight that stays the same over many products (a decode batch's steps) can be copied once into
the layout the library's GEMM reads, instead of the library copying it at every call: MKL's sgemm
pack ("mkl", the one torch's inductor uses for frozen CPU models; it serves inputs of the row
count it was packed for, others run unpacked) or oneDNN's blocked layout ("onednn", any row
count). Which is faster, if either, depends on the CPU: core/cpu_calibration.py times them.
"""

from __future__ import annotations

import functools

import torch

# How float32 decode weights are multiplied: "none" as they are, else copied once per decode batch
# into that library's layout (engine/rollout/packed_linear.py)
PACKINGS = ("none", "mkl", "onednn")

@functools.cache
def mkl_packing_available() -> bool:
    return (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
            and hasattr(torch.ops.mkl, "_mkl_linear"))


@functools.cache
def onednn_packing_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def packings_available() -> tuple[str, ...]:
    """The packings this torch build can make ("none", multiplying the weights as they are, aside)."""
    return tuple(name for name, available in (("mkl", mkl_packing_available()),
                                              ("onednn", onednn_packing_available())) if available)


class PackedWeight:
    """A linear layer's float32 `weight` (out x in) and `bias`, packed for `packing` ("mkl" or
    "onednn") and inputs of `rows` rows."""

    def __init__(self, packing: str, weight: torch.Tensor, bias: torch.Tensor | None, rows: int):
        self.packing, self.weight, self.bias, self.rows = packing, weight, bias, rows
        if packing == "mkl":
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        elif packing == "onednn":
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        else:
            raise ValueError(f"packing '{packing}' cannot be packed; accepted: {', '.join(PACKINGS[1:])}")

    def serves(self, rows: int) -> bool:
        """Whether an input of `rows` rows multiplies the packed copy (MKL's: only the row count
        it was packed for)."""
        return self.packing == "onednn" or rows == self.rows

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        """x (rows x in, float32) times the weight, plus the bias."""
        if self.packing == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, self.bias, x.shape[0])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
