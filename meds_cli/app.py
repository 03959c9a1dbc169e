"""The `meds` command line: thin Typer commands that parse options and call one function each."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand

from meds_cli import __version__
from meds_cli.commands.export import export_command
from meds_cli.core.errors import UserError, os_error, storage_error
from meds_cli.core.markup import plain

app = typer.Typer(help="meds: RL post-training of LLMs on verifiable reasoning, and the tools to compare and "
                       "inspect it.",
                  rich_markup_mode="rich", no_args_is_help=True, pretty_exceptions_enable=False)
err = Console(stderr=True)

# --slurm-* options meaning the same for `meds train` (a run's nodes) and `meds ablate` (each task):
# declared once (typer copies an option's declaration for each command that uses it).
SlurmPartition = Annotated[Optional[str], typer.Option(help="slurm: the partition (default: the cluster's).")]
SlurmAccount = Annotated[Optional[str], typer.Option(help="slurm: the account to charge.")]
SlurmExtra = Annotated[Optional[list[str]], typer.Option(
    help="slurm: any other sbatch option as KEY=VALUE (qos=high); repeatable.")]


def fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {plain(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def options_given(context: typer.Context, exclude: str) -> list[str]:
    """The options of the running command given on its command line (not left at their default),
    but `exclude`; for a mode that takes no others (meds ablate --collect)."""
    return [param.opts[0] for param in context.command.params
            if param.name != exclude and param.opts
            and getattr(context.get_parameter_source(param.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")]


def _one_line_errors(command, doing: str, then: str = ""):
    """`command` (same signature, for Typer) ending every failure a user can cause in one red line:
    a UserError; a full disk, read-only place or file in the way (an OSError, or a library's error
    raised from one), as 'could not DOING (reason: path); what to do[; THEN]'; a user's file that
    is not text. Exit code 2, or 130 on Ctrl-C. Anything else is a bug and keeps its traceback."""

    @functools.wraps(command)
    def run_command(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as error:
            fail(str(error))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except UnicodeDecodeError as error:  # a reader that did not say which file (read_user_text does)
            fail(f"could not {doing}: a file it read is not UTF-8 text ({error.reason} at byte {error.start}); "
                 f"give text files")
        except Exception as error:
            failed = storage_error(error)
            if failed is None:
                raise
            fail(str(os_error(failed, doing)) + (f"; {then}" if then else ""))

    run_command.one_line_errors = True  # tests/test_hostile_inputs.py checks every command has it
    return run_command


class TrainHelp(TyperCommand):
    """`meds train`, whose --algo, --task and --model help names every registered algorithm and
    task and every built-in model, filled in only when the help is shown: the algorithm registry
    imports torch (over a second), which a command run without --help does not pay."""

    def format_help(self, ctx, formatter) -> None:
        from meds_cli.commands.listing import train_option_help

        helps = train_option_help()
        for param in self.params:
            if param.name in helps:
                param.help = helps[param.name]
        super().format_help(ctx, formatter)


def command(name: str, *, doing: str, then: str = "", hidden: bool = False, cls: type[TyperCommand] | None = None):
    """Register a `meds` command; every command goes through _one_line_errors. `then`: how to
    continue after a storage failure, for commands that can; `hidden`: left out of --help (a
    command launchers run, not people); `cls`: the command's class where its help is built (TrainHelp)."""
    return lambda function: app.command(name, hidden=hidden, cls=cls)(_one_line_errors(function, doing, then))


