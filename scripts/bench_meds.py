"""What MEDS costs per step over its base, DAPO, on the same short configuration.

Two trainers (DAPO, MEDS on DAPO) with the same config and seed run step by step in turn, so a
busy shared CPU slows both alike. The learning rate is tiny (the paper's 1e-6) so that both
policies stay almost the same and sample the same responses: the generation work is equal and
the difference is MEDS's own (the logit-lens values recorded while sampling, or with an engine
that records none the scoring pass with hidden states; the anchors, clustering, memory). The
first `--skip` steps (imports, lazy initialisation) are left out of the means.

    python scripts/bench_meds.py                    # embedded SmolLM2-135M (minutes on CPU)
    python scripts/bench_meds.py --tiny --steps 6   # the in-memory tiny model (seconds)
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path

HOOKS = ("observe_probe", "observe_forward", "shape_rewards", "on_step_end", "step_metrics")


def timed_hooks(algorithm) -> dict[str, float]:
    """Wrap the MEDS hooks with timers (wall and process CPU); returns the dict they add to."""
    spent = {"wall": 0.0, "cpu": 0.0, "cpu_observe": 0.0}
    for name in HOOKS:
        hook = getattr(algorithm, name)

        @functools.wraps(hook)
        def timed(*args, _hook=hook, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return _hook(*args, **kwargs)
            finally:
                spent["wall"] += time.perf_counter() - t0
                spent["cpu"] += time.process_time() - c0
                if _hook.__name__ in ("observe_probe", "observe_forward"):
                    spent["cpu_observe"] += time.process_time() - c0

        setattr(algorithm, name, timed)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="use the in-memory tiny model on the copy task")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip", type=int, default=1, help="first steps left out of the means")
    parser.add_argument("--repeats", type=int, default=5,
                        help="repeats of the sampling A/B with and without lens values (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier timings on a shared CPU)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra section.key=value")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from meds_cli.engine.config import load_config
    from meds_cli.engine.trainer import Trainer

    if args.tiny:
        base = ["model.name=tiny-llama", "task.name=copy", "rollout.max_new_tokens=16", "model.lora.rank=8"]
    else:
        base = [f"model.name={args.model}", "task.name=arithmetic", "task.prompt_style=chat",
                "rollout.max_new_tokens=48"]
    common = [*base, "rollout.prompts_per_step=4", "rollout.group_size=8", "train.micro_batch_size=16",
              "optim.lr=1.0e-6", "optim.warmup_steps=0", f"train.steps={args.steps}", "train.checkpoint_every=0",
              "dapo.dynamic_sampling=false", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {name: Trainer(load_config(overrides=[*common, f"algo.name={name}"]), Path(tmp) / name)
                    for name in ("dapo", "meds")}
        hook_time = timed_hooks(trainers["meds"].algorithm)
        rows: dict[str, list[dict]] = {name: [] for name in trainers}
        for step in range(args.steps):
            for name, trainer in trainers.items():
                before, c0 = dict(hook_time), time.process_time()
                row = trainer.train_step()
                # CPU time of this process: on a shared machine far steadier than wall time
                row["cpu_step_s"] = time.process_time() - c0
                if name == "meds":
                    row["hooks_s"] = hook_time["wall"] - before["wall"]
                    row["cpu_hooks_s"] = hook_time["cpu"] - before["cpu"]
                    row["cpu_observe_s"] = hook_time["cpu_observe"] - before["cpu_observe"]
                rows[name].append(row)
                print(f"step {step + 1} {name:5s} wall {row['time_step_s']:7.2f} s  cpu {row['cpu_step_s']:7.2f} s  "
                      f"(generate {row['time_generate_s']:.2f}, score {row['time_score_s']:.2f}, "
                      f"train {row['time_train_s']:.2f}; {row['response_length_mean']:.1f} tokens/response)",
                      flush=True)

    def mean(name, key):
        values = [r[key] for r in rows[name][args.skip:]]
        return statistics.mean(values) if values else float("nan")

    print(f"\nmeans over steps {args.skip + 1}..{args.steps} ({'tiny-llama' if args.tiny else args.model}):")
    print(f"{'':22s}{'dapo':>10s}{'meds':>10s}{'ratio':>8s}")
    for key in ("cpu_step_s", "time_step_s", "time_generate_s", "time_score_s", "time_train_s"):
        d, m = mean("dapo", key), mean("meds", key)
        ratio = f"{m / d:8.3f}" if d else f"{'-':>8s}"  # DAPO skips the scoring pass: no score time to divide by
        print(f"{key:22s}{d:10.3f}{m:10.3f}{ratio}")
    print(f"MEDS hooks: {mean('meds', 'hooks_s') * 1000:.1f} ms/step wall, "
          f"{mean('meds', 'cpu_hooks_s') * 1000:.1f} ms/step CPU, "
          f"of which features (observe_probe / observe_forward) {mean('meds', 'cpu_observe_s') * 1000:.1f} ms")
    print(f"MEDS hooks / DAPO step, CPU time: {mean('meds', 'cpu_hooks_s') / mean('dapo', 'cpu_step_s'):.2%}")
    if args.repeats and trainers["meds"].lens_probe is not None:
        plain, meds = sampling_ab(trainers["meds"], args.repeats)
        print(f"sampling one batch, best of {args.repeats} (interleaved): without lens values {plain:.3f} s, "
              f"recording them {meds:.3f} s ({meds / plain - 1:+.1%})")
        own = max(0.0, meds - plain) + mean("meds", "cpu_hooks_s")
        print(f"estimated MEDS overhead per step: {own:.3f} s = {own / mean('dapo', 'cpu_step_s'):.2%} "
              "of a DAPO step (CPU)")


def sampling_ab(trainer, repeats: int, clock=time.perf_counter) -> tuple[float, float]:
    """Best-of-`repeats` time of sampling one batch with the trainer's engine, without and with
    the logit-lens values MEDS reads recorded in the decode loop (the same seeds, so the same
    responses); interleaved so that load hits both alike. `clock`: wall time, or
    time.process_time for this process's CPU time (steadier on a shared machine)."""
    import torch

    from meds_cli.engine.rollout.batch import sample_rollouts, sampling_settings

    cfg, model = trainer.cfg, trainer.unwrapped
    problems = [trainer.task.train[i] for i in range(cfg.rollout.prompts_per_step)]
    prompts = [trainer.task.prompt(p, trainer.tokenizer) for p in problems]
    model.eval()
    times = {False: [], True: []}
    for _ in range(repeats):
        for with_lens in (False, True):
            settings = sampling_settings(cfg.rollout, trainer.tokenizer, lens=trainer.lens_probe if with_lens else None)
            torch.manual_seed(0)
            t0 = clock()
            sample_rollouts(trainer.engine, trainer.tokenizer, prompts, problems, cfg.rollout.group_size, settings)
            times[with_lens].append(clock() - t0)
    return min(times[False]), min(times[True])


if __name__ == "__main__":
    main()
