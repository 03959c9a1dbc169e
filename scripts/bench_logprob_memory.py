"""Peak memory of scoring + loss for one micro-batch, with full logits (before) and in chunks (after).

    python scripts/bench_logprob_memory.py [--batch 8] [--length 3072] [--vocab 151936] [--hidden 64]
                                           [--chunk-tokens 1024] [--before-max-tokens 1024]

One micro-batch of `batch` x `length` response tokens goes through what the trainer does with the
output head: a no-grad scoring pass (log-probs of the sampled tokens and entropy), then the
clipped-surrogate loss's forward and backward. The transformer body is left out (a random
hidden-state tensor of a small hidden size stands in for it): the logits dominate at a large
vocabulary, and they are what the chunking changes.

How memory is measured: each variant runs in a fresh subprocess with glibc told to serve every
allocation above 64 KiB by mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the resident set
at once and the resident set follows the live tensors. After setup the kernel's high-water mark
is reset (writing 5 to /proc/self/clear_refs), and the peak is VmHWM minus the resident set at
that moment: the memory scoring + loss added at its highest point, whatever setup did before.
Without /proc (not Linux) it falls back to ru_maxrss, which only counts when the phase sets a
new process-wide peak.

The full-logit variant needs several fp32 copies of [b, R, V] (about 15 GB each at the default
shape), more than a small machine has: it is measured at two sizes up to --before-max-tokens and
extrapolated linearly in the number of tokens (its memory is a constant plus a multiple of the
logits), and the output says so. --before-max-tokens 0 measures it at the full shape.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- measuring, inside a child process


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def full_logit_stats(head, hidden, tokens, temperature):
    """The project's previous computation, kept here as the baseline: fp32 logits [b, R, V] in one
    piece, log-prob as gather - logsumexp, entropy from log_softmax."""
    import torch

    logits = head(hidden).float() / temperature
    logp = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy


def measure(variant: str, batch: int, length: int, vocab: int, hidden_size: int, chunk_tokens: int,
            temperature: float = 1.0) -> dict:
    """Peak added memory (MiB) of scoring + loss for one micro-batch; runs in this process."""
    import gc
    import time

    import torch

    from meds_cli.engine.training.logprobs import token_logprobs_and_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(batch, length, hidden_size, requires_grad=True)
    tokens = torch.randint(0, vocab, (batch, length))
    mask = torch.ones(batch, length)
    advantages = torch.randn(batch, 1)

    def stats(h, t):
        if variant == "before":
            return full_logit_stats(head, h, t, temperature)
        return token_logprobs_and_entropy(h, head, t, temperature=temperature, chunk_tokens=chunk_tokens)

    def scoring_and_loss(h, t):
        with torch.no_grad():  # scoring: old log-probs and entropy
            old_logp, entropy = stats(h, t)
        logp, _ = stats(h, t)  # the loss: forward with autograd, then backward
        ratio = torch.exp(logp - old_logp)
        rows = slice(0, t.shape[0])
        loss = -(advantages[rows] * ratio * mask[rows, :t.shape[1]]).sum() / mask[rows, :t.shape[1]].sum()
        loss.backward()
        return loss.detach(), entropy

    # A first pass just over one chunk long loads the code paths: pages of libtorch touched for
    # the first time count in the resident set and would otherwise be charged to the measured pass.
    warm = min(length, chunk_tokens + 1)
    scoring_and_loss(hidden[:1, :warm].detach().requires_grad_(), tokens[:1, :warm])
    head.zero_grad(set_to_none=True)
    gc.collect()
    exact = reset_peak()
    baseline = status_kib("VmRSS") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    loss, entropy = scoring_and_loss(hidden, tokens)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "tokens": batch * length, "peak_mib": (peak - baseline) / 1024, "seconds": seconds,
            "method": "VmHWM after clear_refs" if exact else "ru_maxrss delta", "loss": float(loss),
            "grad_sum": float(hidden.grad.abs().sum()), "entropy_mean": float(entropy.mean())}


def run_child(variant: str, batch: int, length: int, args) -> dict:
    """measure() in a fresh process, so one variant's allocations never count in another's."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", variant, "--batch", str(batch), "--length",
           str(length), "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--chunk-tokens",
           str(args.chunk_tokens), "--temperature", str(args.temperature)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the report


def extrapolate(small: dict, large: dict, tokens: int) -> float:
    """Peak at `tokens` from a line through two measurements (memory = constant + slope * tokens)."""
    slope = (large["peak_mib"] - small["peak_mib"]) / (large["tokens"] - small["tokens"])
    return large["peak_mib"] + slope * (tokens - large["tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=3072)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--before-max-tokens", type=int, default=1024,
                        help="measure the full-logit variant at most this many tokens and extrapolate (0: full shape)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--child", choices=["before", "after"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.batch, args.length, args.vocab, args.hidden, args.chunk_tokens,
                                 args.temperature)))
        return
    tokens = args.batch * args.length
    after = run_child("after", args.batch, args.length, args)
    if args.before_max_tokens and args.before_max_tokens < tokens:
        small = run_child("before", 1, args.before_max_tokens // 2, args)
        large = run_child("before", 1, args.before_max_tokens, args)
        before_mib, how = extrapolate(small, large, tokens), (f"extrapolated from {small['tokens']} and "
                                                              f"{large['tokens']} tokens")
    else:
        before = run_child("before", args.batch, args.length, args)
        before_mib, how = before["peak_mib"], "measured"
    logits_mib = tokens * args.vocab * 4 / 2**20
    result = {"batch": args.batch, "length": args.length, "vocab": args.vocab, "hidden": args.hidden,
              "chunk_tokens": args.chunk_tokens, "fp32_logits_mib": logits_mib, "before_mib": before_mib,
              "before_how": how, "after_mib": after["peak_mib"], "after_seconds": after["seconds"],
              "method": after["method"], "factor": before_mib / max(after["peak_mib"], 1e-9)}
    if args.json:
        print(json.dumps(result))
        return
    print(f"scoring + loss, one micro-batch of {args.batch} x {args.length} tokens, vocabulary {args.vocab}, "
          f"hidden {args.hidden} (one fp32 [b, R, V] = {logits_mib / 1024:.1f} GiB); peak by {after['method']}")
    print(f"  before (full logits):          {before_mib / 1024:8.2f} GiB  ({how})")
    print(f"  after ({args.chunk_tokens}-token chunks):     {after['peak_mib'] / 1024:8.2f} GiB  "
          f"(measured, {after['seconds']:.1f} s)")
    print(f"  factor: {result['factor']:.1f}x")


if __name__ == "__main__":
    main()
