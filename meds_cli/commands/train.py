"""`meds train`: resolve the config, claim and lock the run folder, drive the Trainer with a progress bar.

Faults end in one line, with nothing half-written left behind: a folder another process trains
in (the run lock), an --output that cannot hold a run, a full disk or a read-only folder, a
resume that would change what its checkpoint depends on. A resume continues from the newest
complete checkpoint (or --step N), starts a run that never reached a checkpoint over from
step 0, and logs what settings it changed (meds_cli/engine/run_folders/resume.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from meds_cli.core.cpu_budget import configure_torch_threads
from meds_cli.core.errors import UserError, storage_error
from meds_cli.core.library_warnings import route_library_warnings
from meds_cli.core.markup import plain
from meds_cli.engine.config import RolloutConfig, RunConfig, dump_yaml, load_config, parse_override, read_yaml
from meds_cli.engine.model_io.model import (
    EMBEDDED,
    TESTBED,
    TINY,
    canonical_model_name,
    check_lora_rank,
    hub_lookup_note,
    precheck_model,
)
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.run_folders.checkpoint_store import find_usable_checkpoint
from meds_cli.engine.run_folders.resume import config_changes, describe_changes, record_resume, refuse_fixed_changes
from meds_cli.engine.run_folders.run_lock import RunLock

LIVE_KEYS = [("reward", "reward"), ("accuracy", "acc"), ("response_length_mean", "len"), ("entropy", "ent"),
             ("loss", "loss"), ("time_step_s", "s/step")]
SUMMARY_KEYS = ["reward", "accuracy", "eval/accuracy", "response_length_mean", "entropy",
                "distinct_wrong_answers_per_group", "zero_spread_group_share", "time_step_s"]


@dataclass
class RunPlan:
    cfg: RunConfig
    run_dir: Path
    resuming: bool
    changes: dict = field(default_factory=dict)  # {key: (run's value, new value)} of a resume


def prepare_run(config_files, overrides, shortcuts, resume: Path | None, step: int | None = None) -> RunPlan:
    """The config and run folder, checked before any model loads or folder is made."""
    if resume is not None:
        if shortcuts.get("train.output_dir"):
            raise UserError("--output names a new run folder; a resumed run stays in its own folder (drop --output)")
        run_dir = runs.resolve_run_dir(str(resume))
        saved = str(run_dir / "config.yaml")
        before = load_config([saved])
        cfg = load_config([saved, *map(str, config_files)], overrides, shortcuts)
        changes = config_changes(before, cfg)
        refuse_fixed_changes(changes, before)
        return RunPlan(cfg, run_dir, True, changes)
    if step is not None:
        raise UserError("--step picks the checkpoint a resumed run continues from; it needs --resume RUN")
    cfg = load_config([str(f) for f in config_files], overrides, shortcuts)
    if cfg.train.steps == 0:  # 0 is the config's value for an untrained arm (meds ablate --base-model), not a run
        raise UserError("train.steps must be at least 1 to train, got 0; the base model itself is evaluated by "
                        "`meds eval --model NAME` or as an arm of `meds ablate --base-model`")
    from benchmarks import load_all
    from benchmarks.registry import TASKS

    load_all()
    TASKS.get(cfg.task.name)  # fail on a wrong name before creating anything
    if cfg.train.output_dir:
        target = Path(cfg.train.output_dir)
    else:
        target = runs.new_run_dir(cfg.train.runs_root, cfg.algo.name, cfg.train.tag)
    runs.check_output_path(target)
    return RunPlan(cfg, target, False)


def task_was_chosen(config_files, overrides, shortcuts) -> bool:
    """Whether a config file (or one it extends), a --set or --task names the task: otherwise
    task.name is the default, the embedded demo's toy task."""
    if (shortcuts or {}).get("task.name"):
        return True
    layers = [read_yaml(f) for f in config_files] + [parse_override(text) for text in overrides]
    return any(isinstance(layer.get("task"), dict) and "name" in layer["task"] for layer in layers)


def refuse_real_model_on_default_task(cfg: RunConfig, chosen: bool) -> None:
    """A real model with no task chosen would train on the demo's toy task at the demo's settings,
    which is never what `--model Qwen2.5-Math-1.5B` means: ask for the data instead of guessing
    (the math task has no default dataset to fall back on, and the paper's settings are a config)."""
    if chosen or cfg.model.name in (EMBEDDED, TINY):
        return
    raise UserError(f"--model {cfg.model.name} with no task chosen would train on the embedded demo's toy task "
                    f"('{cfg.task.name}', synthetic arithmetic); choose the data: -c configs/meds_paper.yaml (the "
                    "paper's math setting) or --task (math with --set task.path=..., or arithmetic, copy; "
                    "see `meds list`)")


