"""Per-token policy losses and their aggregation, as pure tensor functions.

Definitions follow verl's core_algos (compute_policy_loss_vanilla, agg_loss, kl_penalty 'low_var_kl')
so that numbers can be compared with it; where this module differs, the docstring says why.

Policy losses are registered by name in POLICY_LOSSES (like verl's register_policy_loss) and
chosen by an algorithm's `policy_loss` config key; each takes (logp, old_logp, advantages,
mask, config) and returns (per-token loss [b, R], stats). The k3 KL to the reference policy is
not part of any of them: Algorithm.token_loss adds it, once, with `add_kl_penalty`.
KL-Cov and Clip-Cov: Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs" (verl's
kl_cov and clip_cov losses).
"""

from typing import Callable

import torch

from meds_cli.core.registry import Registry

POLICY_LOSSES: Registry[Callable] = Registry("policy loss")


def register_policy_loss(name: str, description: str):
    """Decorator: register a policy loss f(logp, old_logp, advantages, mask, config) -> (loss, stats)."""
    return POLICY_LOSSES.register(name, description)

LOSS_AGG_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _token_advantages(advantages):
    """Advantages that broadcast over tokens: sequence-level ones [b] as [b, 1], per-token [b, R] as they are."""
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def clipped_surrogate(logp, old_logp, advantages, mask, clip_low=0.2, clip_high=0.2, clip_ratio_c=None):
    """PPO clipped surrogate per token, with clip-higher and an optional dual clip.

    ratio = exp(clamp(logp - old_logp, -20, 20));
    l = max(-A*ratio, -A*clip(ratio, 1-clip_low, 1+clip_high));
    dual clip (clip_ratio_c = c > 1): for A < 0, l = min(l, -A*c).
    Returns (loss [B, R], stats) where stats holds the clip fractions over valid tokens:
    'clip_low' (A<0, ratio below 1-clip_low), 'clip_high' (A>0, ratio above 1+clip_high),
    'clip_dual' (A<0, dual clip active), and 'ratio_mean'.
    """
    loss, stats, _ = _surrogate(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c)
    return loss, stats


def _surrogate(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c):
    """clipped_surrogate's (loss, stats), and [B, R] bool: where the PPO clip sets the loss
    (-A*clip(ratio) above -A*ratio, before any dual clip), which Clip-Cov reads."""
    advantages = _token_advantages(advantages)
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
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
    return loss, stats, clip_active


