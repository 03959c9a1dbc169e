"""The decode loop's linear layers on CPU through packed-weight matmuls (core/packed_matmul.py).

At the few rows of a training step (8 samples of 2 prompts) a decode step is its weight
matmuls, and MKL's float32 GEMM at 8 rows reads a weight at half the rate it reads it for one
row: every call first copies the weight into MKL's panel layout. The weights do not change
while a batch decodes, so each is packed once per decode batch and every step multiplies the
packed copy. With MKL's sgemm pack (`packing` "mkl", the one torch's inductor uses for frozen CPU
models) all linear layers of SmolLM2 at 8 rows took 58 ms a step instead of 83 on an Intel Xeon,
14% less at 32 to 128 rows (2 threads; scripts/bench_generate.py shows what it does to tokens per
second); on an AMD EPYC it gained nothing, where oneDNN's packing ("onednn") took 1.44-1.57x less
time than plain F.linear. The CPU's calibration (core/cpu_calibration.py) picks one.

The packed matmul sums in the library's own order: a token's log-prob moves by float32 rounding (about
1e-5 on SmolLM2), as it does between batch sizes or between CPUs, so a draw can differ from
the unpacked one where two tokens' cumulative probabilities meet at the uniform. Layers are
left alone on a GPU, in float64 or half precision, under autocast and where gradients flow.

With `bf16` (a CPU run computing under bf16 autocast, engine/training/precision.py) the same
groups multiply bf16 copies of the weights instead, made once per decode batch as the packed
copies are: autocast would otherwise convert every float32 weight to bf16 again at every step
(decoding took twice as long as in float32 on a Xeon with AMX-BF16). The product is autocast's own (input
rounded to bf16, bf16 weights, bf16 output), so decoding computes what the scoring pass and the
update compute under autocast.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from meds_cli.core.packed_matmul import PackedWeight, packings_available
from meds_cli.engine.rollout.decode_rows import free_memory

# the packed copies may take at most 1 / PACKED_MEMORY_SHARE of the free memory
PACKED_MEMORY_SHARE = 4
# Packing pays at few rows: all SmolLM2 linears took 12% less at 256 rows, 2.5% at 512 and the
# same at 1,024, where repacking after rows end (0.25 s) would cost more than it saves.
PACKED_ROWS_MOST = 256
# Packing a weight costs about what a dozen decode steps save with it: for a short response the
# plain matmul is faster (SmolLM2, 8 and 64 rows: 8 new tokens 12% and 4% slower packed, 16 new
# tokens 6% and 4% faster; scripts/bench_generate.py --lengths 8,16,32 --samplers engine,unpacked).
PACKED_MIN_NEW_TOKENS = 16


def can_pack(weight: torch.Tensor, bf16: bool = False, packing: str = "mkl") -> bool:
    """Whether `weight` (a linear layer's) can be copied for the decode loop: a plain float32 CPU
    tensor; for a float32 `packing` (not `bf16`), with torch built with that library's ops."""
    return (type(weight.data) is torch.Tensor and weight.device.type == "cpu" and weight.dtype == torch.float32
            and weight.dim() == 2 and (bf16 or packing in packings_available()))


def bf16_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A bf16 copy of a weight, the rounding autocast applies (the one conversion a decode batch
    makes of each weight; tests count the calls)."""
    return tensor.to(torch.bfloat16)


# Linear layers that transformers' decoder layers call one after another on the same input
# (attention's query, key and value; the MLP's gate and up projections): their weights are
# stacked and multiplied in one packed matmul, one MKL call (and one wake-up of its threads)
# instead of three or two.
SAME_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _PackedGroup:
    """Linear layers called on one input, multiplied as one stacked, packed weight; the first
    member called on a new input computes every member's output, the others take theirs.

    The copy is made for the row count of two inputs in a row: not for a prefill's many rows,
    once per decode batch. MKL packs for one row count (a call with another runs unpacked, at the
    old speed), so its copy is made again after the loop drops finished rows (up to
    PACKED_ROWS_MOST); oneDNN's serves any row count."""

    def __init__(self, layers: list[torch.nn.Linear], bf16: bool = False, packing: str = "mkl"):
        self.layers, self.bf16, self.packing = layers, bf16, packing
        self.widths = [layer.out_features for layer in layers]
        self.input, self.input_version, self.input_rows, self.outputs = None, -1, 0, None
        self.packed, self.weight, self.bias = None, None, None

    def ready_for(self, rows: int) -> bool:
        """Whether `multiply` takes inputs of `rows` rows (packed float32: a copy serving them)."""
        return self.bf16 or (self.packed is not None and self.packed.serves(rows))

    def forward(self, member: int, x: torch.Tensor, unpacked_forward) -> torch.Tensor:
        if self.bf16:
            return self._bf16_forward(member, x, unpacked_forward)
        if (x.dtype != torch.float32 or torch.is_autocast_enabled("cpu")
                or (torch.is_grad_enabled() and (x.requires_grad or self.layers[member].weight.requires_grad))):
            return unpacked_forward(x)
        if x is not self.input or x._version != self.input_version:  # a new input (or changed in place)
            previous_rows, rows = self.input_rows, x.numel() // x.shape[-1]
            self.input, self.input_version, self.input_rows, self.outputs = x, x._version, rows, None
            if rows <= PACKED_ROWS_MOST and not self.ready_for(rows) and rows == previous_rows:
                self._pack(rows)
            if rows <= PACKED_ROWS_MOST and self.ready_for(rows):
                self.outputs = self.multiply(x)
        return unpacked_forward(x) if self.outputs is None else self.outputs[member]

    def _bf16_forward(self, member: int, x: torch.Tensor, unpacked_forward) -> torch.Tensor:
        if x.dtype not in (torch.float32, torch.bfloat16) or (
                torch.is_grad_enabled() and (x.requires_grad or self.layers[member].weight.requires_grad)):
            return unpacked_forward(x)
        if x is not self.input or x._version != self.input_version:
            self.input, self.input_version, self.outputs = x, x._version, self.multiply(x)
        return self.outputs[member]

    def multiply(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every member's output for `x`, from the packed weight (serving x's row count) or the
        bf16 copy, as the members' forwards return them (engine/rollout/decoder_step.py calls
        this directly)."""
        flat = x.reshape(-1, x.shape[-1])
        if self.bf16:
            if self.weight is None:  # at the first call (LoRA's own matrices, merged away, never are)
                self._stack()
                self.weight = bf16_copy(self.weight)
                self.bias = bf16_copy(self.bias) if self.bias is not None else None
            out = torch.nn.functional.linear(flat.to(torch.bfloat16), self.weight, self.bias)
        else:
            out = self.packed.multiply(flat)
        return out.view(*x.shape[:-1], out.shape[-1]).split(self.widths, dim=-1)

    def _stack(self) -> None:
        weights = [layer.weight.detach() for layer in self.layers]
        self.weight = weights[0] if len(weights) == 1 else torch.cat(weights)
        biases = [layer.bias.detach() for layer in self.layers if layer.bias is not None]
        self.bias = None if not biases else biases[0] if len(biases) == 1 else torch.cat(biases)

    def _pack(self, rows: int) -> None:
        if self.weight is None:
            self._stack()
        self.packed = PackedWeight(self.packing, self.weight, self.bias, rows)


def _same_input_groups(model: torch.nn.Module, layers: list[torch.nn.Linear]) -> list[list[torch.nn.Linear]]:
    """`layers` as groups: the members of a SAME_INPUT group under one parent module (with the
    same input width and all or none with a bias) together, every other layer alone. Names are
    read through peft's wrappers (`q_proj.base_layer` is `q_proj`)."""
    wanted = {id(layer) for layer in layers}
    by_name = {name.removesuffix(".base_layer"): module for name, module in model.named_modules()
               if id(module) in wanted}
    groups, grouped = [], set()
    for name in by_name:
        parent, _, leaf = name.rpartition(".")
        for names in SAME_INPUT:
            members = [by_name.get(f"{parent}.{n}" if parent else n) for n in names]
            if (leaf == names[0] and all(m is not None for m in members)
                    and len({m.in_features for m in members}) == 1 and len({m.bias is None for m in members}) == 1):
                groups.append(members)
                grouped.update(id(m) for m in members)
    return groups + [[layer] for layer in layers if id(layer) not in grouped]