DEMO_TASKS = ("arithmetic", "copy")  # the toy tasks the embedded demo's sampling settings are sized for
DEMO_SAMPLING = ("prompts_per_step", "group_size", "max_new_tokens")


def demo_sampling_warning(cfg: RunConfig) -> str | None:
    """A real model on a real task with the embedded demo's sampling settings (RolloutConfig's
    defaults, sized for a 135M model on toy arithmetic on a CPU): 64 new tokens cut nearly every
    MATH solution short. The warning names the settings and the config that fits; no guessing of
    other values (task-aware defaults would make one --set mean different things per task)."""
    if cfg.model.name in (EMBEDDED, TINY) or cfg.task.name in DEMO_TASKS:
        return None
    demo = RolloutConfig()
    if any(getattr(cfg.rollout, key) != getattr(demo, key) for key in DEMO_SAMPLING):
        return None
    settings = ", ".join(f"rollout.{key}={getattr(demo, key)}" for key in DEMO_SAMPLING)
    return (f"{cfg.model.name} on task '{cfg.task.name}' with the embedded demo's sampling settings ({settings}, "
            f"sized for the toy tasks on a CPU); for the paper's math setting use -c configs/meds_paper.yaml "
            f"(512 prompts x 16 responses, up to 3072 tokens), or set these three with --set")


def task_description(cfg: RunConfig) -> str:
    """The task's one-line description, with the data it reads where it reads a file or dataset, or
    the generator and its settings (reasoning-gym)."""
    from benchmarks import load_all
    from benchmarks.registry import TASKS

    load_all()
    entry = next(e for e in TASKS.entries() if e.name == cfg.task.name)
    generator = f"; generator: {cfg.task.dataset} {cfg.task.config or ''}".rstrip() if cfg.task.dataset else ""
    return entry.description + (f"; data: {cfg.task.path}" if cfg.task.path else "") + generator


def model_size(name: str) -> str:
    """What can be said of a model's size without loading it: its files on disk, or the size in
    its name (Qwen2.5-Math-1.5B) for a hub id, which a dry run does not download."""
    import re

    from meds_cli.engine.model_io.model import embedded_gguf, resolve_model

    if name == TINY:
        return "the tiny test model (a few thousand parameters)"
    if name == TESTBED:  # a dry run builds nothing: where the base is, or will be
        from meds_cli.engine.model_io.cache import is_complete
        from meds_cli.engine.model_io.testbed_base import TESTBED_RECIPE

        folder = TESTBED_RECIPE.folder()
        return (f"the testbed base, cached in {folder}" if is_complete(folder)
                else f"the testbed base, not built yet: the run builds it into {folder} (minutes)")
    path = Path(name).expanduser()
    if name == EMBEDDED:
        path = embedded_gguf()
    if path.is_file() or path.is_dir():
        weights = (".safetensors", ".bin", ".gguf")
        files = [path] if path.is_file() else [f for f in path.iterdir() if f.suffix in weights]
        return f"{sum(f.stat().st_size for f in files) / 1e9:.2f} GB of weights in {path}"
    hub_id = resolve_model(name)
    stated = re.search(r"(\d+(?:\.\d+)?)\s*([BM])(?![A-Za-z])", hub_id)
    if stated:
        return f"about {stated.group(1)}{stated.group(2)} parameters (from its name {hub_id}; not downloaded)"
    return f"unknown until {hub_id} is downloaded"


def sampling_lines(cfg: RunConfig, rounds: int) -> list[str]:
    """The sampling shape and the tokens a step generates at most."""
    rollout = cfg.rollout
    responses = rollout.prompts_per_step * rollout.group_size
    tokens = responses * rollout.max_new_tokens
    lines = [f"sampling: {rollout.prompts_per_step} prompts x {rollout.group_size} responses = {responses} responses "
             f"a step, up to {rollout.max_new_tokens} new tokens each"]
    most = f"up to {tokens:,} generated tokens a step"
    if rounds > 1:
        most += f" ({tokens * rounds:,} if all {rounds} sampling rounds of dynamic sampling run)"
    return lines + [f"tokens: {most}, plus the prompts; the update reads them all again"]