def kl_cov_select(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """[b, R] bool: the top max(1, floor(n * ratio)) of the n valid tokens by
    cov_t = (A_t - mean A) * (logp_t - mean logp), means over valid tokens, all detached."""
    valid = mask > 0
    selected = torch.zeros_like(valid)
    n = int(valid.sum())
    if n == 0 or ratio <= 0:
        return selected
    adv = _token_advantages(advantages).expand_as(logp)
    a, lp = adv.detach()[valid], logp.detach()[valid]
    cov = (a - a.mean()) * (lp - lp.mean())
    k = max(1, int(n * ratio))
    top = torch.topk(cov, k).indices
    flat = valid.nonzero()[top]
    selected[flat[:, 0], flat[:, 1]] = True
    return selected


def kl_cov_loss(logp, old_logp, advantages, mask, ratio, kl_cov_coef, clip_low=0.2, clip_high=0.2, clip_ratio_c=None):
    """Per-token loss [b, R]: the selected tokens get -A*ratio + coef*|logp - old_logp|, the rest
    the clipped surrogate; stats add 'kl_cov_share', the share of valid tokens selected."""
    loss, stats = clipped_surrogate(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c)
    selected = kl_cov_select(advantages, logp, mask, ratio)
    adv = _token_advantages(advantages)
    log_ratio = logp - old_logp
    penalised = -adv * torch.exp(torch.clamp(log_ratio, -20.0, 20.0)) + kl_cov_coef * log_ratio.abs()
    loss = torch.where(selected, penalised, loss)
    stats["kl_cov_share"] = selected.sum() / (mask > 0).sum().clamp(min=1)
    return loss, stats


def clip_cov_select(advantages, logp, mask, clipped, ratio: float, lower: float, upper: float) -> torch.Tensor:
    """[b, R] bool: Clip-Cov's detached tokens. cov_t = (A_t - mean A) * (logp_t - mean logp), means
    over valid tokens; the candidates are valid tokens the PPO clip leaves alone (`clipped` False)
    with lower < cov_t < upper; of them max(1, floor(n * ratio)) are taken at random (torch's
    generator, one randperm over the candidates in row-major order, as verl does), n the valid tokens."""
    valid = mask > 0
    selected = torch.zeros_like(valid)
    n = int(valid.sum())
    if n == 0:
        return selected
    adv = _token_advantages(advantages).expand_as(logp).detach()
    lp = logp.detach()
    # means over the mask as verl's masked_mean computes them (its 1e-8 in the denominator)
    cov = (adv - (adv * mask).sum() / (mask.sum() + 1e-8)) * (lp - (lp * mask).sum() / (mask.sum() + 1e-8))
    candidates = ((cov > lower) & (cov < upper) & valid & ~clipped).nonzero()
    if len(candidates) == 0:
        return selected
    take = candidates[torch.randperm(len(candidates))[:max(int(ratio * n), 1)].to(candidates.device)]
    selected[take[:, 0], take[:, 1]] = True
    return selected


def clip_cov_loss(logp, old_logp, advantages, mask, ratio, lower, upper, clip_low=0.2, clip_high=0.2,
                  clip_ratio_c=None):
    """Per-token loss [b, R]: the clipped surrogate with the tokens clip_cov_select picks set to 0
    (no gradient through them); stats add 'clip_cov_share', the share of valid tokens detached."""
    loss, stats, clipped = _surrogate(logp, old_logp, advantages, mask, clip_low, clip_high, clip_ratio_c)
    selected = clip_cov_select(advantages, logp, mask, clipped, ratio, lower, upper)
    loss = torch.where(selected, torch.zeros_like(loss), loss)
    stats["clip_cov_share"] = selected.sum() / (mask > 0).sum().clamp(min=1)
    return loss, stats


def _dual_clip_bound(config):
    return config.clip_ratio_c if config.dual_clip else None


@register_policy_loss("vanilla", "PPO clipped surrogate with clip-higher; dual clip for A < 0 when dual_clip is true")
def vanilla_policy_loss(logp, old_logp, advantages, mask, config):
    return clipped_surrogate(logp, old_logp, advantages, mask, config.clip_low, config.clip_high,
                             _dual_clip_bound(config))


@register_policy_loss("dual-clip", "PPO clipped surrogate with the dual clip bound clip_ratio_c always on for A < 0")
def dual_clip_policy_loss(logp, old_logp, advantages, mask, config):
    return clipped_surrogate(logp, old_logp, advantages, mask, config.clip_low, config.clip_high, config.clip_ratio_c)


@register_policy_loss("kl-cov",
                      "clipped surrogate, with |logp - old_logp| on the top kl_cov_ratio tokens by covariance")
def kl_cov_policy_loss(logp, old_logp, advantages, mask, config):
    return kl_cov_loss(logp, old_logp, advantages, mask, config.kl_cov_ratio, config.kl_cov_coef,
                       config.clip_low, config.clip_high, _dual_clip_bound(config))


@register_policy_loss("clip-cov", "clipped surrogate, with the gradient of clip_cov_ratio tokens of high covariance "
                                  "(clip_cov_lb < cov < clip_cov_ub) cut")
def clip_cov_policy_loss(logp, old_logp, advantages, mask, config):
    return clip_cov_loss(logp, old_logp, advantages, mask, config.clip_cov_ratio, config.clip_cov_lb,
                         config.clip_cov_ub, config.clip_low, config.clip_high, _dual_clip_bound(config))


def k3_kl(logp, ref_logp):
    """k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1, clamped to
    [-10, 10] like verl's low_var_kl; it is >= 0 and its gradient is unbiased near ref."""
    diff = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(diff) - diff - 1.0, -10.0, 10.0)


def add_kl_penalty(loss, stats, logp, ref_logp, mask, coef: float):
    """loss + coef * k3_kl per token, and stats['kl'], the mean k3 over valid tokens."""
    kl = k3_kl(logp, ref_logp)
    stats["kl"] = (kl.detach() * mask).sum() / mask.sum().clamp(min=1)
    return loss + coef * kl, stats


def add_entropy_bonus(loss, stats, entropy, mask, coef: float):
    """loss - coef * entropy per token (the entropy-regularised loss), and stats['entropy_bonus'],
    coef times the mean entropy over valid tokens."""
    stats["entropy_bonus"] = coef * (entropy.detach() * mask).sum() / mask.sum().clamp(min=1)
    return loss - coef * entropy, stats


def agg_loss(loss, mask, mode: str, *, total_tokens=None, total_seqs=None, norm_length=None):
    """Reduce a [B, R] per-token loss to a scalar.

    token-mean:            sum(loss * mask) / total_tokens
    seq-mean-token-mean:   sum_i mean_t(loss_i) / total_seqs          (GRPO paper)
    seq-mean-token-sum:    sum_i sum_t(loss_i) / total_seqs
    seq-mean-token-sum-norm: sum_i sum_t(loss_i) / (norm_length * total_seqs)   (Dr. GRPO)
    total_tokens / total_seqs default to this batch's own counts; the trainer passes the counts
    of the whole mini-batch (over micro-batches and processes), so that accumulated micro-batches
    and data-parallel processes add up to exactly the loss of the full batch.
    For seq-mean-token-sum-norm the division by norm_length * total_seqs (the mini-batch's
    sequences) is current verl's. It is not PRIME-RL's fork (the Clip-Cov reference), whose
    agg_loss returns sum / norm_length per micro-batch and whose actor scales each micro-batch by
    its share of the mini-batch: that equals this only for micro-batches of one row (16 rows x 12
    tokens: -0.636 here, -10.17 there). The released Clip-Cov recipe uses token-mean, where they
    agree (docs/algorithms.md, Clip-Cov).
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
