"""`meds eval`: pick the model (a run's checkpoint or any --model), run the harness with a
progress bar, write results.json, samples.jsonl and the pass@k plot; or compare past evals."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from benchmarks.eval_report import (
    PLOT_FILE,
    compare,
    plot_pass_at_k,
    score_table,
    truncation_line,
    truncation_warning,
    write_results,
)
from benchmarks.generation import GenerationSettings
from benchmarks.harness import SHORT_RESPONSE_TOKENS, EvalSettings, check_state, evaluate, load_benchmarks
from meds_cli.core.errors import UserError
from meds_cli.core.library_warnings import route_library_warnings
from meds_cli.core.markup import plain
from meds_cli.core.report_console import print_table
from meds_cli.engine.config import load_config
from meds_cli.engine.model_io.model import canonical_model_name, check_dtype, has_chat_template, precheck_model
from meds_cli.engine.rollout.engines import make_backend, resolve_backend
from meds_cli.engine.rollout.eval_backends import ModelSpec
from meds_cli.engine.rollout.tools.settings import TOOLS, ToolSettings, tool_settings_of
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.run_folders.run_lock import FolderLock

# What a run is evaluated on by default, by its task (any other task: its held-out split).
RUN_BENCHMARKS = {"math": "math500"}
MODEL_DEFAULT_BENCHMARK = "math500"
MODEL_MAX_NEW_TOKENS = 4096  # the harness's default: what real models' reasoning needs
HELDOUT = "heldout"  # --benchmarks heldout: the run's task's held-out split
# The least response length a run's held-out eval gets, by task; else the run's rollout.max_new_tokens.
# The arithmetic task's reference answer is one boxed integer, but the chat models it trains explain
# first: after the demo (`make train`: configs/meds_smollm2.yaml, SmolLM2-135M, 5 steps) the model's
# answers to the 20 held-out problems, 8 samples each under a 512-token limit, were 100 tokens long on
# average (median 80, 90th percentile 185, 95th 243). Its training limit, 48, cut 74% of them (the
# demo eval at --k 128 measured 72.9%); 192 would cut 9.4%, 256 cuts 3.8%. The training limit is a
# CPU budget for rollouts, not a property of the task.
HELDOUT_MIN_NEW_TOKENS = {"arithmetic": 256}


def heldout_max_new_tokens(task_name: str | None, run_max_new_tokens: int) -> int:
    """The response limit of a run's held-out eval: its rollout.max_new_tokens, or its task's
    HELDOUT_MIN_NEW_TOKENS where that is longer (`meds eval RUN` and `meds ablate` alike)."""
    return max(run_max_new_tokens, HELDOUT_MIN_NEW_TOKENS.get(task_name, 0))


def model_for_run(run_dir: Path, step: int | None, dtype: str | None, say=lambda text: None) -> ModelSpec:
    """The run's base model (config.yaml model.name) with its newest complete or chosen checkpoint;
    a run of train.steps 0 (`meds ablate`'s base-model arm) is the base model alone."""
    run_dir = runs.resolve_run_dir(str(run_dir))
    cfg = load_config([str(run_dir / "config.yaml")])
    if cfg.train.steps == 0 and step in (None, 0):  # a run of 0 steps is its base model: nothing to load on top
        return ModelSpec(cfg.model.name, None, dtype or cfg.model.dtype)
    checkpoint = runs.find_checkpoint(run_dir, step, say=say)
    return ModelSpec(cfg.model.name, checkpoint, dtype or cfg.model.dtype, cfg.model.lora)


def default_output(run_dir: Path | None, spec: ModelSpec) -> Path:
    """RUN_DIR/eval/step_N for a run (one folder per checkpoint, so evals of two checkpoints
    never mix their samples); runs/eval-<time>-<model> for a model."""
    if run_dir is not None:  # a run of 0 steps (its base model, model_for_run) is at step 0
        return Path(run_dir) / "eval" / (spec.checkpoint.name if spec.checkpoint is not None else "step_0")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(spec.name).name or spec.name).strip("_")
    return Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{slug}"


def eta_seconds(total: int, completed: int, reused: int, elapsed: float | None) -> float | None:
    """Seconds left at the pace of this eval so far (samples drawn since it started; the reused
    ones cost nothing); None before the first batch is done."""
    drawn = completed - reused
    if drawn <= 0 or not elapsed:
        return None
    return (total - completed) * elapsed / drawn


