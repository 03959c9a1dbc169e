"""Per-token policy losses and their aggregation, as pure tensor functions.

Definitions follow verl's core_algos (compute_policy_loss_vanilla, agg_loss, kl_penalty 'low_var_kl')
so that numbers can be compared with it; where this module differs, the docstring says why.
"""

import torch

LOSS_AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def clipped_surrogate(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.2, clip_ratio_c=None):
    """PPO clipped surrogate per token, with clip-higher and an optional dual clip.

    ratio = exp(clamp(logp - old_logp, -20, 20));
    l = max(-A*ratio, -A*clip(ratio, 1-clip_low, 1+clip_high));
    dual clip (clip_ratio_c = c > 1): for A < 0, l = min(l, -A*c).
    Returns (loss [B, R], stats) where stats holds the clip fractions over valid tokens:
    'clip_low' (A<0, ratio below 1-clip_low), 'clip_high' (A>0, ratio above 1+clip_high),
    'clip_dual' (A<0, dual clip active), and 'ratio_mean'.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(loss, dtype=torch.bool)
    if clip_ratio_c is not None:
        dual = -advantages * clip_ratio_c
        dual_active = (advantages < 0) & (dual < loss)
        loss = torch.where(advantages < 0, torch.minimum(loss, dual), loss)
    valid = mask > 0
    denom = valid.sum().clamp(min=1)
    with torch.no_grad():
        stats = {
            "clip_low": ((advantages < 0) & (ratio < 1.0 - clip_low) & valid).sum() / denom,
            "clip_high": ((advantages > 0) & (ratio > 1.0 + clip_high) & valid).sum() / denom,
            "clip_dual": (dual_active & valid).sum() / denom,
            "ratio_mean": (ratio * mask).sum() / denom,
            # KL(old || current) estimated on the sampled tokens (verl's ppo_kl): how far the
            # updates have moved the policy from the one that sampled the batch.
            "ppo_kl": (-log_ratio * mask).sum() / denom,
        }
    return loss, stats


def k3_kl(logp, ref_logp):
    """k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1, clamped to
    [-10, 10] like verl's low_var_kl; it is >= 0 and its gradient is unbiased near ref."""
    diff = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(diff) - diff - 1.0, -10.0, 10.0)


def agg_loss(loss, mask, mode: str, *, total_tokens=None, total_seqs=None, norm_length=None):
    """Reduce a [B, R] per-token loss to a scalar.

    token-mean:            sum(loss * mask) / total_tokens
    seq-mean-token-mean:   sum_i mean_t(loss_i) / total_seqs          (GRPO paper)
    seq-mean-token-sum:    sum_i sum_t(loss_i) / total_seqs
    seq-mean-token-sum-norm: sum_i sum_t(loss_i) / (norm_length * total_seqs)   (Dr. GRPO)
    total_tokens / total_seqs default to this batch's own counts; the trainer passes the counts
    of the whole mini-batch (over micro-batches and processes), so that accumulated micro-batches
    and data-parallel processes add up to exactly the loss of the full batch.
    For seq-mean-token-sum-norm verl's agg_loss returns sum / norm_length and its actor then
    scales each micro-batch by micro/mini size; the division by total_seqs here is that scaling.
    """
    mask = mask.to(loss.dtype)
    if total_tokens is None:
        total_tokens = mask.sum().clamp(min=1)
    if total_seqs is None:
        total_seqs = max(loss.shape[0], 1)
    if mode == "token-mean":
        return (loss * mask).sum() / total_tokens
    seq_sums = (loss * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        return (seq_sums / mask.sum(-1).clamp(min=1)).sum() / total_seqs
    if mode == "seq-mean-token-sum":
        return seq_sums.sum() / total_seqs
    if mode == "seq-mean-token-sum-norm":
        length = norm_length if norm_length is not None else loss.shape[-1]
        return seq_sums.sum() / (length * total_seqs)
    raise ValueError(f"unknown loss aggregation '{mode}'; accepted: {', '.join(LOSS_AGG_MODES)}")
