"""`meds train`: resolve the config, set up the run folder, drive the Trainer with a progress bar."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from meds_cli.engine import runs
from meds_cli.engine.config import RunConfig, dump_yaml, load_config
from meds_cli.core.cpu_budget import configure_torch_threads
from meds_cli.core.errors import UserError

LIVE_KEYS = [("reward", "reward"), ("accuracy", "acc"), ("response_length_mean", "len"), ("entropy", "ent"),
             ("loss", "loss"), ("time_step_s", "s/step")]
SUMMARY_KEYS = ["reward", "accuracy", "eval/accuracy", "response_length_mean", "entropy",
                "distinct_wrong_answers_per_group", "zero_spread_group_share", "time_step_s"]


def prepare_run(config_files, overrides, shortcuts, resume: Path | None) -> tuple[RunConfig, Path, Path | None]:
    """(config, run folder, checkpoint to resume from)."""
    if resume is not None:
        run_dir = runs.resolve_run_dir(str(resume))
        cfg = load_config([str(run_dir / "config.yaml"), *map(str, config_files)], overrides,
                          {k: v for k, v in shortcuts.items() if k == "train.steps"})
        checkpoint = runs.find_checkpoint(run_dir)
        return cfg, run_dir, checkpoint
    cfg = load_config([str(f) for f in config_files], overrides, shortcuts)
    import algorithms

    algorithms.ALGORITHMS.get(cfg.algo.name)  # fail on a wrong name before creating anything
    from benchmarks import load_all
    from benchmarks.registry import TASKS

    load_all()
    TASKS.get(cfg.task.name)
    target = Path(cfg.train.output_dir) if cfg.train.output_dir else runs.new_run_dir(cfg.train.runs_root, cfg.algo.name, cfg.train.tag)
    return cfg, target, None


def run_training(config_files, overrides, shortcuts, *, resume=None, argv=(), quiet=False) -> int:
    cfg, run_dir, checkpoint = prepare_run(config_files, overrides, shortcuts, resume)
    from accelerate import Accelerator

    from meds_cli.engine.trainer import Trainer

    accelerator = Accelerator(mixed_precision=cfg.train.mixed_precision)
    configure_torch_threads()  # this process's share of the cores (accelerate launch starts several)
    main = accelerator.is_main_process
    console = Console(stderr=True, quiet=not main, soft_wrap=True)  # paths in messages stay copyable
    created = checkpoint is None and not run_dir.exists()
    if checkpoint is None and main:
        runs.claim_run_dir(run_dir)
    accelerator.wait_for_everyone()
    try:
        with console.status(f"loading {cfg.model.name} ..."):
            trainer = Trainer(cfg, run_dir, accelerator=accelerator)
    except UserError:
        if created and main and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()  # leave no empty run folder behind a run that never started
        raise
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
        console.print(f"resumed [bold]{run_dir}[/] at step {trainer.step}")
    elif main:
        runs.write_provenance(run_dir, list(argv))
    if main:
        # The folder is not part of the snapshot, so `--config config.yaml` repeats the run in a new folder.
        cfg.train.output_dir = ""
        dump_yaml(cfg, run_dir / "config.yaml", sections=trainer.algorithm.config_sections)
        cfg.train.output_dir = str(run_dir)
    console.print(f"run folder: [bold]{run_dir}[/]  algorithm: {cfg.algo.name}  model: {cfg.model.name}  task: {cfg.task.name}")
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
        console.print(f"[yellow]stopped[/] at step {trainer.step} ({where}); continue with: meds train --resume {run_dir}")
        return 130
    if main:
        print_summary(console, run_dir, runs.MetricsLog(run_dir / "metrics.jsonl").rows())
    return 0


def print_summary(console: Console, run_dir: Path, rows: list[dict]) -> None:
    if not rows:
        return
    first, last = rows[0], rows[-1]
    table = Table(title=f"{run_dir.name}: step {first['step']} -> {last['step']}", title_justify="left")
    table.add_column("metric")
    table.add_column("first", justify="right")
    table.add_column("last", justify="right")
    table.add_column("change", justify="right")
    for key in SUMMARY_KEYS:
        if key in first and key in last:
            delta = last[key] - first[key]
            table.add_row(key, f"{first[key]:.4g}", f"{last[key]:.4g}", f"{delta:+.4g}")
    console.print(table)
    console.print(f"metrics: {run_dir / 'metrics.jsonl'}   checkpoints: {run_dir / 'checkpoints'}")
