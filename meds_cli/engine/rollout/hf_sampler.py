"""The `hf` rollout engine: a decode loop over the training model itself, in this process.

Why not `model.generate`: for RL rollouts the work is G samples of the same prompt, and
generate's general machinery costs time that this shape does not need. The loop here
  - runs one prefill per distinct prompt and copies its KV cache to the G rows that share it,
    into buffers with room for the whole response, written in place (engine/rollout/reserved_cache.py);
  - drops the rows that ended from the batch once they are a quarter of it (little decoding of
    padding after an early EOS, and few copies of the KV cache);
  - samples every row from its own pre-drawn uniforms (inverse CDF), so a sample depends on its
    seed only, never on the rows beside it, in one vectorised call per step;
  - decodes with the LoRA adapter merged into the base weights (one matmul per linear layer
    instead of three), restoring the original weight tensors afterwards, untouched;
  - reads values back from the device once per step (the count of ended rows, through
    `host_read`; top_p < 1 adds one, two where a nucleus passes its first look): on a GPU each read
    makes the host wait for the queued kernels, so everything else stays on the device;
  - on CPU, multiplies weights packed for MKL once per decode batch (engine/rollout/packed_linear.py),
    for responses long enough to pay for the packing where this CPU's calibration measured packing
    faster (meds_cli/core/cpu_calibration.py), or, under bf16 autocast, bf16 copies of the
    weights made once per decode batch (logits and sampling in float32), and runs the decode steps of Llama-layout
    models over those weights without the model's module calls (engine/rollout/decoder_step.py).
It returns the sampler's log-prob of each token under the distribution it sampled from
(temperature and top-p applied), for importance-sampling corrections and mismatch metrics, and,
when the settings carry a LensProbe, each token's logit-lens values (engine/rollout/lens_probe.py).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from meds_cli.core.cpu_calibration import cpu_fast_paths
from meds_cli.core.fields import at_least, doc
from meds_cli.core.forward import cache_keyword, output_cache, position_ids_for
from meds_cli.core.packed_matmul import PACKINGS
from meds_cli.engine.rollout.decoder_step import DecoderStep
from meds_cli.engine.rollout.lens_probe import LensRecorder, can_record_lens
from meds_cli.engine.rollout.packed_linear import PACKED_MIN_NEW_TOKENS, packed_linears
from meds_cli.engine.rollout.reserved_cache import reserve_cache
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings, split_by_request
from meds_cli.engine.rollout.stop_strings import StopStringWatch


def choose_tokens(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float,
                  top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` [a, V] from `uniforms` [a] in [0, 1) by inverse CDF, and its
    log-prob under the distribution sampled from (softmax(logits / T), cut to the top-p nucleus
    and renormalised). Temperature 0 is greedy (log-prob of the argmax at temperature 1).

    The nucleus keeps a token while the mass of the more likely tokens before it is below top_p
    (at least one token), as HF's and vLLM's top-p do."""
    if temperature <= 0:
        tokens = logits.argmax(-1)
        return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1) - logits.logsumexp(-1)
    scaled = logits if temperature == 1 else logits / temperature
    peak = scaled.amax(-1, keepdim=True)
    weights = (scaled - peak).exp_()  # probabilities up to one factor per row: no pass to normalise
    order = None
    if top_p < 1.0:
        weights, order = _nucleus(weights, top_p)
    cdf = weights.cumsum(-1)
    mass = cdf[:, -1:]
    # u * mass can round up to the whole mass: held just below it, the draw is the last token with
    # weight (the inverse CDF's limit as u -> 1), found without reading anything back to the host
    target = torch.minimum(uniforms[:, None] * mass, torch.nextafter(mass, torch.zeros_like(mass)))
    index = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    if order is not None:
        # past the nucleus the weights are zero and the cumulative sum flat, up to the rounding of
        # a parallel scan: a draw there takes the nucleus's most likely token (sorted first)
        index = torch.where(weights.gather(-1, index) > 0, index, 0)
    tokens = (order.gather(-1, index) if order is not None else index).squeeze(-1)
    logp = scaled.gather(-1, tokens[:, None]) - peak - mass.log()
    return tokens, logp.squeeze(-1)


