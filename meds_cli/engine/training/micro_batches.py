"""Micro-batches: which rows of a mini-batch run in one forward/backward, and at what width.

With `train.micro_batch_tokens` 0, `micro_batch_size` consecutive rows at the whole batch's
width (the prompt padded to the batch's longest prompt, the response to its longest response).
With a token budget, rows of similar length run together and each micro-batch is cut to its own
longest prompt and response: one response at the length limit then widens only its own
micro-batch, not every one (verl's dynamic batch size, `ppo_max_token_len_per_gpu`, does the same).
The loss is normalised by the mini-batch's global counts either way, so the grouping changes only
the padding, never the update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class MicroBatch:
    rows: tuple[int, ...]
    counts: bool = True  # False: run only so that every process makes the same collectives; its loss weighs 0


def fixed_micro_batches(rows: list[int], size: int) -> list[MicroBatch]:
    """`size` consecutive rows at a time (train.micro_batch_tokens 0)."""
    return [MicroBatch(tuple(rows[i:i + size])) for i in range(0, len(rows), size)]


def row_lengths(attention_mask: torch.Tensor, prompt_width: int, response_mask: torch.Tensor) -> tuple[list, list]:
    """(prompt lengths, response lengths) of each row, as a cut must keep them: the prompt from its
    first attended column (prompts are left-padded) to the prompt width, the response up to its
    last masked-in token (what comes after it cannot change the earlier positions' log-probs)."""
    prompt = attention_mask[:, :prompt_width] != 0
    first = prompt.int().argmax(-1)
    prompt_lengths = torch.where(prompt.any(-1), prompt_width - first, 0)
    response = response_mask != 0
    last = response.shape[1] - 1 - response.flip(-1).int().argmax(-1)
    response_lengths = torch.where(response.any(-1), last + 1, 0)
    return prompt_lengths.tolist(), response_lengths.tolist()


def prompt_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> list[int]:
    """Per row, a number equal for rows with the same prompt (ids and mask)."""
    if prompt_width == 0:
        return list(range(input_ids.shape[0]))
    prompt = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width].to(input_ids.dtype)], dim=1)
    return torch.unique(prompt, dim=0, return_inverse=True)[1].tolist()


def token_micro_batches(prompt_lengths: list[int], response_lengths: list[int], budget: int) -> list[MicroBatch]:
    """Positions 0..n-1 grouped so that each group costs at most `budget` tokens, a group costing
    its rows x (its longest prompt + its longest response), as it runs padded. Rows go longest
    first (ties in order, so the rows of a group of equal length stay together for shared
    prompts) and each group is a run of that order. There are as few groups as the budget allows,
    and among the ways to cut the order into that many, the one that runs the fewest tokens
    (least_padded_cuts): filling each group while it fits would put short rows beside the
    longest ones, at the longest one's width. A row longer than the budget gets a group of its
    own (`over_budget` names them)."""
    order = sorted(range(len(prompt_lengths)), key=lambda i: (-(prompt_lengths[i] + response_lengths[i]), i))
    cuts = least_padded_cuts([prompt_lengths[i] for i in order], [response_lengths[i] for i in order], budget)
    return [MicroBatch(tuple(order[start:end])) for start, end in zip(cuts, cuts[1:])]


def filled_cuts(prompts: list[int], responses: list[int], budget: int) -> list[int]:
    """Cut points (0, ..., n) of rows in their order, each run filled while it costs at most
    `budget` (a row alone may cost more). No way of cutting into runs has fewer, and none reaches
    further with its first j runs: a run inside one that fits also fits."""
    cuts, prompt, response = [0], 0, 0
    for i, (p, r) in enumerate(zip(prompts, responses)):
        prompt, response = max(prompt, p), max(response, r)
        if i > cuts[-1] and (i + 1 - cuts[-1]) * (prompt + response) > budget:
            cuts.append(i)
            prompt, response = p, r
    return cuts + [len(prompts)] if prompts else cuts


