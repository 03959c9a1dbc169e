"""Group-relative advantages (GRPO; Shao et al. 2024) as pure tensor functions.

Responses are laid out group by group: rows g*G .. g*G+G-1 belong to prompt g.
"""

import torch


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
        mean, std = torch.zeros_like(grouped), torch.ones_like(grouped)
    else:
        mean = grouped.mean(dim=1, keepdim=True)
        std = grouped.std(dim=1, unbiased=True, keepdim=True)
    centred = grouped - mean
    if scale == "group":
        return (centred / (std + eps)).view(-1)
    if scale == "batch":
        batch_std = rewards.float().std(unbiased=True) if rewards.numel() > 1 else torch.tensor(1.0)
        return (centred / (batch_std + eps)).view(-1)
    if scale == "none":
        return centred.view(-1)
    raise ValueError(f"unknown scale '{scale}'; accepted: group, batch, none")


def zero_spread_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[P] bool: groups whose rewards are all equal (no learning signal under GRPO)."""
    grouped = rewards.view(-1, group_size)
    return (grouped == grouped[:, :1]).all(dim=1)
