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
from meds_cli.engine.rollout.engines import make_backend, resolve_backend
from meds_cli.engine.rollout.eval_backends import ModelSpec
from benchmarks.eval_report import PLOT_FILE, compare, plot_pass_at_k, score_table, write_results
from benchmarks.harness import SHORT_RESPONSE_TOKENS, EvalSettings, check_state, evaluate, load_benchmarks
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.config import load_config
from meds_cli.engine.model_io.model import check_dtype, has_chat_template, precheck_model
from meds_cli.core.errors import UserError


def model_for_run(run_dir: Path, step: int | None, dtype: str | None, say=lambda text: None) -> ModelSpec:
    """The run's base model (config.yaml model.name) with its newest complete or chosen checkpoint."""
    run_dir = runs.resolve_run_dir(str(run_dir))
    cfg = load_config([str(run_dir / "config.yaml")])
    checkpoint = runs.find_checkpoint(run_dir, step, say=say)
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


def choose_prompt(requested: str, run_style: str | None, has_chat_template: bool) -> tuple[str, str]:
    """(prompt style, why): an explicit --prompt wins; a run is evaluated with the style it was
    trained with; a bare model gets its chat template when it has one (an instruct model given
    the plain boxed prompt tends to answer with an empty response)."""
    if requested != "auto":
        return requested, "--prompt"
    if run_style is not None:
        return run_style, "the run's task.prompt_style"
    return ("chat", "the model has a chat template") if has_chat_template else ("boxed", "the model has no chat template")


def prompt_warning(document: dict, share: float = 0.5) -> str | None:
    """A line when most responses of a benchmark are one or two tokens long: the model is
    answering a prompt it does not understand, not the problems."""
    short = {name: scores.get("short_response_share", 0.0) for name, scores in document["benchmarks"].items()}
    hit = {name: value for name, value in short.items() if value > share}
    if not hit:
        return None
    prompt = document["config"].get("prompt")
    other = "chat" if prompt == "boxed" else "boxed"
    where = ", ".join(f"{name} {100 * value:.0f}%" for name, value in hit.items())
    return (f"most responses are at most {SHORT_RESPONSE_TOKENS} tokens long ({where}): the prompt is probably wrong "
            f"for this model (it was given the {prompt} prompt; try --prompt {other})")


def run_eval(*, run_dir: Path | None, model: str | None, step: int | None, settings: EvalSettings,
             output: Path | None, dtype: str | None = None, quiet: bool = False,
             console: Console | None = None) -> dict:
    """Evaluate and write the outputs; returns the results document."""
    console = console or Console(stderr=True, soft_wrap=True)  # paths in messages stay copyable
    if run_dir is not None and model is not None:
        raise UserError("give either a run folder (meds eval RUN_DIR) or --model, not both")
    if run_dir is None and model is None:
        try:
            run_dir = runs.newest_run("runs")
        except UserError:
            raise UserError("nothing to evaluate: no run folder under 'runs'; give a run folder (meds eval RUN_DIR) "
                            "or --model NAME") from None
        console.print(f"no run folder or --model given: evaluating the newest run, [bold]{run_dir}[/]")
    if step is not None and run_dir is None:
        raise UserError("--step picks a checkpoint of a run; it needs a run folder, not --model")
    settings.validate()
    check_dtype(dtype, "--dtype")
    backend_name = resolve_backend(settings.backend)
    settings.backend = backend_name

    def note(text: str) -> None:
        console.print(f"[yellow]note:[/] {text}")

    spec = model_for_run(run_dir, step, dtype, note) if run_dir is not None else ModelSpec(model, None, dtype)
    precheck_model(spec.name)  # a bad --model fails here, before an output folder is made
    settings.model = spec.label
    task = load_config([str(Path(run_dir) / "config.yaml")]).task if run_dir is not None else None
    settings.prompt, why = choose_prompt(settings.prompt, task.prompt_style if task else None,
                                         task is None and settings.prompt == "auto" and has_chat_template(model))
    if task is not None:  # the run's own prompt: its system prompt and template arguments too
        settings.system_prompt, settings.chat_template_kwargs = task.system_prompt, dict(task.chat_template_kwargs)
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
                  f"k<={settings.k}  prompt: {settings.prompt} ({why})  output: [bold]{folder}[/]")
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
    warning = prompt_warning(document)
    if warning:
        document["warnings"] = [warning]
    write_results(folder, document)
    plot_pass_at_k([(spec.label, document)], folder / PLOT_FILE)
    Console().print(score_table(document))
    if warning:
        console.print(f"[yellow]warning:[/] {warning}")
    console.print(f"results: {folder / 'results.json'}  samples: {outcome.samples_path}  plot: {folder / PLOT_FILE}")
    return document


def run_compare(targets: list[Path], output: Path | None) -> Path:
    return compare(targets, output, Console())