def check_before_loading(plan: RunPlan, config_files, overrides, shortcuts) -> list[str]:
    """What can be checked of the model without its weights, before the run folder is touched
    (a dry run, a run here, a run submitted to Slurm): the model's name (a near miss refused, an
    alias in another case taken), the LoRA rank against the model's width, and a real model on
    the default task of a new run. Returns the lines to say about it ("note: ...", "warning: ...")."""
    cfg = plan.cfg
    cfg.model.name, said = canonical_model_name(cfg.model.name)
    check_lora_rank(cfg.model.lora, precheck_model(cfg.model.name), cfg.model.name)
    if not plan.resuming:
        refuse_real_model_on_default_task(cfg, task_was_chosen(config_files, overrides, shortcuts))
    warning = None if plan.resuming else demo_sampling_warning(cfg)
    return [f"note: {said}"] * bool(said) + [f"warning: {warning}"] * bool(warning)


def dry_run(config_files, overrides, shortcuts, *, resume=None, step=None, console: Console) -> dict:
    """What `meds train` would do, with nothing loaded but the config and nothing created: the
    resolved config (stdout), the run folder, the model's size, the sampling shape, tokens a step."""
    import yaml

    from meds_cli.engine.config import to_dict
    from meds_cli.engine.training.algorithm_setup import build_algorithm

    plan = prepare_run(config_files, overrides, shortcuts, resume, step)
    cfg = plan.cfg
    notes = check_before_loading(plan, config_files, overrides, shortcuts)
    algorithm = build_algorithm(cfg)  # checks the algorithm's settings; builds no model
    Console(soft_wrap=True).print(yaml.safe_dump(to_dict(cfg, algorithm.config_sections), sort_keys=False),
                                  markup=False, highlight=False)
    where = f"continues {plan.run_dir}" if plan.resuming else f"would create {plan.run_dir}"
    notes += [f"note: {line}" for line in [hub_lookup_note(cfg.model.name)] if line]
    lines = [*notes,
             f"run folder: {where}",
             f"model: {cfg.model.name}, {model_size(cfg.model.name)}",
             f"algorithm: {cfg.algo.name}; task: {cfg.task.name} ({task_description(cfg)}); steps: {cfg.train.steps}",
             *sampling_lines(cfg, algorithm.generation_rounds()),
             "dry run: nothing was loaded or created; drop --dry-run to train"]
    for line in lines:
        console.print(line, markup=False, highlight=False)
    return {"run_dir": str(plan.run_dir), "lines": lines}


def run_training(config_files, overrides, shortcuts, *, resume=None, step=None, argv=(), quiet=False,
                 prepared: tuple[str, ...] = ()) -> int:
    """Train; `prepared`: file patterns a launcher put in the new run folder before the run (they
    do not make it a used folder)."""
    route_library_warnings()  # library warnings go to the run folder's log (_train names it), not the terminal
    plan = prepare_run(config_files, overrides, shortcuts, resume, step)
    notes = check_before_loading(plan, config_files, overrides, shortcuts)
    from meds_cli.engine.run_folders.trackers import accelerator_kwargs
    from meds_cli.engine.training.sharding import close_process_group, make_accelerator

    # this process's share of the cores (accelerate launch starts several), set first: the CPU
    # calibration that may choose the precision times at the thread count the run computes with
    configure_torch_threads()
    accelerator = make_accelerator(plan.cfg.train, **accelerator_kwargs(plan.cfg.train.report_to, plan.run_dir))
    main = accelerator.is_main_process
    console = Console(stderr=True, quiet=not main, soft_wrap=True)  # paths in messages stay copyable
    for note in notes:
        console.print(note, markup=False, highlight=False)
    run_dir = plan.run_dir
    created = not run_dir.exists()
    lock = RunLock(run_dir)  # held by the main process for the whole run
    try:
        if main and plan.resuming:
            lock.acquire()
        elif main:
            runs.claim_run_dir(run_dir, lock, prepared)
        accelerator.wait_for_everyone()
        code = _train(plan, step, accelerator, console, argv, quiet)
        close_process_group(accelerator)
        return code
    except Exception as error:
        if (failed := storage_error(error)) is not None:  # a full disk or a read-only folder mid-run
            raise runs.interrupted_run_error(failed, run_dir) from None
        raise
    finally:
        lock.release()
        if created and main and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # leave no empty run folder behind a run that never started