def packed_group(layer: torch.nn.Module) -> _PackedGroup | None:
    """The packed group `layer` belongs to inside packed_linears, or None."""
    return getattr(layer.__dict__.get("forward"), "group", None)


def _member_forward(group: _PackedGroup, member: int, unpacked_forward):
    def forward(x: torch.Tensor) -> torch.Tensor:
        return group.forward(member, x, unpacked_forward)

    forward.group = group
    return forward


@contextmanager
def packed_linears(model: torch.nn.Module, *, bf16: bool = False, packing: str = "mkl"):
    """Within the block, every torch.nn.Linear of `model` whose weight can_pack multiplies a
    copy of its weight packed for `packing` ("mkl", "onednn"; stacked with the layers that share
    its input; with `bf16`, a bf16 copy instead); on exit each layer has its own forward back and
    the copies are freed. Pack inside any context that swaps weights (merged_lora), so the copies
    are of the weights in use. Nothing is packed where the copies (packed: up to three times the
    weights' size, stacked weights and the library's padded panels; bf16: half) would take more
    than a quarter of the free memory."""
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and can_pack(m.weight, bf16, packing)]
    size = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    copies = size // 2 if bf16 else 3 * size
    if layers and copies * PACKED_MEMORY_SHARE > free_memory(layers[0].weight.device):
        layers = []
    patched = []
    try:
        for group in _same_input_groups(model, layers):
            shared = _PackedGroup(group, bf16, packing)
            for member, layer in enumerate(group):
                own = layer.__dict__.get("forward")  # a hook library's wrapper, kept and restored
                layer.forward = _member_forward(shared, member, own or layer.__class__.forward.__get__(layer))
                patched.append((layer, own))
        yield len(patched)
    finally:
        for layer, own in patched:
            if own is None:
                del layer.forward
            else:
                layer.forward = own
