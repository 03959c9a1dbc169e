"""Float64 end to end, for tests that assert two computations are the same.

Such a test compares two orders of the same float arithmetic. In float32 their difference is
rounding whose size depends on which kernels torch picks on the CPU at hand (AVX2, AVX-512, the
`default` set: ATEN_CPU_CAPABILITY), so a float32 tolerance tuned on one machine fails on the
next. In float64 the rounding is ~1e-16 relative, nine orders below any real error (a detached
cache, an off-by-one position), so a fixed tolerance of 1e-9 holds on every machine and still
fails on a wrong result.

A model cast with `.double()` is not yet float64 everywhere: Llama's RMSNorm computes its
variance in float32 and casts back. `float64_model` casts the model and, while the context is
open, lets the norm keep float64 input in float64 (float32 input is treated as before).
"""

from __future__ import annotations

import contextlib

import torch
from transformers.models.llama import modeling_llama

# Relative to the largest value compared: float64 rounding after a few thousand operations is
# ~1e-13; a wrong result differs by orders more than 1e-9 (a detached prompt cache: ~1e1).
FLOAT64_RTOL = 1e-9


def _norm_in_input_precision(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if hidden_states.dtype != torch.float64:
        return _float32_norm(self, hidden_states)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


_float32_norm = modeling_llama.LlamaRMSNorm.forward


@contextlib.contextmanager
def float64_norms():
    modeling_llama.LlamaRMSNorm.forward = _norm_in_input_precision
    try:
        yield
    finally:
        modeling_llama.LlamaRMSNorm.forward = _float32_norm


def assert_equal_in_float64(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Equal up to float64 rounding, relative to the largest expected value."""
    assert actual.dtype == expected.dtype == torch.float64, (actual.dtype, expected.dtype)
    scale = max(float(expected.abs().max()), 1e-30)
    torch.testing.assert_close(actual, expected, rtol=0, atol=FLOAT64_RTOL * scale, msg=lambda m: f"{what}: {m}")
