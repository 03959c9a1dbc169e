"""Advantage estimators: each response's outcome reward -> its advantage, as pure tensor functions.

Responses are laid out group by group: rows g*G .. g*G+G-1 belong to prompt g. Every token of a
response shares its response's advantage (outcome rewards; no value model, no per-token returns).

Estimators are registered by name in ADV_ESTIMATORS with verl's names (its register_adv_est) and
chosen by an algorithm's `adv_estimator` config key; each takes (rewards [B], group_size,
token_counts [B], config) and returns advantages [B]. token_counts holds each response's number of
tokens, for estimators that weigh responses by length. Formulas and sources: docs/algorithms.md.
"""

from math import comb
from typing import Callable

import torch

from meds_cli.core.registry import Registry

ADV_ESTIMATORS: Registry[Callable] = Registry("advantage estimator")

# verl's masked_whiten adds this to the variance under the square root; kept so numbers compare.
WHITEN_EPS = 1e-8


def register_adv_estimator(name: str, description: str):
    """Decorator: register an estimator f(rewards, group_size, token_counts, config) -> advantages [B]."""
    return ADV_ESTIMATORS.register(name, description)


def group_means(grouped: torch.Tensor) -> torch.Tensor:
    """[P, 1] mean reward of each group of `grouped` [P, G]. A group of one has no baseline: like
    verl's outcome estimators it gets mean 0, so its advantage starts from its own reward."""
    if grouped.shape[1] == 1:
        return torch.zeros_like(grouped)
    return grouped.mean(dim=1, keepdim=True)


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean_g r) / (std_g r + eps), std unbiased.

    scale: 'group' divides by the group's std, 'batch' by the std of all rewards in the batch
    (TRL's scale_rewards='batch'), 'none' does not divide (Dr. GRPO).
    A group of one has no baseline: like verl's compute_grpo_outcome_advantage it uses mean 0
    and std 1, so its advantage is r / (1 + eps).
    """
    if rewards.numel() == 0:
        return rewards.clone()
    grouped = rewards.float().view(-1, group_size)
    if group_size == 1:
        std = torch.ones_like(grouped)
    else:
        std = grouped.std(dim=1, unbiased=True, keepdim=True)
    centred = grouped - group_means(grouped)
    if scale == "group":
        return (centred / (std + eps)).view(-1)
    if scale == "batch":
        batch_std = rewards.float().std(unbiased=True) if rewards.numel() > 1 else torch.tensor(1.0)
        return (centred / (batch_std + eps)).view(-1)
    if scale == "none":
        return centred.view(-1)
    raise ValueError(f"unknown scale '{scale}'; accepted: group, batch, none")


def leave_one_out_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_g r).

    A group of one has no other response to compare with: A = r, as in verl's
    compute_rloo_outcome_advantage."""
    if rewards.numel() == 0 or group_size == 1:
        return rewards.float().clone()
    grouped = rewards.float().view(-1, group_size)
    return ((grouped - group_means(grouped)) * group_size / (group_size - 1)).view(-1)


def token_weighted_whiten(values: torch.Tensor, token_counts: torch.Tensor) -> torch.Tensor:
    """(x_i - m) / sqrt(v + WHITEN_EPS), m and v the mean and unbiased variance over the batch's
    tokens, where response i contributes x_i once per token: the same numbers as whitening the
    per-token advantages [B, R] under the response mask (verl's masked_whiten), without building
    them."""
    weights = token_counts.float()
    tokens = weights.sum()
    mean = (weights * values).sum() / tokens.clamp(min=1)
    variance = (weights * (values - mean) ** 2).sum() / (tokens - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(variance + WHITEN_EPS)


def group_baseline_whitened_advantages(rewards: torch.Tensor, group_size: int,
                                       token_counts: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025): r_i - mean_g r (a group of one: r_i), then whitened
    over every token of the batch (token_weighted_whiten)."""
    if rewards.numel() == 0:
        return rewards.float().clone()
    grouped = rewards.float().view(-1, group_size)
    return token_weighted_whiten((grouped - group_means(grouped)).view(-1), token_counts)


@register_adv_estimator("grpo", "(r - group mean) / (group std + adv_eps); scale_rewards batch: the batch's std, "
                                "none: no division (Dr. GRPO)")
def grpo_estimator(rewards, group_size, token_counts, config):
    return group_advantages(rewards, group_size, config.scale_rewards, config.adv_eps)


@register_adv_estimator("rloo", "RLOO: r minus the mean reward of the other responses to the same prompt")
def rloo_estimator(rewards, group_size, token_counts, config):
    return leave_one_out_advantages(rewards, group_size)


@register_adv_estimator("reinforce_plus_plus", "REINFORCE++ (outcome reward, gamma 1): r whitened over the batch's "
                                               "tokens, no group baseline")
def reinforce_plus_plus_estimator(rewards, group_size, token_counts, config):
    # With the reward on the last token and gamma 1 (verl's default), every token's return is r.
    if rewards.numel() == 0:
        return rewards.float().clone()
    return token_weighted_whiten(rewards.float(), token_counts)


@register_adv_estimator("reinforce_plus_plus_baseline", "REINFORCE++-baseline: r minus the group mean, then "
                                                        "whitened over the batch's tokens")
def reinforce_plus_plus_baseline_estimator(rewards, group_size, token_counts, config):
    return group_baseline_whitened_advantages(rewards, group_size, token_counts)


def passk_group_advantages(passed: torch.Tensor, group_size: int, k: int, eps: float = 1e-6) -> torch.Tensor:
    """Pass@k Training's closed-form advantages (Chen et al. 2025, RUCAIBox/Passk_Training
    passk_adv.py). In a group of n = group_size responses with c passes:
        rho   = 1 - C(n - c, k) / C(n, k)                (pass@k of the group)
        sigma = sqrt(rho * (1 - rho))
        A_pass = (1 - rho) / (sigma + eps)
        A_fail = (1 - rho - C(n - c - 1, k - 1) / C(n - 1, k - 1)) / (sigma + eps)
    with C(a, b) = 0 when b > a. An all-pass or all-fail group gets 0. `passed` [B] bool."""
    if k > group_size:
        raise ValueError(f"pass@k with k={k} needs at least k responses per group, got {group_size}")
    grouped = passed.view(-1, group_size)
    out = torch.zeros(grouped.shape, dtype=torch.float64)
    n = group_size
    for g, row in enumerate(grouped):
        c = int(row.sum())
        if c in (0, n):  # rho is 0 or 1: no spread (the reference's formulas give 0 here too)
            continue
        rho = 1 - comb(n - c, k) / comb(n, k)
        sigma = (rho * (1 - rho)) ** 0.5
        fail = (1 - rho - comb(n - c - 1, k - 1) / comb(n - 1, k - 1)) / (sigma + eps)
        out[g] = torch.where(row, (1 - rho) / (sigma + eps), fail)
    return out.view(-1).float()


@register_adv_estimator("passk", "Pass@k Training: the closed-form advantage of pass@k with k = passk_k "
                                 "(a positive reward is a pass)")
def passk_estimator(rewards, group_size, token_counts, config):
    # The reference reads rewards of 1 as passes and 0 as fails; here any positive reward passes,
    # so shaping that only lowers a correct response's reward (DAPO's overlong penalty) keeps it a pass.
    return passk_group_advantages(rewards > 0, group_size, config.passk_k)


def zero_spread_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[P] bool: groups whose rewards are all equal (no learning signal under GRPO)."""
    grouped = rewards.view(-1, group_size)
    return (grouped == grouped[:, :1]).all(dim=1)
