"""Tokens per second of the rollout sampler at 8, 32 and 64 sequences, against the limit of
this machine computed in the same run.

The limit is a roofline: every decode step must read the weights (and the KV cache) once and do
2 x parameters x rows multiply-adds, so a step takes at least max(bytes / bandwidth, flops /
matmul throughput); the prefill adds its flops. Bandwidth and matmul throughput come from two
probes run here first (a large tensor sum, a large fp32 matmul) with the same thread count.
The matmul floor is the same roofline with each step's weight matmuls taking what they take on
this machine: the model's own linear layers alone at the batch's row count, multiplied as the
engine multiplies them (packed as this CPU's calibration chose), timed here. Where the floor is far below the limit,
the matmuls do not reach the probes' rates, and no change outside them can close that gap.

The samplers run interleaved, round after round, so a busy machine slows them alike:
  - `generate`: HF `model.generate` on the padded batch with the LoRA adapter unmerged (how
    rollouts were drawn before the `hf` engine);
  - `engine`: the `hf` rollout engine (meds_cli/engine/rollout/hf_sampler.py), its float32
    weights packed as this CPU's calibration chose (core/cpu_calibration.py);
  - `unpacked`, `mkl`, `onednn` (asked for with --samplers): the `hf` engine with its linear
    layers' own matmul, or weights packed for MKL or for oneDNN (engine/rollout/packed_linear.py);
  - `modules` (asked for with --samplers): the `hf` engine with packed weights but every decode
    step through the model's forward instead of a DecoderStep (engine/rollout/decoder_step.py);
  - `bf16` (asked for with --samplers): the `hf` engine under bf16 autocast on CPU, as a
    train.mixed_precision bf16 run samples: bf16 copies of the weights made once per batch
    (engine/rollout/packed_linear.py), float32 logits; only faster on a CPU with bf16 units;
  - `vllm` (asked for with --samplers): the `vllm` rollout engine serving the same policy, the
    adapter as a LoRARequest (float32, eager; needs the vllm package: `make setup-vllm`, then run
    with .venv-vllm/bin/python and OMP_NUM_THREADS set, or vLLM leaves torch one thread).
Response lengths are forced (min_new_tokens = max_new_tokens) so all do the same work.
--lora-rank takes a list: `--lora-rank 16,0` runs every sampler with and without an adapter.

Each length (`--lengths`, new tokens per response) runs at every size; a long response shows
what grows with the position (the KV cache, attention) against the fixed cost of a step.

    python scripts/bench_generate.py [--sizes 8,32,64] [--lengths 48,512] [--rounds 3] [--threads N]
    OMP_NUM_THREADS=2 .venv-vllm/bin/python scripts/bench_generate.py --samplers engine,vllm --lora-rank 16,0
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from meds_cli.core.cpu_budget import prefer_passive_waiting

# measure with the OpenMP waits meds runs with: asked for before torch loads, or it is too late
prefer_passive_waiting()

import torch  # noqa: E402


def probe_bandwidth(clock, megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second read by a sum over a tensor far larger than the caches (best of repeats)."""
    x = torch.ones(megabytes * 2**20 // 4)
    x.sum()
    best = min(_timed(clock, lambda: x.sum()) for _ in range(repeats))
    return x.numel() * 4 / best


def probe_matmul(clock, size: int = 1024, repeats: int = 5) -> float:
    """fp32 multiply-add throughput (flop/s) of a large square matmul (best of repeats)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_timed(clock, lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best


def _timed(clock, fn) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def base_linears(model) -> list[torch.nn.Linear]:
    """The linear layers a decode step multiplies: the base weights, not the LoRA matrices (the
    engine merges the adapter into them, so it costs nothing at decode time)."""
    return [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lora_" not in name]


def probe_linear_step(model, rows: int, clock, repeats: int = 3) -> float:
    """Seconds of one decode step's linear layers alone at `rows` rows (best of repeats): every
    base weight of `model` (adapters merged cost nothing) multiplied as the `hf` engine does,
    through packed_linears, on fresh inputs (layers that share an input share it here too)."""
    from meds_cli.core.cpu_calibration import cpu_fast_paths
    from meds_cli.engine.rollout.packed_linear import packed_linears

    layers = base_linears(model)
    widths = {m.in_features for m in layers}

    def step():
        inputs = {width: torch.randn(rows, width) for width in widths}
        for layer in layers:
            layer(inputs[layer.in_features])

    with torch.no_grad(), packed_linears(model, packing=cpu_fast_paths().paths.float32_packing):
        step(), step()  # the second call at a row count packs the weights
        return min(_timed(clock, step) for _ in range(repeats))


def roofline_seconds(model, rows: int, groups: int, prompt_len: int, new_tokens: int, bandwidth: float,
                     flops: float, linear_step: float | None = None) -> float:
    """Least time to prefill `groups` prompts once and decode `new_tokens` tokens for `rows` rows.
    With `linear_step` (seconds of a step's linear layers at `rows` rows, probe_linear_step), each
    step's weight matmuls take that and only the attention is bounded by the probes."""
    from meds_cli.engine.rollout.decode_rows import kv_cache_bytes_per_token

    cfg = model.config
    linear = sum(m.weight.numel() for m in base_linears(model))
    head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    layers, q_width = cfg.num_hidden_layers, cfg.num_attention_heads * head_dim
    kv_row_token = kv_cache_bytes_per_token(cfg, 4)
    total = 2 * groups * prompt_len * linear / flops
    for t in range(new_tokens):
        context = prompt_len + t
        kv_bytes = rows * context * kv_row_token
        attention_flops = 4 * rows * layers * q_width * context
        if linear_step is None:
            total += max((linear * 4 + kv_bytes) / bandwidth, (2 * rows * linear + attention_flops) / flops)
        else:
            total += linear_step + max(kv_bytes / bandwidth, attention_flops / flops)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", default="8,32,64", help="sequences per batch (8 samples per prompt)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lengths", default="48,512", help="new tokens per response, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as configured for this process)")
    parser.add_argument("--lora-rank", default="16", help="adapter rank, or a comma list of ranks (0: no adapter)")
    parser.add_argument("--samplers", default="generate,engine")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with this process's CPU time instead of wall time: steadier on a busy machine "
                             "(use with --threads 1, where CPU seconds are core seconds)")
    args = parser.parse_args()

    from decode_setup import decoding_policy, engine_requests, prompts_for

    from meds_cli.engine.rollout.hf_sampler import HFEngine
    from meds_cli.engine.rollout.sampling_engine import SamplingSettings, stop_token_ids

    ranks = [int(r) for r in args.lora_rank.split(",")]
    samplers = args.samplers.split(",")
    policies = {rank: decoding_policy(args.model, rank, args.threads) for rank in ranks}
    vllm_engines = {rank: vllm_engine(args.model, model, rank) for rank, (model, _, _) in policies.items()
                    if "vllm" in samplers}
    model, tokenizer, task = policies[ranks[0]]
    sizes = [int(s) for s in args.sizes.split(",")]
    G, lengths = args.group_size, [int(n) for n in args.lengths.split(",")]

    clock = time.process_time if args.cpu_time else time.perf_counter
    bandwidth, flops = probe_bandwidth(clock), probe_matmul(clock)
    print(f"model {args.model}, LoRA rank {args.lora_rank} (0: none), {torch.get_num_threads()} threads, "
          f"{args.lengths} new tokens, {'CPU' if args.cpu_time else 'wall'} time, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"probes: memory read {bandwidth / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.1f} GFLOP/s")
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in base_linears(model))
    linear_steps = {size: probe_linear_step(model, size, clock) for size in sizes}
    print("a step's linear layers alone: " + ", ".join(
        f"{size} rows {seconds * 1e3:.1f} ms ({weight_bytes / seconds / 1e9:.1f} GB/s of weights)"
        for size, seconds in linear_steps.items()))

    def run(sampler: str, size: int, N: int, rank: int) -> float:
        model, tokenizer, _ = policies[rank]
        prompts = prompts_for(task, tokenizer, size, G)
        if sampler == "generate":
            texts = [p for p in prompts for _ in range(G)][:size]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            torch.manual_seed(0)
            t0 = clock()
            with torch.no_grad():
                model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=N,
                               min_new_tokens=N, eos_token_id=list(stop_token_ids(tokenizer)),
                               pad_token_id=tokenizer.pad_token_id)
            return clock() - t0
        requests = engine_requests(prompts, tokenizer, size, G)
        settings = SamplingSettings(1.0, 1.0, N, stop_token_ids(tokenizer), min_new_tokens=N)
        engine = (vllm_engines[rank] if sampler == "vllm" else
                  HFEngine(model, tokenizer.pad_token_id, batch_size=size,
                           packing={"unpacked": "none", "mkl": "mkl", "onednn": "onednn"}.get(sampler),
                           direct_steps=sampler in ("engine", "mkl", "onednn")))
        t0 = clock()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=sampler == "bf16"):
            engine.generate(requests, settings)
        return clock() - t0

    times = {(s, n, N, r): [] for s in samplers for n in sizes for N in lengths for r in ranks}
    for _ in range(args.rounds):
        for N in lengths:
            for size in sizes:
                for rank in ranks:
                    for sampler in samplers:
                        times[(sampler, size, N, rank)].append(run(sampler, size, N, rank))

    prompt_len = len(tokenizer(task.prompt(task.train[0], tokenizer), add_special_tokens=False)["input_ids"])
    print(f"\n{'tokens':>6} {'sequences':>9} {'LoRA':>5} {'sampler':>9} {'median s':>9} {'tokens/s':>9} "
          f"{'limit tok/s':>12} {'of limit':>9} {'mm floor tok/s':>15} {'of floor':>9}")
    for N in lengths:
        for size in sizes:
            shape = (model, size, max(1, size // G), prompt_len, N, bandwidth, flops)
            limit = size * N / roofline_seconds(*shape)
            floor = size * N / roofline_seconds(*shape, linear_step=linear_steps[size])
            for rank in ranks:
                for sampler in samplers:
                    median = statistics.median(times[(sampler, size, N, rank)])
                    rate = size * N / median
                    print(f"{N:>6} {size:>9} {rank or '-':>5} {sampler:>9} {median:>9.2f} {rate:>9.1f} "
                          f"{limit:>12.1f} {rate / limit:>9.0%} {floor:>15.1f} {rate / floor:>9.0%}")
    print(f"(median of {args.rounds} interleaved rounds; load average now {os.getloadavg()[0]:.1f})")


def vllm_engine(model_name: str, policy, rank: int):
    """The `vllm` rollout engine following `policy` (its adapter pushed as a LoRARequest) in float32."""
    import tempfile

    from meds_cli.engine.model_io.model import resolve_model
    from meds_cli.engine.rollout.vllm_engine import VLLMConfig, VLLMEngine

    options = VLLMConfig(dtype="float32", sleep_level=0, max_model_len=1024, enforce_eager=True)
    return VLLMEngine(resolve_model(model_name), options=options, policy=policy, lora_rank=rank or None,
                      scratch_dir=Path(tempfile.mkdtemp(prefix="bench-vllm-")))


if __name__ == "__main__":
    main()
