"""What the check of every rollout an engine returns (meds_cli/engine/rollout/rollout_check.py)
costs, beside what the same step does anyway with those samples: laying them out as a batch
(batch.rollouts_from_samples: tensors and the decoded texts) and sampling them with the cheapest
engine there is (the hf decode loop on the in-memory tiny model).

Samples are made as the hf engine returns them (Python lists from .tolist()), with a vocabulary
of Qwen2.5's size; the figure per token is what matters, since the check is one pass over them.

    python scripts/bench_rollout_check.py                         # 512 samples x 512 tokens
    python scripts/bench_rollout_check.py --samples 64 --tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_seconds(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=512, help="samples in the batch (prompts x group size)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=512, help="tokens per response")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen2.5's by default)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from meds_cli.engine.model_io.tiny import tiny_model_and_tokenizer
    from meds_cli.engine.rollout.batch import rollouts_from_samples, sample_responses
    from meds_cli.engine.rollout.rollout_check import check_samples
    from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings

    torch.manual_seed(0)
    prompts = args.samples // args.group
    settings = SamplingSettings(1.0, 1.0, args.tokens, (args.vocab - 1,))
    requests = [SampleRequest(tuple(range(2, 34)), tuple(range(i * args.group, (i + 1) * args.group)))
                for i in range(prompts)]
    ids = torch.randint(0, args.vocab - 1, (prompts * args.group, args.tokens))
    logprobs = -torch.rand(prompts * args.group, args.tokens) * 5
    flat = [Sample(ids[i].tolist(), False, logprobs[i].tolist()) for i in range(prompts * args.group)]
    samples = [flat[i * args.group:(i + 1) * args.group] for i in range(prompts)]
    tokens = prompts * args.group * args.tokens

    check = median_seconds(lambda: check_samples("hf", requests, samples, settings, args.vocab), args.repeats)
    _, tokenizer = tiny_model_and_tokenizer()
    small = [[Sample([t % 50 + 2 for t in s.token_ids], False, s.logprobs) for s in group] for group in samples]
    layout = median_seconds(lambda: rollouts_from_samples(tokenizer, [r.prompt_ids for r in requests], small,
                                                          [None] * prompts, args.group, settings.stop_ids),
                            max(1, args.repeats // 2))
    print(f"{prompts * args.group} samples x {args.tokens} tokens = {tokens} tokens, vocabulary {args.vocab}, "
          f"{torch.get_num_threads()} torch threads, median of {args.repeats}")
    print(f"  the check (rollout_check.check_samples):   {check * 1e3:8.1f} ms  {check / tokens * 1e9:7.1f} ns/token")
    print(f"  laying out the batch (rollouts_from_samples): {layout * 1e3:5.1f} ms  "
          f"{layout / tokens * 1e9:7.1f} ns/token  (check / layout = {check / layout:.1%})")

    model, tokenizer = tiny_model_and_tokenizer()
    n_prompts, length = 8, 32

    def sample():
        sample_responses(model, tokenizer, ["abc"] * n_prompts, [None] * n_prompts, args.group, temperature=1.0,
                         top_p=1.0, max_new_tokens=length, batch_size=64, min_new_tokens=length)

    sample()  # warm-up: first calls build what later ones reuse
    sampled = median_seconds(sample, 3)
    per_token = sampled / (n_prompts * args.group * length)
    print(f"  sampling with the hf engine on the tiny model: {per_token * 1e9:10.1f} ns/token "
          f"(check / sampling = {check / tokens / per_token:.2%}; a real model samples far slower)")


if __name__ == "__main__":
    main()