class EtaColumn(ProgressColumn):
    """The time left from the whole eval's pace: rich's own column keeps 30 s of history, so it
    shows nothing while one batch (of 128 samples, say) takes longer than that."""

    def render(self, task) -> Text:
        left = eta_seconds(task.total or 0, task.completed, task.fields.get("reused", 0), task.elapsed)
        if left is None:
            return Text("eta after the first batch", style="progress.remaining")
        minutes, seconds = divmod(int(left), 60)
        return Text(f"eta {minutes // 60}:{minutes % 60:02d}:{seconds:02d}", style="progress.remaining")


class _Bar:
    """The harness's ProgressSink as a rich bar over samples (ETA from the samples drawn here)."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.task = None

    def start(self, total: int, done: int) -> None:
        self.task = self.progress.add_task("eval", total=total, completed=done, label="", reused=done)

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


NO_TOOLS = "none"  # --tools none: sample without tools, also for a run trained with them


def parse_tools(value: str | None) -> list[str] | None:
    """--tools as a list: None (left out: a run's own rollout.tools, else none), [] for 'none',
    else the comma-separated tools, each one of engine/rollout/tools/settings.py TOOLS."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    accepted = f"accepted: {NO_TOOLS}, {', '.join(TOOLS)}"
    if names == [NO_TOOLS]:
        return []
    if not names:
        raise UserError(f"--tools is empty; {accepted}")
    for name in names:
        if name not in TOOLS:
            raise UserError(f"--tools has '{name}', not a tool a response can call; {accepted}")
    return list(dict.fromkeys(names))


def settings_from_options(benchmarks: str | None, *, data_dir: Path | None, tools: str | None = None,
                          **options) -> EvalSettings:
    """EvalSettings from the command line's options (benchmarks and tools as comma-separated
    lists). Benchmarks, max_new_tokens and tools left out (None) stay None until run_eval knows
    what is evaluated (run_defaults, eval_tools); everything else is checked here."""
    names = None if benchmarks is None else [name.strip() for name in benchmarks.split(",") if name.strip()]
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir '{data_dir}' is not a folder; it must hold <benchmark>/test.jsonl files")
    settings = EvalSettings(names, data_dir=str(data_dir) if data_dir else None, tools=parse_tools(tools), **options)
    length = MODEL_MAX_NEW_TOKENS if settings.max_new_tokens is None else settings.max_new_tokens
    replace(settings, benchmarks=[MODEL_DEFAULT_BENCHMARK] if names is None else names,
            max_new_tokens=length).validate()
    return settings


def run_defaults(task_name: str | None, run_max_new_tokens: int | None, benchmarks: list[str] | None,
                 max_new_tokens: int | None) -> tuple[list[str], int, str]:
    """(benchmarks, max_new_tokens, why) where the command line left them out. A run is evaluated
    on what it was trained for: a math run on math500, any other task (a toy task, code) on its
    own held-out split at its own response length, or at least HELDOUT_MIN_NEW_TOKENS for its task;
    a model on math500 at 4,096 tokens."""
    if benchmarks is None and task_name is not None:
        benchmarks = [RUN_BENCHMARKS.get(task_name, HELDOUT)]
        why = f"what the run was trained for (task '{task_name}')"
    else:
        why = "--benchmarks" if benchmarks is not None else "the default for a model"
        benchmarks = benchmarks if benchmarks is not None else [MODEL_DEFAULT_BENCHMARK]
    if max_new_tokens is None:
        own_length = benchmarks == [HELDOUT] and run_max_new_tokens is not None
        max_new_tokens = heldout_max_new_tokens(task_name, run_max_new_tokens) if own_length else MODEL_MAX_NEW_TOKENS
        if own_length and max_new_tokens > run_max_new_tokens:
            why += f", the length task '{task_name}' needs (its rollout.max_new_tokens {run_max_new_tokens} is shorter)"
        elif own_length:
            why += ", the run's rollout.max_new_tokens"
    return benchmarks, max_new_tokens, why


def eval_tools(settings: EvalSettings, run_rollout: ToolSettings | None) -> tuple[ToolSettings | None, str]:
    """(the tool settings the eval samples with, None for none; why) from --tools, --max-tool-calls
    and --tool-output-tokens over the run's rollout section: a run trained with tools is evaluated
    with them unless --tools none; a run's code tags, time limit and call limits are kept, the
    options override the limits. Sets settings' tool fields to what was chosen (unset without tools)."""
    trained = run_rollout is not None and run_rollout.enabled
    asked = settings.tools is not None
    tools = settings.tools if asked else (list(run_rollout.tools) if trained else [])
    limits = {key: value for key in ("max_tool_calls", "tool_output_tokens")
              if (value := getattr(settings, key)) is not None}
    if not tools:
        if limits:
            option = "--" + next(iter(limits)).replace("_", "-")
            raise UserError(f"{option} limits tool calls, but this eval samples without tools; add --tools python")
        settings.tools, settings.max_tool_calls, settings.tool_output_tokens = [], None, None
        settings.code_tags, settings.tool_time_limit_s = None, None
        return None, ""
    chosen = replace(tool_settings_of(run_rollout) if trained else ToolSettings(), tools=list(tools), **limits)
    settings.tools, settings.max_tool_calls, settings.tool_output_tokens = (
        chosen.tools, chosen.max_tool_calls, chosen.tool_output_tokens)
    settings.code_tags, settings.tool_time_limit_s = chosen.code_tags, chosen.tool_time_limit_s
    why = "--tools" if asked else "the run was trained with them; --tools none evaluates without"
    return chosen, why


def tools_line(tools: ToolSettings, why: str) -> str:
    """The one line an eval with tools says of them."""
    return (f"tools: {', '.join(tools.tools)} ({why}); at most {tools.max_tool_calls} code runs a response, "
            f"outputs cut at {tools.tool_output_tokens} tokens, {tools.tool_time_limit_s:g} s a run")


def heldout_suite(cfg, limit: int | None):
    """(benchmark, problems) of the run's held-out split: its task's problems, prompted as in
    training (task.prompt) and graded by the task's grader, for the eval harness."""
    from benchmarks.registry import Benchmark
    from benchmarks.tasks import CodeTask, build_task

    task = build_task(cfg.task, cfg.train.seed)  # the run's seed: the split it held out
    problems = task.held_out[:limit] if limit else list(task.held_out)
    if not problems:
        raise UserError(f"task '{cfg.task.name}' has no held-out problems; evaluate on --benchmarks instead")
    kind = "code" if isinstance(task, CodeTask) else "math"
    bench = Benchmark(f"{HELDOUT}-{cfg.task.name}", "the training task's held-out split", kind,
                      lambda data_dir, limit: problems, task.grade, prompt=task.prompt)
    return bench, problems


def load_suites(names: list[str], data_dir: str | None, limit: int | None, run_cfg):
    """The benchmarks to run: registered ones by name, and `heldout`, the run's held-out split."""
    rest = [name for name in names if name != HELDOUT]
    suites = []
    if HELDOUT in names:
        if run_cfg is None:
            raise UserError(f"--benchmarks {HELDOUT} is a run's held-out split: give a run folder, not --model")
        suites.append(heldout_suite(run_cfg, limit))
    return suites + (load_benchmarks(rest, Path(data_dir) if data_dir else None, limit) if rest else [])


def work_line(suites, settings: EvalSettings) -> str:
    """What the eval will generate, at most: problems x samples x tokens."""
    problems = sum(len(problems) for _, problems in suites)
    tokens = problems * settings.samples * settings.max_new_tokens
    return (f"work: {problems} problems x {settings.samples} samples x up to {settings.max_new_tokens} tokens = up to "
            f"{tokens:,} tokens to generate (samples already in the output folder are reused)")


def choose_prompt(requested: str, run_style: str | None, has_chat_template: bool) -> tuple[str, str]:
    """(prompt style, why): an explicit --prompt wins; a run is evaluated with the style it was
    trained with; a bare model gets its chat template when it has one (an instruct model given
    the plain boxed prompt tends to answer with an empty response)."""
    if requested != "auto":
        return requested, "--prompt"
    if run_style is not None:
        return run_style, "the run's task.prompt_style"
    if has_chat_template:
        return "chat", "the model has a chat template"
    return "boxed", "the model has no chat template"


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
             console: Console | None = None, length_option: str = "--max-new-tokens") -> dict:
    """Evaluate and write the outputs; returns the results document. `length_option`: the option
    that sets the response length in the command running this eval, for the truncation advice."""
    library_warnings = route_library_warnings()  # to the output folder's log, not between the lines below
    console = console or Console(stderr=True, soft_wrap=True)  # paths in messages stay copyable
    if run_dir is not None and model is not None:
        raise UserError("give either a run folder (meds eval RUN_DIR) or --model, not both")
    if run_dir is None and model is None:
        try:
            run_dir = runs.newest_run("runs")
        except UserError:
            raise UserError("nothing to evaluate: no run folder under 'runs'; give a run folder (meds eval RUN_DIR) "
                            "or --model NAME") from None
        console.print(f"no run folder or --model given: evaluating the newest run, [bold]{plain(run_dir)}[/]")
    if step is not None and run_dir is None:
        raise UserError("--step picks a checkpoint of a run; it needs a run folder, not --model")
    check_dtype(dtype, "--dtype")
    backend_name = resolve_backend(settings.backend)
    settings.backend = backend_name

    def note(text: str) -> None:
        console.print(f"[yellow]note:[/] {plain(text)}")

    if run_dir is None:  # a bad --model fails here, before an output folder is made or a model loads
        model, said = canonical_model_name(model)
        if said:
            note(said)
    spec = model_for_run(run_dir, step, dtype, note) if run_dir is not None else ModelSpec(model, None, dtype)
    precheck_model(spec.name)
    settings.model = spec.label
    run_cfg = load_config([str(Path(run_dir) / "config.yaml")]) if run_dir is not None else None
    task = run_cfg.task if run_cfg is not None else None
    asked = settings.benchmarks
    settings.benchmarks, settings.max_new_tokens, chosen_because = run_defaults(
        task.name if task else None, run_cfg.rollout.max_new_tokens if run_cfg else None, settings.benchmarks,
        settings.max_new_tokens)
    settings.validate()
    if asked is None:
        console.print(f"benchmarks: {plain(', '.join(settings.benchmarks))} at up to {settings.max_new_tokens} tokens "
                      f"({plain(chosen_because)}; --benchmarks and --max-new-tokens choose others)")
    settings.prompt, why = choose_prompt(settings.prompt, task.prompt_style if task else None,
                                         task is None and settings.prompt == "auto" and has_chat_template(model))
    if task is not None:  # the run's own prompt: its system prompt and template arguments too
        settings.system_prompt, settings.chat_template_kwargs = task.system_prompt, dict(task.chat_template_kwargs)
    # Fail on a wrong benchmark name or data dir before spending time on the model.
    t0 = time.perf_counter()
    suites = load_suites(settings.benchmarks, settings.data_dir, settings.limit, run_cfg)
    settings.benchmarks = [benchmark.name for benchmark, _ in suites]  # heldout -> heldout-<task>
    load_s = time.perf_counter() - t0
    folder = Path(output) if output else default_output(run_dir, spec)
    tools, tools_why = eval_tools(settings, run_cfg.rollout if run_cfg is not None else None)
    generation = GenerationSettings(settings.temperature, settings.top_p, settings.max_new_tokens, settings.batch_size,
                                    tools)
    check_state(folder, settings)  # refuse mismatched samples before the model takes its time to load
    if tools is not None:
        console.print(tools_line(tools, tools_why), markup=False, highlight=False, soft_wrap=True)
    library_warnings.log_to(folder)  # written once the eval has made the folder
    with console.status(f"loading {plain(spec.label)} ({plain(backend_name)}) ..."):
        backend = make_backend(backend_name, spec, generation)
    console.print(f"eval of [bold]{plain(spec.label)}[/] on {plain(', '.join(settings.benchmarks))}: "
                  f"n={settings.samples} "
                  f"k<={settings.k}  prompt: {plain(settings.prompt)} ({plain(why)})  output: [bold]{plain(folder)}[/]")
    console.print(work_line(suites, settings), markup=False, highlight=False, soft_wrap=True)
    progress = Progress(TextColumn("[bold]eval"), TextColumn("{task.fields[label]}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("samples"), TimeElapsedColumn(), EtaColumn(),
                        console=console, disable=quiet)
    lock = FolderLock(folder, "eval output folder", "two evals writing one samples.jsonl would draw every sample twice")
    with lock:  # to the results file: another eval of this folder waits for none of it
        try:
            with progress:
                check_state(folder, settings)  # again, under the lock: what another eval may have written since
                outcome = evaluate(backend, settings, folder, _Bar(progress), suites)
        except KeyboardInterrupt:
            console.print(f"[yellow]stopped[/]; the samples drawn so far are in {plain(folder / 'samples.jsonl')}: "
                          f"run the same command with --output {plain(folder)} to continue")
            raise
        outcome.timing["load_s"] += load_s
        outcome.timing["total_s"] += load_s
        document = results_document(spec, settings, outcome, backend_name)
        warnings = [line for line in (prompt_warning(document), truncation_warning(document, length_option)) if line]
        if warnings:
            document["warnings"] = warnings
        write_results(folder, document)
        library_warnings.flush()
        plot_pass_at_k([(spec.label, document)], folder / PLOT_FILE)
        print_table(score_table(document))
        console.print(truncation_line(document), markup=False, highlight=False, soft_wrap=True)
        for warning in warnings:
            console.print(f"[yellow]warning:[/] {plain(warning)}")
        console.print(f"results: {plain(folder / 'results.json')}  samples: {plain(outcome.samples_path)}  "
                      f"plot: {plain(folder / PLOT_FILE)}")
    return document


def run_compare(targets: list[Path], output: Path | None) -> Path:
    return compare(targets, output, Console())
