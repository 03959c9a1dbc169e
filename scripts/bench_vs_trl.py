"""Seconds per step of `meds train --algo grpo` against TRL's GRPOTrainer on the same work.

Same model (the embedded SmolLM2-135M, fp32), LoRA rank 16 (alpha 32) on all linear layers, no
KL term, one optimizer step per generation, micro-batches of 8 sequences, no gradient
checkpointing (TRL's default turns it on), and response lengths forced on both sides
(min_new_tokens = max_new_tokens) so both decode exactly as many tokens.
Shapes: prompts x responses x new tokens, by default 2 x 4 at 32, 128 and 512 tokens and the
demo's 4 x 8 x 48. Shapes that differ only in length also print each system's growth: its step
time at each length over its step time at the shortest (work that grows faster than the tokens
shows as a growth above theirs).

Every process gets OMP_WAIT_POLICY=PASSIVE (meds's default; see meds_cli/core/cpu_budget.py)
unless the caller set a policy. Each round starts one fresh process per system and shape and
times its steps (the first step of a process, with its lazy initialisation, is left out); systems
alternate within a round, so a busy machine slows them alike. Printed: the median wall and CPU
seconds per step of each system and the ratio meds / TRL. `--baseline-tree DIR` adds a third system: meds from another
checkout (for before/after figures in one run). `--meds-variant NAME:key=value[,key=value]` (repeatable)
adds meds from this tree with those settings, as "meds NAME" (padded against packed in one run:
`--meds-variant padded:train.padding_free=false --meds-variant packed:train.padding_free=true`);
`--no-trl` leaves TRL out, and the ratio columns are then over the first system.

`--precision fp32,bf16` runs every system at each precision, as a user would ask for it: TRL
with bf16=False (fp32) and with its default bf16=True, meds with train.mixed_precision=no and
bf16 (on a CPU: bf16 autocast for the update and the scoring pass, decoding from bf16 weight
copies, float32 master weights). The ratio column is then over TRL's fastest precision at the
shape, and a last table puts each tool's fastest side by side. Without bf16 units (AVX2, or
AVX512 without AVX512-BF16/AMX) bf16 is emulated and slower on both sides.

Needs TRL: pip install -e '.[bench]'   (or pip install trl; it leaves torch alone)

    python scripts/bench_vs_trl.py [--rounds 3] [--steps 3] [--shapes 2x4x32,2x4x128,2x4x512,4x8x48]
                                   [--baseline-tree ../main] [--precision fp32,bf16]
                                   [--meds-variant NAME:key=value,...] [--no-trl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MICRO_BATCH = 8
PRECISIONS = ("fp32", "bf16")
PHASES = ("time_generate_s", "time_score_s", "time_train_s")  # meds's own step metrics, printed per phase


def parse_shape(text: str) -> tuple[int, int, int]:
    prompts, group, tokens = (int(x) for x in text.lower().split("x"))
    return prompts, group, tokens


# ---------------------------------------------------------------- workers (one process each)


def meds_prompts(prompts: int):
    """The first `prompts` arithmetic problems as meds renders them (chat template), and the tokenizer."""
    from benchmarks.tasks import build_task

    try:
        from meds_cli.engine.config import TaskConfig
        from meds_cli.engine.model_io.model import load_model_and_tokenizer
    except ImportError:  # the layout before meds_cli/engine
        from meds_cli.config import TaskConfig
        from meds_cli.model import load_model_and_tokenizer
    model, tokenizer = load_model_and_tokenizer("smollm2-135m")
    task = build_task(TaskConfig(name="arithmetic", prompt_style="chat"), 0)
    return [task.prompt(task.train[i], tokenizer) for i in range(prompts)], model, tokenizer


def run_trl(shape, steps: int, precision: str = "fp32") -> list[tuple[float, float]]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    prompts, group, tokens = shape
    texts, model, tokenizer = meds_prompts(prompts)
    batch = prompts * group
    dataset = Dataset.from_dict({"prompt": texts * (steps + 1)})
    times: list[tuple[float, float]] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = (time.perf_counter(), time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            times.append((time.perf_counter() - self.start[0], time.process_time() - self.start[1]))

    def reward(completions, **kwargs):  # cheap and spread within a group, so advantages are not zero
        return [float(sum(map(ord, c)) % 3) for c in completions]

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), use_cpu=True, bf16=precision == "bf16", fp16=False,
        seed=0,
        per_device_train_batch_size=min(MICRO_BATCH, batch), gradient_accumulation_steps=max(1, batch // MICRO_BATCH),
        num_generations=group, max_completion_length=tokens, temperature=1.0, top_p=1.0,
        generation_kwargs={"min_new_tokens": tokens}, beta=0.0, num_iterations=1, learning_rate=1e-5,
        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], dataloader_num_workers=0,
        shuffle_dataset=False, log_completions=False, disable_tqdm=True,
        gradient_checkpointing=False,  # TRL turns it on by default; meds does not recompute activations
    )
    peft_config = LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=peft_config, callbacks=[StepTimer()])
    trainer.train()
    return times


def run_meds(shape, steps: int, precision: str = "fp32", extra: tuple[str, ...] = ()) -> list[tuple[float, ...]]:
    try:
        from meds_cli.engine.config import RolloutConfig, load_config
        from meds_cli.engine.trainer import Trainer
    except ImportError:  # the layout before meds_cli/engine
        from meds_cli.config import RolloutConfig, load_config
        from meds_cli.trainer import Trainer
    import dataclasses

    prompts, group, tokens = shape
    overrides = [
        "algo.name=grpo", "model.name=smollm2-135m", "task.name=arithmetic", "task.prompt_style=chat",
        f"rollout.prompts_per_step={prompts}", f"rollout.group_size={group}", f"rollout.max_new_tokens={tokens}",
        "rollout.temperature=1.0", "rollout.top_p=1.0", "grpo.kl_coef=0", "model.lora.rank=16", "model.lora.alpha=32",
        f"train.micro_batch_size={MICRO_BATCH}", f"train.steps={steps}", "train.checkpoint_every=0",
        "optim.lr=1e-5", "optim.warmup_steps=0",
        f"train.mixed_precision={'bf16' if precision == 'bf16' else 'no'}",
    ]
    if "min_new_tokens" in {f.name for f in dataclasses.fields(RolloutConfig)}:
        overrides.append(f"rollout.min_new_tokens={tokens}")
    else:  # an older tree: no stop ids at all makes every response run to the limit
        _drop_stop_ids()
    cfg = load_config(overrides=[*overrides, *extra])
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench-meds-")))
    times = []
    for _ in range(steps):
        start = (time.perf_counter(), time.process_time())
        row = trainer.train_step()
        # wall and CPU, then the step's own phases (where a difference between variants comes from)
        times.append((time.perf_counter() - start[0], time.process_time() - start[1],
                      *(row.get(key, float("nan")) for key in PHASES)))
    return times


def _drop_stop_ids():
    """An older tree without rollout.min_new_tokens: no stop ids at all makes every response run to
    the limit. Trees name the function that lists them `_eos_ids` (the first layouts) or
    `stop_token_ids` (imported by name into the modules that build sampling settings), so every
    module that holds one gets the empty list."""
    patched = False
    for name in ("meds_cli.engine.rollout.sampling_engine", "meds_cli.engine.rollout.batch",
                 "meds_cli.engine.rollout.eval_backends", "meds_cli.engine.rollout", "meds_cli.rollout",
                 "meds_cli.engine.sampling_engine", "meds_cli.engine.rollout_batch", "meds_cli.sampling_engine"):
        try:
            module = __import__(name, fromlist=["_eos_ids"])
        except ImportError:
            continue
        for attr in ("_eos_ids", "stop_token_ids"):
            if callable(getattr(module, attr, None)):
                setattr(module, attr, lambda tokenizer: ())
                patched = True
    if not patched:
        raise SystemExit("cannot force response lengths in this tree")


# ---------------------------------------------------------------- the parent


def one_run(system: str, shape: str, steps: int, tree: Path, threads: int,
            precision: str = "fp32", extra: tuple[str, ...] = ()) -> list[tuple[float, ...]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    # Every system waits the way meds does by default (spinning threads on a shared machine would
    # slow whichever side loaded torch before meds_cli could ask for passive waiting).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--shape", shape, "--steps", str(steps),
           "--precision", precision, *(f"--set={item}" for item in extra)]
    result = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("STEP-TIMES ")]
    if result.returncode or not lines:
        raise SystemExit(f"{system} {shape} failed:\n{result.stderr[-3000:]}")
    return [tuple(t) for t in json.loads(lines[-1][len("STEP-TIMES "):])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="steps per process (the first is left out)")
    parser.add_argument("--shapes", default="2x4x32,2x4x128,2x4x512,4x8x48",
                        help="prompts x responses x new tokens, comma-separated")
    parser.add_argument("--baseline-tree", type=Path, help="another meds checkout, timed as 'meds-baseline'")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads in every process (0: each decides); 1 gives steadier CPU times when busy")
    parser.add_argument("--precision", default="fp32",
                        help="comma-separated, of fp32 and bf16: TRL bf16=False / True, meds mixed_precision no / bf16")
    parser.add_argument("--meds-variant", action="append", default=[],
                        help="NAME:key=value[,key=value]: meds from this tree with these settings, as 'meds NAME'")
    parser.add_argument("--no-trl", action="store_true", help="leave TRL out (ratios over the first system)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args()

    precisions = args.precision.split(",")
    if any(p not in PRECISIONS for p in precisions):
        raise SystemExit(f"--precision {args.precision}: accepted values are {', '.join(PRECISIONS)}, comma-separated")
    if args.worker:
        shape = parse_shape(args.shape)
        times = run_trl(shape, args.steps, precisions[0]) if args.worker == "trl" else run_meds(
            shape, args.steps, precisions[0], tuple(args.extra))
        print("STEP-TIMES " + json.dumps(times), flush=True)
        return

    tools = {} if args.no_trl else {"trl": (ROOT, ())}
    if args.meds_variant:
        for variant in args.meds_variant:
            name, _, settings = variant.partition(":")
            tools[f"meds {name}"] = (ROOT, tuple(item for item in settings.split(",") if item))
    else:
        tools["meds"] = (ROOT, ())
    if args.baseline_tree:
        tools["meds-baseline"] = (args.baseline_tree.resolve(), ())
    # system name -> (tool, tree, precision, extra settings); one precision keeps the tools' plain names
    systems = {(tool if len(precisions) == 1 else f"{tool} {p}"): (tool, tree, p, extra)
               for p in precisions for tool, (tree, extra) in tools.items()}
    shapes = args.shapes.split(",")
    per_step = {(s, shape): [] for s in systems for shape in shapes}
    for round_ in range(args.rounds):
        for shape in shapes:
            for system, (tool, tree, precision, extra) in systems.items():
                worker = "trl" if tool == "trl" else "meds"
                times = one_run(worker, shape, args.steps, tree, args.threads, precision, extra)[1:]
                per_step[(system, shape)].extend(times)
                print(f"round {round_ + 1} {shape:>8} {system:>13}: " +
                      ", ".join(f"{t[0]:.1f} s ({t[1]:.1f} CPU)" for t in times), flush=True)

    print(f"\nmedian seconds per step ({args.rounds} rounds x {args.steps - 1} timed steps; "
          f"{args.threads or 'default'} threads; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    over = "TRL" if "trl" in tools else "1st"
    print(f"{'shape':>8} {'system':>13} {'wall s':>8} {'CPU s':>8} {f'wall / {over}':>11} {f'CPU / {over}':>10}")
    wall_of = {key: statistics.median(t[0] for t in times) for key, times in per_step.items()}
    cpu_of = {key: statistics.median(t[1] for t in times) for key, times in per_step.items()}
    for shape in shapes:
        trl = [s for s, (tool, _, _, _) in systems.items() if tool == "trl"] or [next(iter(systems))]
        trl_wall, trl_cpu = min(wall_of[(s, shape)] for s in trl), min(cpu_of[(s, shape)] for s in trl)
        for system in systems:
            wall, cpu = wall_of[(system, shape)], cpu_of[(system, shape)]
            print(f"{shape:>8} {system:>13} {wall:>8.2f} {cpu:>8.2f} {wall / trl_wall:>11.2f} {cpu / trl_cpu:>10.2f}")
    print_phases(per_step, systems, shapes)
    if len(precisions) > 1 and "trl" in tools:
        print_fastest(wall_of, systems, tools, shapes)
    for clock, column in (("wall", 0), ("CPU", 1)):  # CPU: steadier where the load changes during the run
        medians = {key: statistics.median(t[column] for t in times) for key, times in per_step.items()}
        print_growth(medians, systems, shapes, clock)


def print_phases(per_step: dict, systems: dict, shapes: list[str]) -> None:
    """meds's median seconds per phase of a step (generate, scoring pass, update) for each meds system."""
    meds = [s for s, (tool, _, _, _) in systems.items() if tool != "trl"]
    print("\nmeds's phases (median s a step): " + ", ".join(p.removeprefix("time_").removesuffix("_s") for p in PHASES))
    for shape in shapes:
        for system in meds:
            steps = [t for t in per_step[(system, shape)] if len(t) > 2]
            if steps:
                cells = " ".join(f"{statistics.median(t[2 + i] for t in steps):>8.2f}" for i in range(len(PHASES)))
                print(f"{shape:>8} {system:>13} {cells}")


