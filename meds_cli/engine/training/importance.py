"""Sampler/trainer mismatch: truncated importance sampling and the metrics that watch it.

The rollout engine samples with its own kernels (vLLM: other attention and matmul code, often
bf16), so the probability it gave a token, pi_sampler(y), differs from the trainer's
pi_old(y) for the same weights. The trainer's loss treats the batch as drawn from pi_old;
truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly
brings you off-policy RL training") reweights each token's loss by

    w = min(pi_old(y) / pi_sampler(y), cap)        (no gradient through w)

so the update estimates the on-policy gradient, with the cap bounding the variance.

The decoupled objective (Fu et al. 2025, AReaL, arXiv 2505.24298, eq. 5) reads the same factor
for rollouts sampled by stale weights: the PPO ratio and its clip are taken against the
proximal policy (pi_old here: the trainer's log-probs before the update, from the scoring pass),
and the behaviour policy that sampled the tokens (the engine, possibly k versions old) enters
only through the weight pi_prox / pi_behav. Where TIS truncates that weight at the cap, AReaL
leaves the token out (weight 0; `behav_imp_weight_cap` in its ppo_actor_loss_fn), so a token
the stale sampler drew far more readily than the current policy would contributes nothing
rather than a capped amount; the loss's normaliser still counts it, as AReaL's does:

    w = pi_old(y) / pi_sampler(y)  where that is <= cap, else 0      (no gradient through w)

Metrics, on the response tokens (mask), with d = log pi_old(y) - log pi_sampler(y):
  logp_abs_diff   mean |d|
  kl_k1           mean -d            (unbiased estimate of KL(sampler || trainer))
  kl_k3           mean e^d - 1 - d   (Schulman's k3: unbiased, never negative, lower variance)
  tis_capped      share of tokens whose ratio e^d exceeds the cap (tis: truncated there;
                  decoupled: left out)

Both compare like with like only when the sampler's log-probs are those of the full softmax at
the temperature, as the trainer's are. Under nucleus sampling (top_p < 1) or with stop tokens
held back (min_new_tokens > 0) they are those of the truncated distribution it sampled from, so
every ratio is off by the kept mass (about 0.71 at top_p 0.7) whatever the kernels do: TIS is
refused with those settings when the config loads, and the metrics are not logged
(`truncation_of_sampler`; docs/algorithms.md, "Sampler mismatch").
"""

from __future__ import annotations

import torch

IS_CORRECTIONS = ("none", "tis", "decoupled")


def truncation_of_sampler(top_p: float, min_new_tokens: int) -> str | None:
    """Why the sampler's log-probs are not of the full softmax the trainer takes (the settings that
    truncate its distribution), or None when they are."""
    reasons = ([f"top_p={top_p} samples from the nucleus only"] if top_p < 1.0 else []) + (
        [f"min_new_tokens={min_new_tokens} holds the stop tokens back"] if min_new_tokens > 0 else [])
    return "; ".join(reasons) or None


def tis_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token min(exp(trainer_logp - sampler_logp), cap), detached."""
    return (trainer_logp.detach() - sampler_logp.detach()).exp().clamp(max=cap)


def decoupled_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token behaviour weight exp(trainer_logp - sampler_logp) of the decoupled objective, 0
    where it exceeds `cap` (AReaL's filter), detached."""
    ratio = (trainer_logp.detach() - sampler_logp.detach()).exp()
    return torch.where(ratio <= cap, ratio, torch.zeros_like(ratio))


def is_correction_weights(mode: str, trainer_logp: torch.Tensor, sampler_logp: torch.Tensor | None,
                          cap: float) -> torch.Tensor | None:
    """The factor the per-token loss is multiplied by (None: no correction). The hook the loss
    calls: `loss_mat = loss_mat * w` where w is not None."""
    if mode == "none" or sampler_logp is None:
        return None
    if mode == "tis":
        return tis_weights(trainer_logp, sampler_logp, cap)
    if mode == "decoupled":
        return decoupled_weights(trainer_logp, sampler_logp, cap)
    raise ValueError(f"unknown importance-sampling correction '{mode}'")


def mismatch_metrics(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                     cap: float | None = None) -> dict[str, float]:
    """The module docstring's metrics over tokens where mask is 1 (empty dict for no tokens)."""
    mask = mask.float()
    count = mask.sum()
    if count == 0:
        return {}
    d = (trainer_logp - sampler_logp).float() * mask  # zero off the mask, so every term below is too

    def mean(x):
        return float((x * mask).sum() / count)

    out = {"mismatch/logp_abs_diff": mean(d.abs()), "mismatch/kl_k1": mean(-d), "mismatch/kl_k3": mean(d.exp() - 1 - d)}
    if cap is not None:
        out["mismatch/tis_capped"] = mean((d.exp() > cap).float())
    return out
