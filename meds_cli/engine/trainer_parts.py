"""What the training loop (engine/trainer.py) works with, built once and in order: the
accelerator and its collectives, the task and its prompt sampler, the algorithm, the user's
reward functions, the policy (model, adapter, optimizer, learning-rate schedule), the run
folder's metrics log and tracker, the rollout engine and the rollout source before it, the plan
of the scoring pass and the diversity probe.

The order matters: the global seed is set after the task and the algorithm are built and before
the model loads (a tiny model's LoRA weights come from it), and the engine is made after the
policy is prepared, so it samples from (or is sent) the very module the optimizer updates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.tasks import PromptSampler, build_task
from meds_cli.core.errors import UserError
from meds_cli.core.forward import decoder_layers
from meds_cli.core.markup import plain
from meds_cli.engine.model_io.model import apply_lora, load_model_and_tokenizer, reference_context
from meds_cli.engine.rollout.batch import sampling_settings
from meds_cli.engine.rollout.engines import make_engine
from meds_cli.engine.rollout.source import RolloutSource, SourcePlan
from meds_cli.engine.rollout.training_processes import TrainingProcesses
from meds_cli.engine.run_folders.run_dir import MetricsLog
from meds_cli.engine.run_folders.trackers import RunTracker, accelerator_kwargs
from meds_cli.engine.training.algorithm_setup import build_algorithm, optimizer_steps_per_batch
from meds_cli.engine.training.collectives import Collectives
from meds_cli.engine.training.diversity import DiversityMetrics, diversity_probe
from meds_cli.engine.training.importance import truncation_of_sampler
from meds_cli.engine.training.packing import Packing, attention_implementation, padding_free_line
from meds_cli.engine.training.precision import choose_mixed_precision, precision_line
from meds_cli.engine.training.scoring import has_active_dropout, scoring_pass, shares_prompts
from meds_cli.engine.training.seeding import seed_everything, step_seed
from meds_cli.engine.training.sharding import check_distributed_setup, make_accelerator
from meds_cli.engine.training.update import Policy, UpdateSettings, prepare_policy
from meds_cli.engine.training.user_rewards import load_reward_functions


def lr_lambda(warmup: int, total: int, schedule: str):
    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor


def say(acc, text: str) -> None:
    """A line for the user (rich markup; dynamic parts through core.markup.plain), from the main
    process only. soft_wrap: in a log (no terminal) rich would break the line at 80 columns,
    mid-path; a terminal wraps it itself."""
    if acc.is_main_process:
        from rich.console import Console

        Console(stderr=True).print(text, soft_wrap=True, highlight=False)


def precision_reason(setting: str, acc, given_accelerator) -> str:
    """Why the run computes in its precision (engine/training/precision.py); a caller's own
    Accelerator set it where its value differs from the config's choice."""
    value, why = choose_mixed_precision(setting)
    if given_accelerator is not None and value is not None and value != acc.mixed_precision:
        return "the Accelerator given to the trainer"
    return why


def check_batch_divides(cfg, world: int) -> None:
    if cfg.rollout.prompts_per_step % world:
        raise UserError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must divide evenly over "
                        f"{world} processes")
    if cfg.train.mini_batch_size and cfg.train.mini_batch_size % world:
        raise UserError(f"train.mini_batch_size={cfg.train.mini_batch_size} must divide evenly over "
                        f"{world} processes")


@dataclass
class TrainerParts:
    acc: object  # the Accelerator: devices, mixed precision, process group
    world: int  # number of processes
    rank: int  # this process's index
    collectives: Collectives
    task: object  # benchmarks/tasks.py: problems, prompts, grading
    algorithm: object  # algorithms/base.py: the hooks the loop calls
    reward_functions: list  # the user's reward channels (engine/training/user_rewards.py)
    tokenizer: object
    tracker: RunTracker
    policy: Policy  # model, optimizer, learning-rate schedule, FSDP2 units
    reference: object  # a context in which the policy is the reference (adapter off), or None
    share_prompts: bool  # forwards run each distinct prompt once
    update_settings: UpdateSettings
    metrics: MetricsLog  # the run folder's metrics.jsonl
    source: RolloutSource  # a step's rollouts: the prompt order, the seeds, the engine and what it samples ahead
    forward_needs: object  # what the algorithm reads besides the update's forward
    lens_probe: object  # the logit-lens values the engine records while sampling (the algorithm's or the
    # diversity probe), or None; the algorithm is handed them where its forward_needs.lens asked
    scoring: str | None  # when the no-grad scoring pass runs: "sampled", "trained" or None
    diversity: DiversityMetrics  # the diversity/ metrics every algorithm logs per step
    sampler_is_full_softmax: bool  # the mismatch metrics compare like with like only then
    precision: str  # the line saying which precision the run computes in and why
    layout: str  # the line saying whether forwards run padding-free, and how prompts are shared