def _version(value: bool):
    if value:
        print(f"meds {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False):
    """meds: train with the registered RL algorithms (GRPO, DAPO, MEDS, EDAS, ...: `meds list`); evaluate; inspect."""


@command("train", doing="write the run folder", cls=TrainHelp)
def train(
    config: Annotated[Optional[list[Path]], typer.Option(
        "--config", "-c", help="YAML config file; repeatable, later files win.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", "-s", help="Override one key: section.key=value (repeatable).")] = None,
    algo: Annotated[Optional[str], typer.Option(
        help="Algorithm: a registered one (`meds list`).")] = None,
    base: Annotated[Optional[str], typer.Option(
        help="Base algorithm under a shaping method (meds, edas): dapo or grpo.")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="Built-in model, alias (`meds list`), hub id, local dir or .gguf file.")] = None,
    task: Annotated[Optional[str], typer.Option(
        help="Training task: a registered one (`meds list`).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed.")] = None,
    output: Annotated[Optional[Path], typer.Option(
        help="Run folder to create (default runs/<time>-<algo>-<tag>).")] = None,
    tag: Annotated[Optional[str], typer.Option(help="Suffix of the run folder name.")] = None,
    resume: Annotated[Optional[Path], typer.Option(
        help="Continue the run in this folder from its newest complete checkpoint.")] = None,
    step: Annotated[Optional[int], typer.Option(help="With --resume: the checkpoint step to continue from.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the resolved config, the run folder, the model's size, the sampling shape and tokens "
                          "per step; load nothing, create nothing.")] = False,
    launcher: Annotated[str, typer.Option(
        help="local (this machine) or slurm (write and submit an sbatch script for --nodes N).")] = "local",
    nodes: Annotated[int, typer.Option(help="slurm: nodes of the run.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="slurm: GPUs of each node, one process each.")] = 0,
    processes_per_node: Annotated[Optional[int], typer.Option(
        help="slurm, on CPUs: processes of each node (default 1).")] = None,
    server_nodes: Annotated[int, typer.Option(
        help="slurm: 1 runs the vLLM server of rollout.engine=vllm-server on a node of its own (the first of "
             "--nodes), training on the others.")] = 0,
    slurm_partition: SlurmPartition = None,
    slurm_time: Annotated[Optional[str], typer.Option(help="slurm: time limit (e.g. 1-00:00:00).")] = None,
    slurm_cpus_per_task: Annotated[Optional[int], typer.Option(help="slurm: CPUs of each node's task.")] = None,
    slurm_mem: Annotated[Optional[str], typer.Option(help="slurm: memory of each node (e.g. 400G).")] = None,
    slurm_account: SlurmAccount = None,
    slurm_extra: SlurmExtra = None,
    requeue: Annotated[bool, typer.Option(
        help="slurm: let Slurm requeue the job; it resumes from the last checkpoint.")] = False,
    launched: Annotated[bool, typer.Option(
        "--launched", hidden=True, help="The run folder was made by --launcher slurm (its script runs this).")] = False,
):
    """Train a model with RL on a task with verifiable rewards; writes a run folder."""
    from meds_cli.commands.train import dry_run as show_plan
    from meds_cli.commands.train import run_training
    from meds_cli.engine.launchers import check_launcher
    from meds_cli.engine.launchers.slurm_settings import SlurmSettings

    shortcuts = {"algo.name": algo, "algo.base": base, "model.name": model, "task.name": task, "train.steps": steps,
                 "train.seed": seed, "train.output_dir": str(output) if output else None, "train.tag": tag}
    check_launcher(launcher)
    settings = SlurmSettings(partition=slurm_partition, time=slurm_time, cpus_per_task=slurm_cpus_per_task,
                             mem=slurm_mem, account=slurm_account, extra=list(slurm_extra or []), requeue=requeue)
    if launcher == "slurm":
        from meds_cli.commands.train_slurm import submit_training

        if resume is not None:
            raise UserError("--launcher slurm starts a new run; resubmit a stopped one with sbatch RUN/train.sbatch "
                            "(it resumes from the last checkpoint)")
        submit_training(config or [], set_ or [], shortcuts, nodes=nodes, gpus_per_node=gpus_per_node,
                        processes_per_node=processes_per_node, settings=settings, dry_run=dry_run,
                        console=Console(stderr=True, soft_wrap=True), server_nodes=server_nodes)
        return
    if dry_run:
        console = Console(stderr=True, soft_wrap=True)  # paths stay copyable
        show_plan(config or [], set_ or [], shortcuts, resume=resume, step=step, console=console)
        return
    if (nodes, gpus_per_node, processes_per_node, server_nodes) != (1, 0, None, 0) or settings != SlurmSettings():
        raise UserError("--nodes, --gpus-per-node, --processes-per-node, --server-nodes, --requeue and the --slurm-* "
                        "options need --launcher slurm; on this machine, start several processes with accelerate "
                        "launch")
    from meds_cli.commands.train_slurm import PREPARED

    code = run_training(config or [], set_ or [], shortcuts, resume=resume, step=step, argv=sys.argv, quiet=quiet,
                        prepared=PREPARED if launched else ())
    raise typer.Exit(code)


@command("eval", doing="write the eval outputs", then="then run the same command: it keeps the samples drawn so far")
def eval_cmd(
    targets: Annotated[Optional[list[Path]], typer.Argument(
        help="A run folder (its last checkpoint, or --step); with --compare: runs, eval folders or results.json "
             "files.")] = None,
    model: Annotated[Optional[str], typer.Option(
        help="Evaluate this model instead of a run: the values `meds train --model` accepts.")] = None,
    step: Annotated[Optional[int], typer.Option(help="Checkpoint step of the run (default: the latest).")] = None,
    benchmarks: Annotated[Optional[str], typer.Option(
        help="Comma-separated benchmarks (see `meds list`), or heldout (a run's held-out split). Default: for a run, "
             "what it trained for (math500 for a math run, else its held-out split); math500 for --model.")] = None,
    k: Annotated[int, typer.Option("--k", help="Report pass@k and maj@k for k = 1, 2, 4, ... up to this.")] = 128,
    n: Annotated[Optional[int], typer.Option(
        "--n", help="Samples per problem (default: k); more than k lowers the variance.")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Evaluate only the first N problems of each benchmark.")] = None,
    data_dir: Annotated[Optional[Path], typer.Option(
        help="Folder with <benchmark>/test.jsonl (DIR/math500/test.jsonl, ...); default: the dataset hub.")] = None,
    prompt: Annotated[str, typer.Option(
        help="Prompt template: auto (a run's own style; a model's chat template when it has one, else boxed), boxed "
             "(Qwen-Math, plain text), chat, plain (the problem text alone), or chat_plain (the problem text alone in "
             "the chat template).")] = "auto",
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 0.6,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling top-p.")] = 0.95,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="Response length limit in tokens (default: a run's own on its held-out split, else 4096).")] = None,
    seed: Annotated[int, typer.Option(
        help="Seed; samples are a function of it and the problem, so a resumed eval draws the same ones.")] = 0,
    batch_size: Annotated[Optional[int], typer.Option(
        help="Sequences decoded together by the hf backend (default: as many as fit in half the free memory, "
             "at most 1024).")] = None,
    backend: Annotated[str, typer.Option(
        help="Generation backend: auto (vllm when installed and a GPU is present), hf, vllm.")] = "auto",
    dtype: Annotated[Optional[str], typer.Option(
        help="Weight dtype (default: the run's, else bfloat16 on GPU, float32 on CPU).")] = None,
    tools: Annotated[Optional[str], typer.Option(
        help="Tools a response may call mid-answer: python (its ```python blocks run in the sandbox, their output "
             "goes back as an ```output block; docs/tools.md) or none. Default: a run's own rollout.tools, else "
             "none.")] = None,
    max_tool_calls: Annotated[Optional[int], typer.Option(
        help="With tools: code blocks run per response (default: the run's rollout.max_tool_calls, else 4).")] = None,
    tool_output_tokens: Annotated[Optional[int], typer.Option(
        help="With tools: tokens of a block's output the model reads back (default: the run's, else 512).")] = None,
    output: Annotated[Optional[Path], typer.Option(
        help="Output folder (default RUN_DIR/eval/step_N, or runs/eval-<time>-<model>); an existing one is "
             "resumed.")] = None,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Compare the given evals on one plot and a table; generates nothing.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
):
    """Evaluate a run's checkpoint or a model on benchmarks: pass@k, maj@k, length; resumable."""
    from meds_cli.commands.eval import run_compare, run_eval, settings_from_options

    if compare:
        run_compare(targets or [], output)
        return
    if len(targets or []) > 1:
        raise UserError(f"give one run folder, got {len(targets)}; to compare evals add --compare")
    settings = settings_from_options(benchmarks, k=k, n=n, limit=limit, data_dir=data_dir, prompt=prompt,
                                     temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                     seed=seed, batch_size=batch_size, backend=backend, tools=tools,
                                     max_tool_calls=max_tool_calls, tool_output_tokens=tool_output_tokens)
    run_eval(run_dir=targets[0] if targets else None, model=model, step=step, settings=settings,
             output=output, dtype=dtype, quiet=quiet)


@command("list", doing="list the registries")
def list_cmd():
    """List the registered algorithms, tasks, benchmarks and model aliases."""
    from meds_cli.commands.listing import print_registries

    print_registries()


@command("cluster-inspect", doing="write the inspection plots")
def cluster_inspect_cmd(
    run_dir: Annotated[Optional[Path], typer.Argument(
        help="A run folder of a MEDS run (default: the newest run under runs/).")] = None,
    step: Annotated[Optional[int], typer.Option(help="Checkpoint step to read (default: the latest).")] = None,
    prompt: Annotated[Optional[str], typer.Option(
        help="Prompt id to detail (default: the one with the largest wrong cluster).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    output: Annotated[Optional[Path], typer.Option(help="Folder for the PNGs (default RUN_DIR/inspect).")] = None,
):
    """Inspect the MEDS memory of a run: clusters per prompt, samples, ARI vs answers, plots."""
    from meds_cli.commands.cluster_inspect import cluster_inspect

    if run_dir is None:
        from meds_cli.engine.run_folders.run_dir import newest_run

        run_dir = newest_run("runs")
        err.print(f"no run folder given: inspecting the newest run, [bold]{plain(run_dir)}[/]", soft_wrap=True)
    cluster_inspect(run_dir, step=step, prompt=prompt, output=output, as_json=json_)


@command("ablate", doing="write the ablation folder",
         then="then run the same command with the same --output: it continues where it stopped")
def ablate(
    ctx: typer.Context,
    config: Annotated[Optional[list[Path]], typer.Option(
        "--config", "-c", help="Base YAML config; repeatable, later files win.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", "-s", help="Base override section.key=value (repeatable).")] = None,
    grid: Annotated[Optional[Path], typer.Option(help="YAML grid of variants (configs/ablate/*.yaml).")] = None,
    algos: Annotated[Optional[str], typer.Option(
        help="Comma-separated algorithms or presets (`meds list`), each a variant on the same base config and "
             "seeds, e.g. dapo,meds,passk,w-reinforce; the first is the baseline.")] = None,
    baseline: Annotated[Optional[str], typer.Option(
        "--baseline", help="With --algos: the algorithm the others are compared with (default: the first).")] = None,
    features: Annotated[Optional[str], typer.Option(
        help="Comma-separated meds.features: logits, semantic, hidden_mean, random.")] = None,
    clusterer: Annotated[Optional[str], typer.Option(
        help="Comma-separated meds.clusterer: hdbscan, kmeans, dbscan, agglomerative.")] = None,
    layers: Annotated[Optional[str], typer.Option(help="Comma-separated meds.layers: last_half, last:K.")] = None,
    seeds: Annotated[Optional[str], typer.Option(
        help="Comma-separated seeds; every variant runs once per seed.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per variant.")] = None,
    base_model: Annotated[bool, typer.Option(
        "--base-model", help="Add the base model itself, untrained (train.steps 0), as an arm: every trained arm is "
                             "also compared with it.")] = False,
    no_baseline: Annotated[bool, typer.Option(
        "--no-baseline", help="MEDS variants: leave out the baseline run of the base algorithm (DAPO).")] = False,
    output: Annotated[Optional[Path], typer.Option(
        help="Ablation folder (default runs/ablate-<time>); an existing one is continued.")] = None,
    benchmarks: Annotated[str, typer.Option(
        help="'heldout' (the task's held-out split) or comma-separated benchmarks.")] = "heldout",
    data_dir: Annotated[Optional[Path], typer.Option(
        help="Folder with <benchmark>/test.jsonl (DIR/math500/test.jsonl, ...); default: the dataset hub.")] = None,
    k: Annotated[int, typer.Option("--k", help="Report pass@k for k = 1, 2, 4, ... up to this.")] = 8,
    n: Annotated[Optional[int], typer.Option("--n", help="Samples per problem (default: k).")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Evaluate only the first N problems.")] = None,
    temperature: Annotated[float, typer.Option(help="Eval sampling temperature.")] = 0.6,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="Response length of the evals (default: each variant's own, its training length, or the held-out "
             "split's length); training's stays rollout.max_new_tokens (--set).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the variants and stop.")] = False,
    estimate: Annotated[bool, typer.Option(
        "--estimate",
        help="With --dry-run: then time one training step of the base config and estimate the total.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
    launcher: Annotated[str, typer.Option(
        help="Where the tasks (variant x seed) run: local (this machine) or slurm (one job array).")] = "local",
    jobs: Annotated[Optional[int], typer.Option(
        help="local: run N tasks at once as processes (one GPU each where there are GPUs); "
             "default: one after another in this process.")] = None,
    slurm_partition: SlurmPartition = None,
    slurm_time: Annotated[Optional[str], typer.Option(help="slurm: time limit of a task (e.g. 4:00:00, 1-12).")] = None,
    slurm_gpus_per_task: Annotated[Optional[int], typer.Option(help="slurm: GPUs of a task.")] = None,
    slurm_cpus_per_task: Annotated[Optional[int], typer.Option(
        help="slurm: CPUs of a task (its torch threads).")] = None,
    slurm_mem: Annotated[Optional[str], typer.Option(help="slurm: memory of a task (e.g. 64G).")] = None,
    slurm_account: SlurmAccount = None,
    slurm_max_parallel: Annotated[Optional[int], typer.Option(
        help="slurm: at most N tasks running at once (the array's %N).")] = None,
    slurm_extra: SlurmExtra = None,
    requeue: Annotated[bool, typer.Option(
        help="slurm: let Slurm requeue a preempted task; it resumes from its last checkpoint.")] = False,
    no_wait: Annotated[bool, typer.Option(
        "--no-wait", help="slurm: submit and return; `meds ablate --collect DIR` writes the report later.")] = False,
    collect: Annotated[Optional[Path], typer.Option(
        help="Write the report of an ablation folder from whatever has finished (naming what has not), and stop.")
    ] = None,
):
    """Ablations in one command: algorithms side by side (--algos) or MEDS's settings (--features, --clusterer,
    --layers); train and evaluate each variant, then compare them with the baseline in a table, verdicts and plots."""
    from benchmarks.harness import EvalSettings
    from meds_cli.commands.ablate import collect_report, make_plan, run_ablation
    from meds_cli.commands.ablate import dry_run as show_plan
    from meds_cli.commands.ablate_launch import LaunchOptions, array_script, with_grid_settings
    from meds_cli.commands.eval import HELDOUT
    from meds_cli.engine.launchers.slurm_settings import SlurmSettings

    if collect is not None:
        given = options_given(ctx, exclude="collect")
        if given:
            raise UserError(f"--collect DIR writes the report of DIR as its tasks.json says; it takes no other option "
                            f"({', '.join(given)} given): drop them, or rerun the grid's own command to change it")
        collect_report(collect, err)
        return
    launch = LaunchOptions(launcher, jobs, SlurmSettings(
        partition=slurm_partition, time=slurm_time, gpus_per_task=slurm_gpus_per_task,
        cpus_per_task=slurm_cpus_per_task, mem=slurm_mem, account=slurm_account, max_parallel=slurm_max_parallel,
        extra=list(slurm_extra or []), requeue=requeue), wait=not no_wait)
    launch = with_grid_settings(launch, grid)
    launch.check(cluster=False)  # the forms of the settings; the cluster is asked before submitting
    plan = make_plan(config_files=config or [], sets=set_ or [], grid_file=grid, features=features, clusterer=clusterer,
                     layers=layers, seeds=seeds, steps=steps, baseline=not no_baseline, output=output, algos=algos,
                     baseline_name=baseline, base_model=base_model)
    if dry_run:
        script = array_script(plan, launch.slurm) if launcher == "slurm" else ""  # checked before the plan prints
        show_plan(plan, err, probe=estimate)
        print(script, end="")
        return
    names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    # each variant is evaluated at its own response length, with the prompt style it trained with
    settings = EvalSettings(names, k=k, n=n, limit=limit, data_dir=str(data_dir) if data_dir else None,
                            temperature=temperature, prompt="auto", backend="hf" if names == [HELDOUT] else "auto")
    summary = run_ablation(plan, settings, console=err, quiet=quiet, argv=sys.argv, launch=launch,
                           eval_length=max_new_tokens)
    failed = [name for name, item in summary.get("unfinished", {}).items() if item["state"] == "failed"]
    if failed:
        fail(f"{len(failed)} tasks failed ({', '.join(failed)}); the report compares the others. Fix the cause and "
             f"rerun the same command with --output {plan.folder}: it reruns only the unfinished tasks", code=1)


@command("ablate-task", doing="write the task folder", hidden=True)
def ablate_task(folder: Annotated[Path, typer.Argument(help="A task folder of an ablation.")]):
    """One task of `meds ablate` (a launcher runs it): train, then evaluate, in its folder."""
    from meds_cli.commands.ablate_task import run_task

    run_task(folder, err, quiet=True, argv=sys.argv)


command("export", doing="write the export")(export_command)


def run():  # pragma: no cover - console entry for `python -m meds_cli`
    app()