class RangeMax:
    """The largest of values[s:e] for many (s, e) at once, from a sparse table (log n levels)."""

    def __init__(self, values: list[int]):
        self.levels = [torch.tensor(values, dtype=torch.float64)]
        while 2 ** len(self.levels) <= len(values):
            below, half = self.levels[-1], 2 ** (len(self.levels) - 1)
            self.levels.append(torch.maximum(below[:-half], below[half:]))

    def __call__(self, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """starts, ends: int64 tensors of one shape, ends > starts."""
        level = torch.log2((ends - starts).to(torch.float64)).floor().long()
        out = torch.empty(starts.shape, dtype=torch.float64)
        for k in level.unique().tolist():
            at = level == k
            out[at] = torch.maximum(self.levels[k][starts[at]], self.levels[k][ends[at] - 2 ** k])
        return out


def least_padded_cuts(prompts: list[int], responses: list[int], budget: int) -> list[int]:
    """Cut points (0, ..., n) of rows in their order into as few runs as `budget` allows (each
    costing at most budget; a row alone may cost more), with the fewest tokens run in all, a run
    costing rows x (longest prompt + longest response). Dynamic programming over the j-th cut,
    which lies between where filling from the end and filling from the start put it (no cut of
    that many runs is further either way)."""
    n = len(prompts)
    latest = filled_cuts(prompts, responses, budget)
    groups = len(latest) - 1
    earliest = [n - c for c in reversed(filled_cuts(prompts[::-1], responses[::-1], budget))]
    widest_prompt, widest_response = RangeMax(prompts), RangeMax(responses)
    ends = torch.tensor([0])
    least = torch.zeros(1, dtype=torch.float64)  # least[i]: rows 0..ends[i]-1 in j runs
    last_starts = []  # for runs j = 1..groups: where the j-th run starts, by where it ends
    for j in range(1, groups + 1):
        starts, ends = ends, torch.arange(earliest[j], latest[j] + 1)
        s, e = torch.broadcast_tensors(starts.unsqueeze(1), ends.unsqueeze(0))
        cost = torch.full(s.shape, float("inf"), dtype=torch.float64)  # [start, end]: the run's tokens
        run = e > s
        rows = (e[run] - s[run]).to(torch.float64)
        tokens = rows * (widest_prompt(s[run], e[run]) + widest_response(s[run], e[run]))
        cost[run] = torch.where((rows > 1) & (tokens > budget), float("inf"), tokens)
        least, at = (least.unsqueeze(1) + cost).min(dim=0)
        last_starts.append(starts[at])
    cuts = [n]
    for j in reversed(range(groups)):
        cuts.append(int(last_starts[j][cuts[-1] - earliest[j + 1]]))
    return cuts[::-1]


def real_token_micro_batches(prompt_lengths: list[int], response_lengths: list[int], prompt_keys: list[int] | None,
                             budget: int) -> list[MicroBatch]:
    """Positions 0..n-1 in runs of their order, each filled while its real tokens fit in `budget`
    (padding-free micro-batches: engine/training/packing.py): a row's prompt and response, a prompt
    counted once for the rows of a run that share it (`prompt_keys` equal; None: none share). The
    order keeps a group's rows together, so they share their prompt; a row longer than the budget
    runs alone. Filling runs in order makes as few as any cut of the order into runs can."""
    out: list[MicroBatch] = []
    run: list[int] = []
    seen: set = set()
    tokens = 0
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        key = prompt_keys[i] if prompt_keys is not None else None
        cost = r + (0 if key is not None and key in seen else p)
        if run and tokens + cost > budget:
            out.append(MicroBatch(tuple(run)))
            run, seen, tokens = [], set(), 0
            cost = p + r
        run.append(i)
        seen.add(key)
        tokens += cost
    return out + [MicroBatch(tuple(run))] if run else out


def over_budget(prompt_lengths: list[int], response_lengths: list[int], budget: int) -> list[int]:
    """The positions whose row alone is longer than `budget` tokens."""
    return [i for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)) if p + r > budget]