def build_parts(cfg, run_dir: Path, accelerator=None, model_and_tokenizer=None) -> TrainerParts:
    acc = accelerator or make_accelerator(cfg.train, **accelerator_kwargs(cfg.train.report_to, run_dir))
    world, rank = acc.num_processes, acc.process_index
    check_distributed_setup(acc, cfg.train.sharding)
    check_batch_divides(cfg, world)
    task = build_task(cfg.task, cfg.train.seed)
    collectives = Collectives(acc)
    algorithm = build_algorithm(cfg, task, collectives.gather)  # outcome-ucb merges its counts with it
    reward_functions = load_reward_functions(cfg.reward.functions, cfg.reward.function_weights,
                                             cfg.reward.function_timeout_s)
    seed_everything(cfg.train.seed)
    model, tokenizer = model_and_tokenizer or load_model_and_tokenizer(cfg.model.name, cfg.model.dtype)
    skipped, total = task.drop_long_prompts(tokenizer, cfg.task.max_prompt_tokens)
    if skipped:
        say(acc, f"task.max_prompt_tokens={cfg.task.max_prompt_tokens}: left out {skipped} of {total} "
                 "training problems with longer prompts")
    sampler = PromptSampler(len(task.train), cfg.train.seed)
    tracker = RunTracker(acc)
    model = apply_lora(model, cfg.model.lora)
    packing = Packing.for_model(model, cfg.train.padding_free)  # micro-batches without padding
    policy = prepare_policy(acc, model, cfg.train, cfg.optim, lambda text: say(acc, text))
    share_prompts = shares_prompts(cfg.train, policy.sharded, packing)  # forwards run each prompt once
    update_settings = UpdateSettings.from_config(cfg, world, share_prompts, packing)
    # Not prepared: Accelerate's scheduler wrapper steps once per process, which would make
    # the schedule depend on the number of processes.
    optim = cfg.optim
    steps = cfg.train.steps * optimizer_steps_per_batch(cfg)
    policy.scheduler = torch.optim.lr_scheduler.LambdaLR(policy.optimizer,
                                                         lr_lambda(optim.warmup_steps, steps, optim.schedule))
    if acc.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    unwrapped = acc.unwrap_model(policy.model)
    # The reference policy is the same weights without the adapter (a KL term needs LoRA: said now).
    reference = reference_context(unwrapped) if algorithm.uses_reference else None
    # After prepare: the engine samples from (or is sent) the very module the optimizer updates.
    engine = make_engine(cfg, unwrapped, tokenizer,
                         scratch_dir=run_dir / "scratch",  # shared: process 0 writes there
                         processes=world, rank=rank, task=task, autocast=acc.mixed_precision,
                         training_processes=TrainingProcesses(rank, world, collectives.any, collectives.min))
    # What the algorithm reads besides the update's forward, asked once: the scoring pass is
    # planned from it, and lens values the engine records while sampling (MEDS's logit lens
    # with the hf engine) stand in for the pass where the algorithm asks for them.
    # With rollout.tools a response is sampled turn by turn and no turn records lens values
    # (tool_turns.turn_settings): MEDS then reads its features from the scoring pass, at the model's
    # final answer token placed after the observations (algorithms/meds_feature_builders.py), as for vLLM.
    records_lens = engine.records_lens and not cfg.rollout.enabled
    forward_needs = algorithm.forward_needs(len(decoder_layers(unwrapped)), records_lens)
    if forward_needs.lens is not None and not records_lens:
        raise RuntimeError(f"{cfg.algo.name} asked for logit-lens values from an engine that records none")
    # Every algorithm's diversity diagnostics (engine/training/diversity.py) read logit-lens values
    # the engine records while sampling: one probe, the algorithm's own where the layers match.
    probe, not_measured = diversity_probe(cfg.train.diversity_layers, len(decoder_layers(unwrapped)), records_lens,
                                          forward_needs.lens)
    if not_measured:
        say(acc, f"[yellow]note:[/] {plain(not_measured)}")
    lens_probe = forward_needs.lens or probe
    source = RolloutSource(engine, sampler, task, tokenizer, SourcePlan(
        seed_of_step=lambda step: step_seed(cfg.train.seed, step, rank),
        settings=sampling_settings(cfg.rollout, tokenizer, lens=lens_probe),
        prompts_per_step=cfg.rollout.prompts_per_step, group_size=cfg.rollout.group_size, steps=cfg.train.steps,
        rank=rank, world=world, any_process=collectives.any), say=lambda text: say(acc, text))
    scoring = scoring_pass(forward_needs.view, uses_reference=algorithm.uses_reference,
                           optimizer_steps_per_batch=optimizer_steps_per_batch(cfg),
                           setting=cfg.train.scoring_pass,
                           deterministic_update=not has_active_dropout(unwrapped))
    return TrainerParts(
        acc=acc, world=world, rank=rank, collectives=collectives, task=task, algorithm=algorithm,
        reward_functions=reward_functions, tokenizer=tokenizer, tracker=tracker, policy=policy,
        reference=reference,
        share_prompts=share_prompts, update_settings=update_settings, metrics=metrics, source=source,
        forward_needs=forward_needs, lens_probe=lens_probe, scoring=scoring,
        diversity=DiversityMetrics(tokenizer, probe, collectives.sum),
        sampler_is_full_softmax=truncation_of_sampler(cfg.rollout.top_p, cfg.rollout.min_new_tokens) is None,
        precision=precision_line(acc.mixed_precision, precision_reason(cfg.train.mixed_precision, acc, accelerator)),
        layout=padding_free_line(packing, cfg.train.padding_free, attention_implementation(unwrapped),
                                 cfg.train.share_prompts))
