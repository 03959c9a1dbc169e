"""Per-token log-probabilities of the sampled tokens, and the policy's entropy, from the last
hidden states and the output head, computed in chunks of positions.

The direct way, head(hidden) -> log_softmax, materialises fp32 logits [b, R, V] and several
temporaries of that size (about 15 GB each at 8 x 3,072 tokens and a 151,936 vocabulary). Here
the positions are flattened and cut into chunks of `chunk_tokens`; each chunk's logits live only
while that chunk is reduced to its two numbers per token. Under autograd every chunk runs inside
an activation checkpoint, so the backward pass recomputes one chunk's logits at a time instead
of keeping all of them: the peak is a few chunks' logits, not a few [b, R, V] tensors, for one
extra head matmul per position (none when everything fits in one chunk).

Both quantities are taken at the sampling temperature T: softmax(logits / T) is the distribution
the rollout engine sampled from, so the ratio, the KL and the entropy refer to it (verl scales
the logits the same way). Entropy is returned without a gradient (a diagnostic; keeping it out
of the graph saves memory) unless `entropy_grad` asks for it: the entropy bonus puts it in the loss.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from meds_cli.core.forward import full_precision

DEFAULT_CHUNK_TOKENS = 1024  # 1,024 x 151,936 fp32 logits: 0.6 GB per copy


def _chunk_stats(head: Callable, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                 with_entropy: bool, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of `tokens` and entropy for one chunk: hidden [n, H], tokens [n] -> two [n]."""
    logits = full_precision(head(hidden))
    if temperature != 1.0:
        logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - normaliser
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    if entropy_grad:
        return logp, normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    with torch.no_grad():
        # H = logsumexp(z) - sum softmax(z) * z, one [n, V] temporary instead of log_softmax's two
        expected = (torch.softmax(logits.detach(), dim=-1) * logits.detach()).sum(-1)
        entropy = normaliser.detach() - expected
    return logp, entropy


def token_logprobs_and_entropy(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                               tokens: torch.Tensor, *, temperature: float = 1.0, mask: torch.Tensor | None = None,
                               chunk_tokens: int = DEFAULT_CHUNK_TOKENS, with_entropy: bool = True,
                               entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(tokens), entropy), each [b, R] fp32, of softmax(head(hidden) / temperature).

    hidden [b, R, H]: the final (normed) hidden state at the position that predicts each token;
    head: maps [n, H] to logits [n, V] (the model's output embedding, adapters included);
    tokens [b, R]: the sampled tokens; mask [b, R] (optional): positions where it is 0 are not
    computed and come back as 0 (padding after a response's end costs nothing).
    Gradients flow to `hidden` and the head's parameters through the log-probs, and through the
    entropy too when `entropy_grad` (with_entropy implied).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    with_entropy = with_entropy or entropy_grad
    b, r = tokens.shape
    flat_hidden = hidden.reshape(b * r, hidden.shape[-1])
    flat_tokens = tokens.reshape(b * r)
    keep = None
    if mask is not None:
        keep = mask.reshape(b * r).nonzero().squeeze(-1).to(hidden.device)
        flat_hidden, flat_tokens = flat_hidden.index_select(0, keep), flat_tokens.index_select(0, keep)
    # One chunk is kept for the backward pass anyway: recomputing it would cost a head matmul and
    # save nothing, so only several chunks go through activation checkpoints.
    several = flat_tokens.shape[0] > chunk_tokens
    grad = several and torch.is_grad_enabled() and (flat_hidden.requires_grad or any(
        p.requires_grad for p in getattr(head, "parameters", lambda: [])()))
    logps, entropies = [], []
    for start in range(0, flat_tokens.shape[0], chunk_tokens):
        h, t = flat_hidden[start:start + chunk_tokens], flat_tokens[start:start + chunk_tokens]
        if grad:
            logp, entropy = checkpoint(_chunk_stats, head, h, t, temperature, with_entropy, entropy_grad,
                                       use_reentrant=False)
        else:
            logp, entropy = _chunk_stats(head, h, t, temperature, with_entropy, entropy_grad)
        logps.append(logp)
        entropies.append(entropy)
    logp = torch.cat(logps) if logps else flat_hidden.new_zeros(0, dtype=torch.float32)
    entropy = torch.cat(entropies) if entropies else logp.detach().clone()
    if keep is not None:
        logp = logp.new_zeros(b * r).index_put((keep,), logp)
        entropy = entropy.new_zeros(b * r).index_put((keep,), entropy)
    return logp.reshape(b, r), (entropy.reshape(b, r) if with_entropy else None)