def plan_micro_batches(rollouts, rows: list[int], *, size: int, budget: int,
                       most_over_processes: Callable[[int], int] = lambda count: count,
                       on_over_budget: Callable[[int, int], None] | None = None, packed: bool = False,
                       share_prompts: bool = False) -> list[MicroBatch]:
    """The micro-batches of `rows` of `rollouts` (the update's mini-batch, the scoring pass's batch):
    `size` rows at a time with `budget` 0, else by tokens within `budget` (`packed`: real tokens,
    prompts shared by `share_prompts` counted once; else as the rows run padded), as many as
    `most_over_processes` says the busiest process runs. `on_over_budget(rows, longest)` is told
    how many rows are alone longer than the budget, and the longest's tokens."""
    if not budget:
        return fixed_micro_batches(rows, size)
    attention = rollouts.attention_mask[rows]
    prompt_lengths, response_lengths = row_lengths(attention, rollouts.prompt_width, rollouts.response_mask[rows])
    longer = over_budget(prompt_lengths, response_lengths, budget)
    if longer and on_over_budget is not None:
        on_over_budget(len(longer), max(prompt_lengths[i] + response_lengths[i] for i in longer))
    if packed:
        keys = prompt_keys(rollouts.input_ids[rows], attention, rollouts.prompt_width) if share_prompts else None
        grouped = real_token_micro_batches(prompt_lengths, response_lengths, keys, budget)
    else:
        grouped = token_micro_batches(prompt_lengths, response_lengths, budget)
    planned = [MicroBatch(tuple(rows[i] for i in m.rows)) for m in grouped]
    return even_out(planned, most_over_processes(len(planned)))


def even_out(micro_batches: list[MicroBatch], count: int) -> list[MicroBatch]:
    """`micro_batches` made `count` long, for processes that must run the same number of forwards
    and backwards (FSDP2 gathers and reduces in each): the one with the most rows is split in two
    (its longer half first) until there are `count`; where every one is down to a single row,
    zero-weight repeats of the last row make up the rest."""
    out = list(micro_batches)
    if not out:
        raise ValueError("even_out needs at least one micro-batch to run")
    while len(out) < count:
        widest = max(range(len(out)), key=lambda k: (len(out[k].rows), -k))
        rows = out[widest].rows
        if len(rows) == 1:
            out += [MicroBatch(out[-1].rows[-1:], counts=False)] * (count - len(out))
            break
        half = (len(rows) + 1) // 2
        out[widest:widest + 1] = [MicroBatch(rows[:half]), MicroBatch(rows[half:])]
    return out


def cut_to_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int, response_ids: torch.Tensor,
                response_mask: torch.Tensor, prompt_length: int, response_length: int):
    """(input_ids, attention_mask, prompt width, response_ids, response_mask) of some rows cut to
    `prompt_length` prompt columns (the last ones: prompts are left-padded) and `response_length`
    response columns (the first ones). Only padding is removed, so the forward gives the same
    log-probs at the kept positions."""
    columns = slice(prompt_width - prompt_length, prompt_width + response_length)
    return (input_ids[:, columns], attention_mask[:, columns], prompt_length, response_ids[:, :response_length],
            response_mask[:, :response_length])


def micro_batch_inputs(rollouts, rows: list[int], cut: bool):
    """(input_ids, attention_mask, prompt width, response_ids, response_mask) of `rows`: at the
    batch's width, or (`cut`) at the rows' own longest prompt and response (at least one response
    column, so the forward has a position to score)."""
    inputs = (rollouts.input_ids[rows], rollouts.attention_mask[rows], rollouts.prompt_width,
              rollouts.response_ids[rows], rollouts.response_mask[rows])
    if not cut:
        return inputs
    prompt_lengths, response_lengths = row_lengths(inputs[1], rollouts.prompt_width, inputs[4])
    return cut_to_rows(*inputs, max(prompt_lengths), max(1, max(response_lengths)))


def to_width(values: torch.Tensor, width: int) -> torch.Tensor:
    """[b, r] per-response-token values zero-padded on the right to [b, width] (the batch's width);
    `values` themselves when already that wide (every fixed-size micro-batch: no copy per forward)."""
    if values.shape[1] == width:
        return values
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))