def _train(plan: RunPlan, step: int | None, accelerator, console: Console, argv, quiet: bool) -> int:
    from meds_cli.engine.trainer import Trainer

    cfg, run_dir, main = plan.cfg, plan.run_dir, accelerator.is_main_process
    checkpoint = None
    if plan.resuming:
        checkpoint = find_usable_checkpoint(run_dir, step,
                                            say=lambda text: console.print(f"[yellow]note:[/] {plain(text)}"))
    # What was chosen shows while the model loads (a status line, so that an error in loading stays one line);
    # the run folder line after loading repeats it.
    with console.status(f"loading {plain(cfg.model.name)} to train with {plain(cfg.algo.name)} on task "
                        f"'{plain(cfg.task.name)}' ({plain(task_description(cfg))}) ..."):
        trainer = Trainer(cfg, run_dir, accelerator=accelerator)
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
        console.print(f"resumed [bold]{plain(run_dir)}[/] at step {trainer.step}")
    elif plan.resuming:
        # Killed before its first checkpoint: nothing to restore, so the run starts over.
        if main:
            trainer.metrics.truncate_after(0)
        console.print(f"{plain(run_dir)} has no checkpoint yet: starting it over from step 0")
    if plan.resuming and main:
        if plan.changes:
            console.print(f"changed settings, applied from step {trainer.step}: "
                          f"{plain(describe_changes(plan.changes))}")
        record_resume(run_dir, trainer.step, checkpoint, plan.changes)
    if main:
        # The folder is not part of the snapshot, so `--config config.yaml` repeats the run in a new folder.
        # Written first: a folder with config.yaml can be resumed, whatever else a kill left out.
        cfg.train.output_dir = ""
        dump_yaml(cfg, run_dir / "config.yaml", sections=trainer.algorithm.config_sections)
        cfg.train.output_dir = str(run_dir)
        if not plan.resuming:
            runs.write_provenance(run_dir, list(argv))
    route_library_warnings().log_to(run_dir)  # the run has started: its folder keeps them
    console.print(f"run folder: [bold]{plain(run_dir)}[/]  algorithm: {plain(cfg.algo.name)}  "
                  f"model: {plain(cfg.model.name)}  task: {plain(cfg.task.name)}  {plain(engine_text(cfg))}",
                  soft_wrap=True)
    if trainer.step >= cfg.train.steps:
        console.print(f"the run is already at step {trainer.step} of {cfg.train.steps}; pass --steps N to go further")
        return 0
    progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), TextColumn("{task.fields[live]}"), console=console,
                        disable=quiet or not main, transient=False)
    rows: list[dict] = []
    try:
        with progress:
            bar = progress.add_task("train", total=cfg.train.steps, completed=trainer.step, live="sampling ...")

            def on_step(row):
                rows.append(row)
                live = "  ".join(f"{label} {row[k]:.3g}" for k, label in LIVE_KEYS if k in row)
                progress.update(bar, completed=row["step"], live=live)

            trainer.train(on_step=on_step)
    except KeyboardInterrupt:
        steps = runs.list_checkpoints(run_dir)
        where = f"checkpoint at step {steps[-1]}" if steps else "no checkpoint yet"
        console.print(f"[yellow]stopped[/] at step {trainer.step} ({plain(where)}); "
                      f"continue with: meds train --resume {plain(run_dir)}")
        return 130
    if main:
        print_summary(console, run_dir, runs.metrics_rows(run_dir), engine_text(cfg))
    return 0


def engine_text(cfg: RunConfig) -> str:
    """'engine: hf', or with an engine that runs apart from the trainer its staleness too
    ('engine: hf-worker, staleness k=1'): what the samples of the run came from."""
    engine = cfg.rollout.engine
    return f"engine: {engine}" + (f", staleness k={cfg.rollout.max_staleness}" if engine != "hf" else "")


def print_summary(console: Console, run_dir: Path, rows: list[dict], setup: str = "") -> None:
    if not rows:
        return
    first, last = rows[0], rows[-1]
    # the heading on a line of its own: as a table title rich would wrap it to the table's width
    console.print(f"{run_dir.name}: step {first['step']} -> {last['step']}" + (f" ({setup})" if setup else ""),
                  markup=False, highlight=False, soft_wrap=True)
    table = Table()
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column("last", justify="right")
    table.add_column("change", justify="right")
    for key in SUMMARY_KEYS:
        if key in first and key in last:
            delta = last[key] - first[key]
            table.add_row(key, f"{first[key]:.4g}", f"{last[key]:.4g}", f"{delta:+.4g}")
    console.print(table)
    console.print(f"metrics: {plain(run_dir / 'metrics.jsonl')}   checkpoints: {plain(run_dir / 'checkpoints')}")