def _nucleus(weights: torch.Tensor, top_p: float, first_look: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p nucleus of each row of unnormalised `weights`: (kept weights in descending
    order, zero past the nucleus; their token ids). A full sort of the vocabulary costs ten times
    a top-k of a few hundred, and real next-token distributions put the nucleus there: sort
    the whole vocabulary only for the rows whose nucleus reaches past the first look (sorting
    every row when one needs it took 1.9 s a step at 1,024 rows, twice the model's forward)."""
    total = weights.sum(-1, keepdim=True)
    values, order = weights.topk(min(first_look, weights.shape[-1]))
    if values.shape[-1] < weights.shape[-1]:
        wide = values.sum(-1) < top_p * total.squeeze(-1)
        count = host_read(wide.sum())  # a sort's shape depends on it: the one read of a nucleus
        if count:
            rows = _first_true(wide, count)
            values, order = _widen(weights, values, order, rows, top_p * total)
    keep = values.cumsum(-1) - values < top_p * total
    keep[:, 0] = True
    return values * keep, order


def _widen(weights, values, order, rows, threshold) -> tuple[torch.Tensor, torch.Tensor]:
    """`values` and `order` (a top-k of each row) with `rows` sorted in full instead, all cut to
    the longest of their nuclei: the other rows are padded with zero weights (never drawn)."""
    sorted_values, sorted_order = weights[rows].sort(-1, descending=True)
    in_nucleus = sorted_values.cumsum(-1) - sorted_values < threshold[rows]
    width = max(values.shape[-1], host_read(in_nucleus.sum(-1).max()))
    wide_values, wide_order = values.new_zeros(len(weights), width), order.new_zeros(len(weights), width)
    wide_values[:, :values.shape[-1]], wide_order[:, :values.shape[-1]] = values, order
    wide_values[rows], wide_order[rows] = sorted_values[:, :width], sorted_order[:, :width]
    return wide_values, wide_order


def host_read(tensor: torch.Tensor):
    """`tensor`'s values on the host (a number or nested lists). The decode loop reads the device
    only through this: on a GPU each read waits for every kernel queued before it, so the loop
    keeps them to one per step (tests/test_decode_syncs.py counts them)."""
    return tensor.tolist()


def _first_true(flags: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the `count` true entries of the boolean vector `flags`, in order: what
    `flags.nonzero()` gives, without the read of the count it makes on a GPU."""
    return (~flags).to(torch.int8).argsort(stable=True)[:count]


def row_uniforms(seeds: Sequence[int], steps: int) -> torch.Tensor:
    """[len(seeds), steps] uniforms, row i drawn from a generator seeded with seeds[i]."""
    out = torch.empty(len(seeds), steps)
    for i, seed in enumerate(seeds):
        out[i] = torch.rand(steps, generator=torch.Generator().manual_seed(int(seed) % 2**63))
    return out


def _lora_layers(model):
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft absent: nothing can be wrapped
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextmanager
def merged_lora(model):
    """Decode with each LoRA layer's adapter folded into its base weight.

    The merged weight is a new tensor W + ΔW put in place of W for the duration; on exit the
    original tensor object is put back, so the weights after sampling are bit-identical to
    those before (peft's merge/unmerge subtracts ΔW again and drifts by rounding). Costs one
    extra copy of the adapted weights while sampling. Sharded (DTensor) or already merged
    layers are left as they are."""
    swapped = []
    try:
        for layer in _lora_layers(model):
            base = layer.get_base_layer()
            weight = getattr(base, "weight", None)
            active = [a for a in layer.active_adapters if a in getattr(layer, "lora_A", {})]
            if (weight is None or type(weight.data) is not torch.Tensor or layer.merged or layer.disable_adapters
                    or not active or not hasattr(layer, "get_delta_weight")):
                continue
            original = weight.data
            merged = original.clone()
            for adapter in active:
                merged += layer.get_delta_weight(adapter).to(merged.dtype)
            weight.data = merged
            # peft's forward uses the base layer alone while `merged` is true
            layer.merged_adapters = list(active)
            swapped.append((layer, weight, original))
        yield
    finally:
        for layer, weight, original in swapped:
            weight.data = original
            layer.merged_adapters = []


@torch.no_grad()
def decode(model, requests: Sequence[SampleRequest], settings: SamplingSettings, pad_id: int, *,
           direct_steps: bool = True, text_of: Callable[[list[int]], str] | None = None) -> list[list[Sample]]:
    """Sample every request's responses in one batch: one prefill per prompt, then one forward
    per new token over the rows still running (with `direct_steps`, a DecoderStep where one
    applies). `text_of` (a tokenizer's decode) finds settings.stop_strings."""
    watch = None
    if settings.stop_strings:
        if text_of is None:
            raise ValueError("stop strings need the tokenizer's decode (HFEngine's tokenizer)")
        watch = StopStringWatch(text_of, settings.stop_strings, sum(r.n for r in requests))
    if settings.lens is None:
        return _decode(model, requests, settings, pad_id, None, direct_steps, watch)
    with LensRecorder(model, settings.lens) as lens:
        return _decode(model, requests, settings, pad_id, lens, direct_steps, watch)


def _decode(model, requests, settings: SamplingSettings, pad_id: int, lens: LensRecorder | None,
            direct_steps: bool, watch: StopStringWatch | None) -> list[list[Sample]]:
    device = next(model.parameters()).device
    width = max(len(r.prompt_ids) for r in requests)
    ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, request in enumerate(requests):
        if request.prompt_ids:
            ids[i, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            mask[i, width - len(request.prompt_ids):] = 1
    positions = position_ids_for(mask)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    keyword = cache_keyword(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = output_cache(out)
    counts = torch.tensor([r.n for r in requests])
    rows = torch.repeat_interleave(torch.arange(len(requests)), counts).to(device)
    budgets = [r.budget(settings) for r in requests]
    steps = max(budgets)
    # a row's own budget, read only where the requests' budgets differ (tool turns: docs/tools.md)
    limit = (torch.repeat_interleave(torch.tensor(budgets), counts).to(device)
             if min(budgets) < steps else None)
    # the prompt's keys and values, copied to each of its samples, with room for the responses
    reserve_cache(cache, rows, width + steps)
    logits = out.logits[:, -1].float()[rows]
    mask, next_position = mask[rows], positions[rows, -1] + 1
    del out
    if lens is not None:
        lens.select(rows)

    # drawn for the settings' whole budget, whatever this batch's: a sample's uniforms are its seed's alone
    uniforms = row_uniforms([s for r in requests for s in r.seeds], settings.max_new_tokens)[:, :steps].to(device)
    total = len(rows)
    tokens_out = torch.zeros((total, steps), dtype=torch.long, device=device)
    logp_out = torch.zeros((total, steps), device=device)
    lens_out = (torch.zeros((total, steps, len(settings.lens.layers)), dtype=lens.dtype, device=device)
                if lens is not None else None)
    lengths = torch.zeros(total, dtype=torch.long, device=device)
    stopped = torch.zeros(total, dtype=torch.bool, device=device)
    paused = [False] * total  # after a stop string (watch)
    running_rows = list(range(total))  # `running` on the host, kept only with a watch
    stop = torch.tensor(settings.stop_ids, dtype=torch.long, device=device)
    running = torch.arange(total, device=device)  # original row of each batch row
    # Rows that ended stay in the batch (their draws discarded) until they are a quarter of it:
    # dropping a row copies every layer's KV cache, which at hundreds of rows costs more than
    # decoding a few dead rows for a few more steps.
    alive = torch.ones(total, dtype=torch.bool, device=device)
    step = DecoderStep.plan(model, lens) if direct_steps else None  # None: the model's forward runs
    for t in range(steps):
        if t < settings.min_new_tokens and stop.numel():
            logits[:, stop] = float("-inf")
        token, logp = choose_tokens(logits, uniforms[running, t], settings.temperature, settings.top_p)
        # Every batch row is written, ended ones too: their draws land past their length, which
        # is all that is read of them, and nothing here has to know on the host which rows live.
        tokens_out[running, t] = token
        logp_out[running, t] = logp
        if lens is not None:  # the states of the forward whose logits chose this token
            lens_out[running, t] = lens.values(token)
        lengths[running] += alive
        ended = torch.isin(token, stop) & alive
        stopped[running] |= ended
        alive &= ~ended
        if limit is not None:
            alive &= lengths[running] < limit[running]
        if watch is not None:
            dead = _pause_at_stop_strings(watch, token, alive, running_rows, paused)
        if t == steps - 1:
            break
        if watch is None:
            dead = host_read((~alive).sum())  # the step's one read back to the host
        if dead == len(alive):
            break
        if dead * 4 >= len(alive):
            keep = _first_true(alive, len(alive) - dead)
            if watch is not None:
                running_rows = [running_rows[k] for k in host_read(keep)]
            running, token, mask, next_position = running[keep], token[keep], mask[keep], next_position[keep]
            alive = alive[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        logits = step(token[:, None], mask, next_position[:, None], cache) if step is not None else None
        if logits is None:  # no direct step, or the weights are not yet packed for this many rows
            out = model(input_ids=token[:, None], attention_mask=mask, position_ids=next_position[:, None],
                        use_cache=True, **{keyword: cache})
            logits = out.logits[:, -1]
            del out
        logits = logits.float()
        next_position = next_position + 1

    tokens_out, logp_out, lengths, stopped = tokens_out.cpu(), logp_out.cpu(), lengths.tolist(), stopped.tolist()
    lens_out = lens_out.cpu() if lens_out is not None else None
    samples = [Sample(tokens_out[i, :lengths[i]].tolist(), stopped[i], logp_out[i, :lengths[i]].tolist(),
                      lens_out[i, :lengths[i]].clone() if lens_out is not None else None, paused=paused[i])
               for i in range(total)]
    return split_by_request(requests, samples)


def _pause_at_stop_strings(watch: StopStringWatch, token: torch.Tensor, alive: torch.Tensor,
                           running_rows: list[int], paused: list[bool]) -> int:
    """End the live rows whose newest token completes a stop string (marked `paused`); the number
    of ended batch rows. The step's one read to the host: the tokens with the live flags."""
    tokens, live = host_read(torch.stack([token, alive.long()]))
    hits = watch.paused(running_rows, tokens, live)
    for position in hits:
        paused[running_rows[position]] = True
    if hits:
        alive[torch.tensor(hits, device=alive.device)] = False
    return len(live) - sum(live) + len(hits)


def batches_of(requests: Sequence[SampleRequest], rows: int) -> list[list[SampleRequest]]:
    """Consecutive requests grouped so that a batch holds at most `rows` samples; a request with
    more samples than that is split into several (each keeps its own seeds)."""
    batches, current, size = [], [], 0
    for request in requests:
        seeds = list(request.seeds)
        while seeds:
            room = rows - size
            if room == 0:
                batches.append(current)
                current, size = [], 0
                room = rows
            part, seeds = seeds[:room], seeds[room:]
            current.append(replace(request, seeds=tuple(part)))
            size += len(part)
    if current:
        batches.append(current)
    return batches


def cpu_bf16_autocast(model) -> bool:
    """Whether `model` (on CPU) is asked to compute under bf16 autocast: the trainer samples under
    the update's autocast (train.mixed_precision bf16 on CPU), and decoding then multiplies bf16
    copies of the weights, made once per batch (packed_linears)."""
    return (next(model.parameters()).device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16)


@dataclass
class HFConfig:
    """rollout.hf: the settings of the hf decode loop (engine hf, and hf-worker's copy of it)."""

    generation_batch_size: int = doc(32, "sequences per decode batch of the hf engine (rollout.generation_batch_size "
                                         "before; that key is still read)", at_least(1))


class HFEngine:
    """The rollout engine on the training model: nothing to push after an update (it samples
    from the live weights), nothing to release."""

    name = "hf"
    reads_policy_weights = True  # it decodes with the live (gathered) policy

    def __init__(self, model, pad_id: int, batch_size: int, *, merge_lora: bool = True,
                 packing: str | None = None, direct_steps: bool = True, tokenizer=None):
        """`packing`: decode float32 from weights packed for "mkl" or "onednn", or "none"; None:
        the one this CPU's calibration (core/cpu_calibration.py) measured fastest. `tokenizer`:
        its decode finds SamplingSettings.stop_strings (tool turns; None: none can be asked)."""
        self.model, self.pad_id, self.batch_size = model, pad_id, max(1, batch_size)
        self.text_of = tokenizer.decode if tokenizer is not None else None
        if packing is None:  # asked once here, not at every generate: the CPU does not change
            on_cpu = next(model.parameters()).device.type == "cpu"
            packing = cpu_fast_paths().paths.float32_packing if on_cpu else "none"
        if packing not in PACKINGS:
            raise ValueError(f"packing '{packing}' is unknown; accepted: {', '.join(PACKINGS)}")
        self.merge_lora, self.packing, self.direct_steps = merge_lora, packing, direct_steps
        self.records_lens = can_record_lens(model)

    def generate(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[list[Sample]]:
        was_training = self.model.training
        self.model.eval()
        bf16 = cpu_bf16_autocast(self.model)
        pack = not bf16 and self.packing != "none" and settings.max_new_tokens >= PACKED_MIN_NEW_TOKENS
        try:
            with (merged_lora(self.model) if self.merge_lora else nullcontext(),
                  packed_linears(self.model, bf16=bf16, packing=self.packing) if pack or bf16 else nullcontext()):
                out = []
                for batch in batches_of(requests, self.batch_size):
                    out.extend(decode(self.model, batch, settings, self.pad_id, direct_steps=self.direct_steps,
                                      text_of=self.text_of))
        finally:
            self.model.train(was_training)
        # undo the splitting of batches_of: the samples of each request, in seed order
        return split_by_request(requests, [sample for part in out for sample in part])

    # the RolloutEngine members with nothing to do here: it samples from the live weights, holds
    # nothing of the update's memory, and starts nothing
    def policy_updated(self) -> None:
        pass

    def policy_settled(self, version: int) -> None:
        pass

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass

