"""The policy's forward pass over prompt + response, as the scoring pass and the update both run
it, and the no-grad scoring pass that fills old log-probs, entropy and reference log-probs.

Log-probs and entropy are those of softmax(logits / T) with T the rollout temperature: the
distribution the responses were sampled from, so the PPO ratio, the KL and the entropy refer to
it (verl scales the same way); greedy rollouts (T = 0) are scored at T = 1. The model's own head
runs on the last position only; the final hidden states of the response positions go through
the output head in chunks (engine/training/logprobs.py), so no [b, R, V] logit tensor is held whole.

Which rows the scoring pass covers is decided once per run by `scoring_pass`.
"""

from __future__ import annotations

from typing import Callable

import torch

from meds_cli.core.forward import (
    ForwardView,
    cache_keyword,
    full_precision,
    output_cache,
    output_head,
    position_ids_for,
)
from meds_cli.core.rollouts import Rollouts
from meds_cli.engine.training.logprobs import DEFAULT_CHUNK_TOKENS, token_logprobs_and_entropy
from meds_cli.engine.training.micro_batches import micro_batch_inputs, plan_micro_batches, to_width
from meds_cli.engine.training.packing import (
    PADDED,
    Packing,
    gather_packed,
    mask_dtype_for,
    pack_rows,
    packed_inputs,
    scatter_scored,
)

SCORING_SETTINGS = ["auto", "always"]


def scoring_temperature(rollout_temperature: float) -> float:
    """The temperature log-probs are taken at: the sampling one, or 1 for greedy rollouts."""
    return rollout_temperature if rollout_temperature > 0 else 1.0


def scoring_pass(view_needed_by: str | None, *, uses_reference: bool, optimizer_steps_per_batch: int,
                 setting: str = "auto", deterministic_update: bool = True) -> str | None:
    """Which rows the no-grad scoring pass covers:
    "sampled": every sampled group, before rewards (the rewards or the keep decision read the pass);
    "trained": the groups that train, after the keep decision (old log-probs for several optimizer
               steps, reference log-probs, a view read by reward shaping, or an update forward
               that is not deterministic);
    None:      no pass: with one optimizer step per batch the old log-probs are the update's own,
               detached, and the update's forward gives the entropy (verl's on-policy case).
    `deterministic_update` False (dropout in the train-mode forward, `has_active_dropout`): the
    update's own log-probs carry the dropout noise, not pi_old's values, so the pass stays.
    setting "always" keeps a pass where None would do (to check the two give the same run)."""
    if view_needed_by == "rewards":
        return "sampled"
    if (setting == "always" or view_needed_by is not None or uses_reference or optimizer_steps_per_batch > 1
            or not deterministic_update):
        return "trained"
    return None


def has_active_dropout(model) -> bool:
    """Whether the model's train-mode forward is random: a dropout module with p > 0 (the LoRA
    adapter's `model.lora.dropout` among them) or attention dropout in the model's config (applied
    inside the attention function, no module to find)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    return float(getattr(getattr(model, "config", None), "attention_dropout", 0.0) or 0.0) > 0


def shares_prompts(train_cfg, sharded, packing: Packing = PADDED) -> bool:
    """Whether forwards run each distinct prompt once (`train.share_prompts`). Packed, where the
    attention takes a prefix-sharing mask (one call per forward: works under gradient
    checkpointing and FSDP2), and not where it does not (each response carries its prompt).
    Padded, not under gradient checkpointing, where transformers turns the KV cache off in
    training, nor under FSDP2, where the two calls per micro-batch it makes are untested."""
    if packing.on:
        return train_cfg.share_prompts and packing.masked
    return train_cfg.share_prompts and not train_cfg.gradient_checkpointing and sharded is None


def logit_function(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden [n, H] -> logits [n, V] as the model's head makes them (with Gemma-style soft-capping)."""
    _, head = output_head(model)
    inner = getattr(model, "module", model)
    cap = getattr(getattr(inner, "config", None), "final_logit_softcapping", None)
    if not cap:
        return head
    return lambda hidden: torch.tanh(head(hidden) / cap) * cap


def policy_forward(model, input_ids, attention_mask, prompt_width: int, response_ids, *, temperature: float,
                   response_mask=None, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, hidden_states: bool = False,
                   with_entropy: bool = True, share_prompts: bool = False, entropy_grad: bool = False,
                   packing: Packing = PADDED, keep_states: bool = True):
    """One forward of the policy: (log p of the response tokens [b, R], entropy [b, R] or None,
    all hidden states [b, Lp + R, H] each or None, the final hidden states at the positions
    predicting the response [b, R, H], or None from a packed forward without `keep_states`).
    Positions where response_mask is 0 come back as 0.

    `packing.on`: the rows laid end to end without padding (engine/training/packing.py), the
    values gathered back to the padded layout (zeros at its padding).
    `share_prompts`: rows with the same prompt (the G responses of a group) run that prompt once:
    packed, under a prefix-sharing mask (where the attention takes one); padded, by reading its
    keys and values from a cache copied to each row, gradients included (they flow back through
    the copies), instead of running it G times; the same numbers up to rounding. Not padded with
    `hidden_states` (those are asked over the whole sequence) or a cache-less model."""
    if packing.on:
        response_mask = torch.ones_like(response_ids) if response_mask is None else response_mask
        return _packed_forward(model, input_ids, attention_mask, prompt_width, response_ids, response_mask,
                               share_prompts=share_prompts and packing.masked, packing=packing,
                               hidden_states=hidden_states, keep_states=keep_states,
                               stats=dict(temperature=temperature, chunk_tokens=chunk_tokens,
                                          with_entropy=with_entropy, entropy_grad=entropy_grad))
    width = response_ids.shape[1]
    last = None
    if share_prompts and not hidden_states:
        last = _shared_prompt_states(model, input_ids, attention_mask, prompt_width)
    if last is not None:
        out = None
    else:
        out, last = _final_states(model, output_hidden_states=hidden_states, input_ids=input_ids,
                                  attention_mask=attention_mask, position_ids=position_ids_for(attention_mask),
                                  use_cache=False)
        last = last[:, prompt_width - 1:prompt_width - 1 + width]  # position Lp-1+j predicts response token j
    logp, entropy = token_logprobs_and_entropy(last, logit_function(model), response_ids, temperature=temperature,
                                               mask=response_mask, chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                               entropy_grad=entropy_grad)
    return logp, entropy, (out.hidden_states if hidden_states else None), last


def _packed_forward(model, input_ids, attention_mask, prompt_width, response_ids, response_mask, *, share_prompts,
                    packing: Packing, hidden_states: bool, keep_states: bool, stats: dict):
    """policy_forward on packed rows: the scored positions' final states gathered from the packed
    rows ([1, n, H]: every scored token of the micro-batch, no padding), their log-probs and
    entropies scattered back to [b, R]; the views' hidden states gathered per sequence."""
    device = input_ids.device
    packed = pack_rows(input_ids.cpu(), attention_mask.cpu(), prompt_width, response_ids.cpu(), response_mask.cpu(),
                       share_prompts=share_prompts, one_row=packing.one_row, mask_dtype=mask_dtype_for(model),
                       pairs_per_token=packing.pairs_per_token)
    out, last = _final_states(model, output_hidden_states=hidden_states, **packed_inputs(packed, device))
    scored = gather_packed(last, packed.score_from)  # [n, H]
    logp, entropy = token_logprobs_and_entropy(scored.unsqueeze(0), logit_function(model),
                                               packed.tokens.to(device).unsqueeze(0), **stats)
    logp = scatter_scored(logp[0], packed)
    entropy = scatter_scored(entropy[0], packed) if entropy is not None else None
    states = tuple(gather_packed(h, packed.layout) for h in out.hidden_states) if hidden_states else None
    return logp, entropy, states, (scatter_scored(scored, packed) if keep_states else None)


def _final_states(model, *, output_hidden_states: bool, **inputs):
    """(the model's output, its final hidden states: the final norm's output, which the head reads).
    A hook takes them rather than asking the model for every layer's states (held until the pass
    ends, gigabytes at long responses); the head itself runs on the last position only."""
    norm, _ = output_head(model)
    captured = {}
    hook = norm.register_forward_hook(lambda module, args, out: captured.setdefault("last", out)) if norm else None
    try:
        out = model(**inputs, output_hidden_states=output_hidden_states or norm is None, logits_to_keep=1)
    finally:
        if hook is not None:
            hook.remove()
    return out, (captured["last"] if norm is not None else out.hidden_states[-1])


def _shared_prompt_states(model, input_ids, attention_mask, prompt_width: int):
    """The final hidden states at the positions predicting the response [b, R, H], each distinct
    prompt run once; None where nothing is shared or the model's cache cannot be copied by row."""
    if prompt_width == 0:
        return None
    prompt = torch.cat([input_ids[:, :prompt_width], attention_mask[:, :prompt_width]], dim=1)
    distinct, row_of = torch.unique(prompt, dim=0, return_inverse=True)
    if len(distinct) == len(prompt):
        return None
    prompt_ids, prompt_mask = distinct[:, :prompt_width], distinct[:, prompt_width:]
    # The prompt through the bare module: under DDP only the call below goes through the wrapper,
    # which prepares the gradient reduction for one backward over both.
    inner = getattr(model, "module", model)
    out, prompt_last = _final_states(inner, output_hidden_states=False, input_ids=prompt_ids,
                                     attention_mask=prompt_mask, position_ids=position_ids_for(prompt_mask),
                                     use_cache=True)
    cache = output_cache(out)
    if cache is None or not hasattr(cache, "batch_select_indices"):
        return None
    cache.batch_select_indices(row_of)
    keyword = cache_keyword(inner)
    positions = position_ids_for(attention_mask)[:, prompt_width:]
    _, response_last = _final_states(model, output_hidden_states=False, input_ids=input_ids[:, prompt_width:],
                                     attention_mask=attention_mask, position_ids=positions, use_cache=True,
                                     **{keyword: cache})
    # Response token 0 is predicted by the prompt's last position, token j by response position j - 1.
    return torch.cat([prompt_last[row_of, -1:], response_last[:, :-1]], dim=1)


@torch.no_grad()
def score_rollouts(model, rollouts: Rollouts, micro_batch_size: int, *, with_reference: bool, temperature: float = 1.0,
                   chunk_tokens: int = DEFAULT_CHUNK_TOKENS, wants_hidden_states: bool = False,
                   observe: Callable[[ForwardView], None] | None = None, disable_adapter=None, tokenizer=None,
                   share_prompts: bool = False, micro_batch_tokens: int = 0,
                   most_over_processes: Callable[[int], int] = lambda count: count,
                   packing: Packing = PADDED) -> None:
    """Fill old_logp, entropy (and ref_logp) in micro-batches; hand each micro-batch's view to `observe`.
    `micro_batch_tokens`: micro-batches by tokens (engine/training/micro_batches.py), as many as
    `most_over_processes` says the busiest process runs. Views are of consecutive rows at the
    batch's width: packed (`packing.on`), micro-batches by real tokens are runs of the batch's
    order and the views are gathered from the packed rows; padded, an observed pass keeps fixed
    micro-batches (a cut would change the width)."""
    size, width = rollouts.size, rollouts.response_ids.shape[1]
    by_tokens = micro_batch_tokens > 0 and (observe is None or packing.on)
    batches = plan_micro_batches(rollouts, list(range(size)), size=micro_batch_size,
                                 budget=micro_batch_tokens if by_tokens else 0, most_over_processes=most_over_processes,
                                 packed=packing.on, share_prompts=share_prompts and packing.masked)
    old, ent, ref = {}, {}, {}
    device = next(model.parameters()).device
    logits_of = logit_function(model)
    forward = dict(temperature=temperature, chunk_tokens=chunk_tokens, share_prompts=share_prompts, packing=packing)
    for batch in batches:
        rows = list(batch.rows)
        ids, mask, prompt_width, tokens, response_mask = (
            t.to(device) if isinstance(t, torch.Tensor) else t
            for t in micro_batch_inputs(rollouts, rows, by_tokens and not packing.on))
        logp, entropy, hidden, last = policy_forward(model, ids, mask, prompt_width, tokens,
                                                     response_mask=response_mask, hidden_states=wants_hidden_states,
                                                     keep_states=observe is not None, **forward)
        if batch.counts:
            old[batch.rows], ent[batch.rows] = logp.cpu(), entropy.cpu()
        if observe is not None and batch.counts:
            if rows != list(range(rows[0], rows[-1] + 1)):
                raise RuntimeError(f"a viewed micro-batch of rows {rows} is not a run of consecutive rows")
            observe(ForwardView(rows=slice(rows[0], rows[-1] + 1), hidden_states=hidden, model=model,
                                tokenizer=tokenizer, device=device,
                                make_logits=lambda last=last: full_precision(logits_of(last))))
        if with_reference:
            with disable_adapter():
                ref_logp, _, _, _ = policy_forward(model, ids, mask, prompt_width, tokens, response_mask=response_mask,
                                                   with_entropy=False, keep_states=False, **forward)
            if batch.counts:
                ref[batch.rows] = ref_logp.cpu()
    rollouts.old_logp = _in_row_order(old, size, width)
    rollouts.entropy = _in_row_order(ent, size, width)
    rollouts.ref_logp = _in_row_order(ref, size, width) if with_reference else None


def _in_row_order(parts: dict[tuple, torch.Tensor], size: int, width: int) -> torch.Tensor:
    """[size, width] from each micro-batch's values (rows -> [b, w <= width]), zero-padded on the right."""
    first = next(iter(parts.values()))
    out = torch.zeros(size, width, dtype=first.dtype)
    for rows, values in parts.items():
        out[list(rows)] = to_width(values, width)
    return out
