"""`meds eval`: pick the model (a run's checkpoint or any --model), run the harness with a
progress bar, write results.json, samples.jsonl and the pass@k plot; or compare past evals."""

from __future__ import annotations

import re
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from benchmarks.generation import GenerationSettings
from meds_cli.engine.eval_backends import ModelSpec, make_backend, resolve_backend
from benchmarks.eval_report import PLOT_FILE, compare, plot_pass_at_k, score_table, write_results
from benchmarks.harness import EvalSettings, check_state, evaluate, load_benchmarks
from meds_cli.engine import runs
from meds_cli.core.errors import UserError


def model_for_run(run_dir: Path, step: int | None, dtype: str | None) -> ModelSpec:
    """The run's base model (config.yaml model.name) with its last or chosen checkpoint."""
    from meds_cli.engine.config import load_config

    run_dir = runs.resolve_run_dir(str(run_dir))
    cfg = load_config([str(run_dir / "config.yaml")])
    checkpoint = runs.find_checkpoint(run_dir, step)
    return ModelSpec(cfg.model.name, checkpoint, dtype or cfg.model.dtype, cfg.model.lora)


def default_output(run_dir: Path | None, spec: ModelSpec) -> Path:
    """RUN_DIR/eval/step_N for a run (one folder per checkpoint, so evals of two checkpoints
    never mix their samples); runs/eval-<time>-<model> for a model."""
    if run_dir is not None:
        return Path(run_dir) / "eval" / spec.checkpoint.name
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec.name).name or spec.name).strip("_")
    return Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{slug}"


class _Bar:
    """The harness's ProgressSink as a rich bar over samples (ETA from the samples drawn here)."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = None

    def start(self, total: int, done: int) -> None:
        self.task = self.progress.add_task("eval", total=total, completed=done, label="")

    def advance(self, samples: int, label: str) -> None:
        self.progress.update(self.task, advance=samples, label=label)


def results_document(spec: ModelSpec, settings: EvalSettings, outcome, backend: str) -> dict:
    config = asdict(settings)
    config["n"] = settings.samples
    return {
        "model": settings.model, "base_model": spec.name,
        "checkpoint": str(spec.checkpoint) if spec.checkpoint else None,
        "backend": backend, "commit": runs.git_commit(), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "config": config, "benchmarks": outcome.scores, "average": outcome.average, "timing": outcome.timing,
    }


def settings_from_options(benchmarks: str, *, data_dir: Path | None, **options) -> EvalSettings:
    """EvalSettings from the command line's options (benchmarks as a comma-separated list)."""
    names = [name.strip() for name in benchmarks.split(",") if name.strip()]
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir '{data_dir}' is not a folder; it must hold <benchmark>/test.jsonl files")
    settings = EvalSettings(names, data_dir=str(data_dir) if data_dir else None, **options)
    settings.validate()
    return settings


def run_eval(*, run_dir: Path | None, model: str | None, step: int | None, settings: EvalSettings,
             output: Path | None, dtype: str | None = None, quiet: bool = False,
             console: Console | None = None) -> dict:
    """Evaluate and write the outputs; returns the results document."""
    console = console or Console(stderr=True, soft_wrap=True)  # paths in messages stay copyable
    if (run_dir is None) == (model is None):
        raise UserError("give either a run folder (meds eval RUN_DIR) or --model, not both" if run_dir
                        else "nothing to evaluate: give a run folder (meds eval RUN_DIR) or --model NAME")
    if step is not None and run_dir is None:
        raise UserError("--step picks a checkpoint of a run; it needs a run folder, not --model")
    settings.validate()
    backend_name = resolve_backend(settings.backend)
    settings.backend = backend_name
    spec = model_for_run(run_dir, step, dtype) if run_dir is not None else ModelSpec(model, None, dtype)
    settings.model = spec.label
    # Fail on a wrong benchmark name or data dir before spending time on the model.
    t0 = time.perf_counter()
    suites = load_benchmarks(settings.benchmarks, Path(settings.data_dir) if settings.data_dir else None, settings.limit)
    load_s = time.perf_counter() - t0
    folder = Path(output) if output else default_output(run_dir, spec)
    generation = GenerationSettings(settings.temperature, settings.top_p, settings.max_new_tokens, settings.batch_size)
    check_state(folder, settings)  # refuse mismatched samples before the model takes its time to load
    with console.status(f"loading {spec.label} ({backend_name}) ..."):
        backend = make_backend(backend_name, spec, generation)
    console.print(f"eval of [bold]{spec.label}[/] on {', '.join(settings.benchmarks)}: n={settings.samples} "
                  f"k<={settings.k}  output: [bold]{folder}[/]")
    progress = Progress(TextColumn("[bold]eval"), TextColumn("{task.fields[label]}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("samples"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console, disable=quiet)
    try:
        with progress:
            outcome = evaluate(backend, settings, folder, _Bar(progress), suites)
    except KeyboardInterrupt:
        console.print(f"[yellow]stopped[/]; the samples drawn so far are in {folder / 'samples.jsonl'}: "
                      f"run the same command with --output {folder} to continue")
        raise
    outcome.timing["load_s"] += load_s
    outcome.timing["total_s"] += load_s
    document = results_document(spec, settings, outcome, backend_name)
    write_results(folder, document)
    plot_pass_at_k([(spec.label, document)], folder / PLOT_FILE)
    Console().print(score_table(document))
    console.print(f"results: {folder / 'results.json'}  samples: {outcome.samples_path}  plot: {folder / PLOT_FILE}")
    return document


def run_compare(targets: list[Path], output: Path | None) -> Path:
    return compare(targets, output, Console())
