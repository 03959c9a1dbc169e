"""Where the `hf` engine's decode time goes as responses grow: per-token cost by position, and the op profile.

For each response length (forced: min_new_tokens = max_new_tokens) it samples one batch of
`--sequences` rows (8 samples of one prompt by default, LoRA rank 16 with a non-zero adapter, as
scripts/bench_generate.py does) and prints
  - the wall (or CPU) time, tokens per second and milliseconds per token;
  - the milliseconds per decode step (from one token's draw to the next: the forward, the draw,
    the bookkeeping) over the first and the last tenth of the steps (a step whose cost grows with
    the position shows here: work that grows faster than the attention it must do), and the
    share of the wall time spent drawing tokens. Steps are timed at the draws, not by hooks on
    the model: a hook sends every step through the model's forward instead of the direct step
    the engine runs (engine/rollout/decoder_step.py);
  - with --ops, torch.profiler's top operators by self CPU time (concatenation, matmuls, attention,
    Python-side dispatch show by name).

    python scripts/profile_decode.py [--lengths 32,128,512] [--sequences 8] [--threads N] [--ops]
Run it with PYTHONPATH set to another checkout to profile that tree the same way (before / after).
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager

from meds_cli.core.cpu_budget import prefer_passive_waiting

# measure with the OpenMP waits meds runs with: asked for before torch loads, or it is too late
prefer_passive_waiting()

import torch  # noqa: E402


@contextmanager
def draw_clock(clock):
    """Within the block, every token draw of the `hf` decode loop appends (start, seconds) by
    `clock` to the list it yields."""
    from meds_cli.engine.rollout import hf_sampler

    draws, choose = [], hf_sampler.choose_tokens

    def timed(*args, **kwargs):
        start = clock()
        chosen = choose(*args, **kwargs)
        draws.append((start, clock() - start))
        return chosen

    hf_sampler.choose_tokens = timed
    try:
        yield draws
    finally:
        hf_sampler.choose_tokens = choose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", default="32,128,512", help="new tokens per response, comma-separated")
    parser.add_argument("--sequences", type=int, default=8, help="rows per batch (8 samples per prompt)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as configured for this process)")
    parser.add_argument("--ops", action="store_true", help="also run torch.profiler and print the top operators")
    parser.add_argument("--top", type=int, default=12, help="operators listed with --ops")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with this process's CPU time instead of wall time: steadier on a busy machine "
                             "(use with --threads 1, where CPU seconds are core seconds)")
    args = parser.parse_args()

    from decode_setup import decoding_policy, engine_requests, prompts_for

    from meds_cli.engine.rollout.hf_sampler import HFEngine
    from meds_cli.engine.rollout.sampling_engine import SamplingSettings, stop_token_ids

    model, tokenizer, task = decoding_policy(args.model, 16, args.threads)
    group = 8
    requests = engine_requests(prompts_for(task, tokenizer, args.sequences, group), tokenizer, args.sequences, group)
    engine = HFEngine(model, tokenizer.pad_token_id, batch_size=args.sequences)
    print(f"model {args.model}, LoRA rank 16, {args.sequences} sequences, prompt {len(requests[0].prompt_ids)} tokens, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    engine.generate(requests, SamplingSettings(1.0, 1.0, 8, stop_token_ids(tokenizer), min_new_tokens=8))  # warm-up

    clock = time.process_time if args.cpu_time else time.perf_counter
    print(f"{'tokens':>6} {'CPU s' if args.cpu_time else 'wall s':>7} {'tok/s':>7} {'ms/token':>9} "
          f"{'step ms first 10%':>18} {'step ms last 10%':>17} {'drawing':>8}")
    for length in (int(x) for x in args.lengths.split(",")):
        settings = SamplingSettings(1.0, 1.0, length, stop_token_ids(tokenizer), min_new_tokens=length)
        with draw_clock(clock) as draws:
            t0 = clock()
            engine.generate(requests, settings)
            wall = clock() - t0
        starts = [start for start, _ in draws]
        steps = [b - a for a, b in zip(starts, starts[1:])]  # draw to draw: one decode step each
        tenth = max(1, len(steps) // 10)
        first, last = sum(steps[:tenth]) / tenth, sum(steps[-tenth:]) / tenth
        rows = args.sequences * length
        print(f"{length:>6} {wall:>7.2f} {rows / wall:>7.1f} {wall / length * 1e3:>9.1f} {first * 1e3:>18.1f} "
              f"{last * 1e3:>17.1f} {sum(seconds for _, seconds in draws) / wall:>8.0%}", flush=True)
        if args.ops:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                engine.generate(requests, settings)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events)
            print(f"  top operators by self CPU time at {length} tokens (profiled run, {total / 1e6:.2f} CPU s):")
            for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]:
                print(f"    {e.key[:48]:<48} {e.self_cpu_time_total / total:>6.1%} {e.count:>8} calls")


if __name__ == "__main__":
    main()