def print_fastest(wall_of: dict, systems: dict, tools: dict, shapes: list[str]) -> None:
    """Each tool's fastest precision at each shape (median wall seconds), and its ratio over TRL's
    fastest: the comparison a user makes, each tool run as well as it runs here."""
    print("\nfastest precision of each tool (median wall s a step), and over TRL's fastest")
    print(f"{'shape':>8} " + " ".join(f"{tool:>22}" for tool in tools) + f" {'ratio':>22}")
    for shape in shapes:
        best = {}
        for tool in tools:
            wall, system = min((wall_of[(s, shape)], s) for s, (t, _, _, _) in systems.items() if t == tool)
            best[tool] = (wall, systems[system][2])
        cells = " ".join(f"{f'{w:.2f} ({p})':>22}" for w, p in best.values())
        ratios = ", ".join(f"{tool} {best[tool][0] / best['trl'][0]:.2f}" for tool in tools if tool != "trl")
        print(f"{shape:>8} {cells} {ratios:>22}")


def print_growth(medians: dict, systems, shapes: list[str], clock: str) -> None:
    """Each system's median `clock` step time at every length of a prompts x responses pair, over
    its time at that pair's shortest length, beside the growth of the tokens themselves."""
    pairs: dict[tuple[int, int], list[str]] = {}
    for shape in shapes:
        prompts, group, _ = parse_shape(shape)
        pairs.setdefault((prompts, group), []).append(shape)
    for (prompts, group), members in pairs.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda shape: parse_shape(shape)[2])
        shortest = members[0]
        print(f"\ngrowth of the {clock} step time with length at {prompts} x {group} (over {shortest})")
        print(f"{'shape':>8} {'tokens':>7} " + " ".join(f"{system:>13}" for system in systems))
        for shape in members:
            tokens = parse_shape(shape)[2] / parse_shape(shortest)[2]
            print(f"{shape:>8} {tokens:>6.1f}x " +
                  " ".join(f"{medians[(system, shape)] / medians[(system, shortest)]:>12.2f}x" for system in systems))


if __name__ == "__main__":
    main()
