"""Padding-free forwards (`train.padding_free`): the rows of a micro-batch laid end to end.

Each sequence (a row's real prompt tokens, then its response up to its last masked-in token)
is put in a packed row after the others, its `position_ids` restarting at 0. With no 2-D
attention mask, transformers (masking_utils.find_packed_sequence_indices) recognises the restarts
and builds the block-diagonal causal mask itself for `sdpa`, `eager` and `flex_attention`;
`flash_attention_2/3` run the same layout as variable-length attention. The values read at each
sequence's response positions are scattered back to the batch's [b, R] layout, so the loss and
every algorithm see what a padded forward gives them.

Shared prompts: a group's prompt once, then each of its responses, every response attending to
the prompt and to itself. No position-id layout says that, so where the attention takes an
arbitrary mask (`sdpa`, `eager`) the mask is written here (4-D, prefix-sharing); elsewhere each
response carries its own copy of the prompt.

Packed rows are as wide as the longest sequence (or, where attention is variable-length, one row
of everything): a mask-based attention computes every query against every key of its row, so
one long row would cost the square of the micro-batch's tokens; rows as wide as the longest
sequence cost little more than the sequences' own squares, for a little padding at row ends. For
the same reason a prompt is shared by as many response tokens as balance its copies against the
attention they add (shared_response_tokens), not by all G responses at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from meds_cli.core.forward import output_head
from meds_cli.engine.training.micro_batches import prompt_keys, row_lengths

PACKED_POSITION_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")
MASKED_ATTENTION = ("sdpa", "eager")  # take a 4-D mask as it is: prefix sharing written here
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")  # no cost across sequences: one row
PADDING_FREE_SETTINGS = ["auto", "true", "false"]


def attention_implementation(model) -> str:
    """The attention implementation the model's config names, through peft and DDP wrappers."""
    inner = getattr(model, "module", model)
    config = getattr(inner, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


DEFAULT_PAIRS_PER_TOKEN = 3000.0  # SmolLM2-135M's figure, for a config that does not say its sizes


def pairs_per_token(config) -> float:
    """How many attention (query, key) pairs cost what one token's matrix products cost, in a
    decoder layer's FLOPs: a token runs 2 x (the layer's linear weights) multiply-adds, a pair
    4 x heads x head size (q.k and p.v). Machine-independent; the kernels' own efficiencies are not
    in it (on the 2-core EPYC of docs/long-tailed-batches.md, masked CPU attention ran at about
    2.5 times fewer pairs per token's time)."""
    try:
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        head = int(getattr(config, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        intermediate = int(config.intermediate_size)
    except (AttributeError, TypeError, ValueError):
        return DEFAULT_PAIRS_PER_TOKEN
    linear = hidden * heads * head * 2 + hidden * kv_heads * head * 2 + 3 * hidden * intermediate
    return 2 * linear / (4 * heads * head)


@dataclass(frozen=True)
class Packing:
    """How the run's forwards lay out their rows: `on` (packed), `masked` (a prefix-sharing mask
    can be written: shared prompts stay shared), `one_row` (variable-length attention: all
    sequences in one row)."""

    on: bool = False
    masked: bool = False
    one_row: bool = False
    # attention pairs that cost one token's matrix products (the model's; not part of the layout choice)
    pairs_per_token: float = field(default=DEFAULT_PAIRS_PER_TOKEN, compare=False)

    @classmethod
    def for_model(cls, model, setting: str | bool = "auto") -> Packing:
        setting = str(setting).lower()
        if setting not in PADDING_FREE_SETTINGS:
            raise ValueError(f"train.padding_free '{setting}'; accepted: auto, true, false")
        implementation = attention_implementation(model)
        if setting == "false" or (setting == "auto" and implementation not in PACKED_POSITION_ATTENTION):
            return cls()
        inner = getattr(model, "module", model)
        return cls(True, implementation in MASKED_ATTENTION, implementation in VARLEN_ATTENTION,
                   pairs_per_token(getattr(inner, "config", None)))


PADDED = Packing()  # micro-batches padded (train.padding_free false; the functions' default)


def padding_free_line(packing: Packing, setting: str, implementation: str, share_prompts: bool) -> str:
    """The line a run says about its layout, and why."""
    if not packing.on:
        why = "train.padding_free=false" if setting == "false" else f"{implementation} attention takes no packed rows"
        return f"padding-free: off ({why}): micro-batches run padded"
    sharing = ""
    if share_prompts:
        sharing = ("; shared prompts by a prefix-sharing mask" if packing.masked else
                   f"; shared prompts repeated per response ({implementation} takes no prefix-sharing mask)")
    return f"padding-free: on ({implementation} attention, position ids restart per sequence){sharing}"


@dataclass
class PackedRows:
    """A micro-batch laid end to end.

    input_ids, position_ids [k, W]; attention_mask: None (the library's packed-sequence mask) or a
    4-D prefix-sharing mask [k, 1, W, W]; layout [b, C]: for each (row, column) of the padded
    layout (C = prompt width + response width), the flat index into [k * W] where that token sits
    in the packed rows, -1 where the padded layout has padding; score_from [n] and score_to [n]: the
    packed position (flat) that predicts each scored response token and that token's flat index into
    [b, R]; tokens [n] those tokens."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    layout: torch.Tensor
    score_from: torch.Tensor
    score_to: torch.Tensor
    tokens: torch.Tensor
    rows: int
    response_width: int


def sequence_columns(attention_mask: torch.Tensor, prompt_width: int, response_mask: torch.Tensor):
    """Per row: (its attended prompt columns, its attended response columns up to the last masked-in
    response token), as lists of column indices in the padded layout."""
    prompt_lengths, response_lengths = row_lengths(attention_mask, prompt_width, response_mask)
    attended = attention_mask != 0
    prompts, responses = [], []
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        columns = torch.arange(prompt_width - p, prompt_width + r)
        columns = columns[attended[i, columns]]
        prompts.append(columns[columns < prompt_width])
        responses.append(columns[columns >= prompt_width])
    return prompts, responses


def pack_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, response_ids: torch.Tensor,
              response_mask: torch.Tensor, *, share_prompts: bool = False, one_row: bool = False,
              mask_dtype: torch.dtype | None = None, pairs_per_token: float = DEFAULT_PAIRS_PER_TOKEN) -> PackedRows:
    """The packed layout of these rows. `share_prompts`: rows with the same prompt form one unit
    (the prompt once, then each response) under a prefix-sharing mask, boolean (sdpa) or, with
    `mask_dtype`, additive in that dtype (eager). `one_row`: every unit in one row (variable-length
    attention), else units bin-packed into rows as wide as the longest unit."""
    b, width = response_ids.shape
    prompts, responses = sequence_columns(attention_mask, prompt_width, response_mask)
    keys = prompt_keys(input_ids, attention_mask, prompt_width) if share_prompts else list(range(b))
    units: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        units.setdefault(key, []).append(i)
    unit_rows = [part for rows in units.values()
                 for part in split_shared_unit(rows, len(prompts[rows[0]]), [len(responses[i]) for i in rows],
                                               pairs_per_token)]
    unit_lengths = [len(prompts[rows[0]]) + sum(len(responses[i]) for i in rows) for rows in unit_rows]
    total = sum(unit_lengths)
    row_width = max(total if one_row else max(unit_lengths, default=0), 1)
    placed = first_fit_decreasing(unit_lengths, row_width)
    k = max(len(placed), 1)
    flat_ids = torch.zeros(k * row_width, dtype=input_ids.dtype)
    positions = torch.zeros(k * row_width, dtype=torch.long)
    unit_of = torch.full((k * row_width,), -1, dtype=torch.long)  # pads: -1, then made unique per position
    part_of = torch.zeros(k * row_width, dtype=torch.long)  # 0: a prompt, j > 0: the unit's j-th response
    layout = torch.full((b, input_ids.shape[1]), -1, dtype=torch.long)
    sharing = False
    for r, members in enumerate(placed):
        at = r * row_width
        for u in members:
            rows = unit_rows[u]
            prompt = prompts[rows[0]]
            p = len(prompt)
            span = torch.arange(at, at + p)
            flat_ids[span] = input_ids[rows[0], prompt]
            positions[span] = torch.arange(p)
            unit_of[span] = u
            layout[torch.tensor(rows).unsqueeze(1), prompt.unsqueeze(0)] = span.unsqueeze(0)
            at += p
            for j, i in enumerate(rows, start=1):
                columns = responses[i]
                n = len(columns)
                span = torch.arange(at, at + n)
                flat_ids[span] = input_ids[i, columns]
                positions[span] = torch.arange(p, p + n)  # after the prompt, shared or not
                unit_of[span], part_of[span] = u, j
                layout[i, columns] = span
                at += n
            sharing = sharing or len(rows) > 1
        _number_the_padding(positions, r * row_width + sum(unit_lengths[u] for u in members), (r + 1) * row_width)
    score_to = (response_mask != 0).reshape(-1).nonzero().squeeze(-1)
    rows_of, columns_of = score_to // width, score_to % width
    score_from = layout[rows_of, prompt_width - 1 + columns_of]
    if (score_from < 0).any():
        raise ValueError("a scored response token has no attended position before it (an empty prompt?)")
    mask = None
    if sharing:
        mask = prefix_sharing_mask(unit_of.view(k, row_width), part_of.view(k, row_width), mask_dtype)
    return PackedRows(flat_ids.view(k, row_width), positions.view(k, row_width), mask, layout, score_from, score_to,
                      response_ids.reshape(-1)[score_to], b, width)


def shared_response_tokens(prompt_length: int, pairs_per_token: float) -> float:
    """How many response tokens one copy of a prompt should be shared by in a packed row.

    A mask-based attention computes every query of a row against every key, so one copy of a
    prompt of P tokens followed by responses of n tokens in all costs (P + n)^2 pairs, while each
    further copy costs P tokens. Per response token, c(n) = (P + n)^2 / (a n) + P / n with a pairs
    per token (pairs_per_token); it is least at n = sqrt(P^2 + a P). Sharing a prompt among all G
    responses instead costs G times the attention a padded row needs at long responses (and a
    [W, W] mask that large)."""
    return math.sqrt(prompt_length ** 2 + pairs_per_token * prompt_length)


def split_shared_unit(rows: list[int], prompt_length: int, response_lengths: list[int],
                      pairs_per_token: float = DEFAULT_PAIRS_PER_TOKEN) -> list[list[int]]:
    """A group's rows (one prompt) cut into runs that share one copy of the prompt, in the rows'
    order: as few runs as keep each within shared_response_tokens, balanced (the rows are packed
    into rows as wide as the widest run, so one wide run would make the others' rows wide too)."""
    total = sum(response_lengths)
    cap = shared_response_tokens(prompt_length, pairs_per_token)
    count = min(len(rows), max(1, math.ceil(total / cap))) if cap > 0 else len(rows)
    target = max(total / count, 1e-9)
    runs: list[list[int]] = [[] for _ in range(count)]
    before = 0
    for row, length in zip(rows, response_lengths):
        runs[min(count - 1, int((before + length / 2) / target))].append(row)  # by the response's middle
        before += length
    return [run for run in runs if run]


def _number_the_padding(positions: torch.Tensor, start: int, end: int) -> None:
    """A packed row's tail of padding numbered 0, 1, ...: a sequence of its own, which no real
    token attends to (it comes after them, and is a separate sequence)."""
    positions[start:end] = torch.arange(end - start)


def first_fit_decreasing(lengths: list[int], width: int) -> list[list[int]]:
    """Indices of `lengths` placed in rows of `width`: longest first, each into the first row it fits
    (a length over `width` gets a row of its own). At most 11/9 of the fewest rows, plus one."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(width - lengths[i])
    return rows


def prefix_sharing_mask(unit_of: torch.Tensor, part_of: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """[k, 1, W, W] attention mask: query q sees key t when both are in one unit, t <= q, and t is in
    the unit's prompt or in q's own response. Padding (unit -1) sees only itself, so no query row is
    empty. Boolean (True: attend), or additive in `dtype` (0 or its lowest value)."""
    k, w = unit_of.shape
    index = torch.arange(w)
    own = unit_of.clone()
    pads = own < 0
    own[pads] = -1 - index.expand(k, w)[pads]  # each pad a unit of its own
    same_unit = own.unsqueeze(2) == own.unsqueeze(1)
    causal = index.view(1, w, 1) >= index.view(1, 1, w)
    visible = (part_of.unsqueeze(1) == 0) | (part_of.unsqueeze(2) == part_of.unsqueeze(1))
    allowed = (same_unit & causal & visible).unsqueeze(1)
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def gather_packed(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values [k, W, ...] read at flat packed positions `index` (any shape; -1 reads zeros)."""
    flat = values.reshape(-1, *values.shape[2:])
    safe = index.clamp(min=0).to(flat.device)
    out = flat.index_select(0, safe.reshape(-1)).reshape(*index.shape, *values.shape[2:])
    missing = (index < 0).to(flat.device)
    if missing.any():
        out = out.masked_fill(missing.view(*index.shape, *([1] * (values.dim() - 2))), 0)
    return out


def scatter_scored(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """[n, ...] values of the scored tokens back to [b, R, ...], zeros elsewhere."""
    out = values.new_zeros(packed.rows * packed.response_width, *values.shape[1:])
    out = out.index_put((packed.score_to.to(values.device),), values)
    return out.view(packed.rows, packed.response_width, *values.shape[1:])


def packed_inputs(packed: PackedRows, device) -> dict:
    """The model's keyword inputs for packed rows (no KV cache: with one the library would not
    look for packed sequences)."""
    inputs = {"input_ids": packed.input_ids.to(device), "position_ids": packed.position_ids.to(device),
              "use_cache": False}
    if packed.attention_mask is not None:
        inputs["attention_mask"] = packed.attention_mask.to(device)
    return inputs


def mask_dtype_for(model) -> torch.dtype | None:
    """The prefix-sharing mask's dtype: boolean for sdpa, additive in the model's dtype for eager."""
    if attention_implementation(model) != "eager":
        return None
    _, head = output_head(model)
    return head.weight.dtype
