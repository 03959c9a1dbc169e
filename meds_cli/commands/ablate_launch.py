"""Where `meds ablate` runs its tasks, and its report from the task folders alone.

`--launcher local` runs the tasks in this process one after another (today's behaviour), or with
`--jobs N` as N processes at once; `--launcher slurm` submits them as one job array. The ablation
code calls make_launcher and then only submit / poll (meds_cli/engine/launchers); whichever ran
the tasks, the report reads their folders: finished ones compared, the others named with the
last line of their error or log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from meds_cli.core.errors import UserError
from meds_cli.engine.launchers import check_launcher
from meds_cli.engine.launchers.local import InProcessLauncher, ProcessLauncher
from meds_cli.engine.launchers.slurm_array import JOBS_FILE, SlurmArrayLauncher, latest_submissions, still_held
from meds_cli.engine.launchers.slurm_settings import SlurmSettings, check_before_submit, check_settings
from meds_cli.engine.launchers.tasks import ENDED, Task, collect


@dataclass
class LaunchOptions:
    launcher: str = "local"
    jobs: int | None = None  # local: N task processes at once; None: in this process
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    wait: bool = True  # False (--no-wait): submit and return

    def check(self, *, cluster: bool = True) -> None:
        """Every bad setting in one line, before anything is written or submitted."""
        check_launcher(self.launcher)
        if self.launcher == "slurm":
            if self.jobs is not None:
                raise UserError("--jobs is for --launcher local; on Slurm, --slurm-max-parallel N caps the "
                                "tasks running at once")
            check_before_submit(self.slurm) if cluster else check_settings(self.slurm)
        else:
            if self.jobs is not None and self.jobs < 1:
                raise UserError(f"--jobs {self.jobs}: give the number of tasks to run at once, 1 or more")
            if self.slurm != SlurmSettings():
                raise UserError("the --slurm-* options need --launcher slurm")
            if not self.wait:
                raise UserError("--no-wait needs --launcher slurm (local tasks end with the command)")


def with_grid_settings(options: LaunchOptions, grid_file: Path | None) -> LaunchOptions:
    """The options with the grid file's `slurm:` section under the --slurm-* flags (a flag wins)."""
    from meds_cli.engine.config import read_yaml
    from meds_cli.engine.launchers.slurm_settings import merged, settings_from_mapping

    section = read_yaml(grid_file).get("slurm") if grid_file else None
    if section is None:
        return options
    grid = settings_from_mapping(section, f"grid '{grid_file}'")  # checked whichever launcher runs the grid
    if options.launcher == "slurm":
        options.slurm = merged(grid, options.slurm)
    return options


def make_launcher(options: LaunchOptions, folder: Path, run_here: Callable[[Task], None]):
    if options.launcher == "slurm":
        return SlurmArrayLauncher(folder, options.slurm, Path.cwd())
    if options.jobs is None:
        return InProcessLauncher(run_here)
    return ProcessLauncher(options.jobs)


def wait_with_progress(launcher, console, quiet: bool) -> None:
    """Poll until every task ended, with a bar of finished tasks."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]tasks ended"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=quiet, transient=False) as progress:
        bar = progress.add_task("tasks", total=None)
        collect(launcher, lambda ended, total: progress.update(bar, completed=ended, total=total))


def slurm_activity(folder: Path) -> dict[str, str]:
    """Tasks of this folder Slurm still holds (queued or running), where it was submitted to Slurm."""
    import shutil

    if not (folder / JOBS_FILE).is_file():
        return {}
    submissions = latest_submissions(folder)  # checked on every machine, not only where Slurm answers
    return still_held(submissions) if shutil.which("squeue") is not None else {}


def report(folder: Path, variants, eval_settings, console, active: dict[str, str] | None = None,
           compare=()) -> dict:
    """The report of the finished tasks; the others named (failed: their error's last line;
    queued/running in Slurm; or not finished, with their log's last line). `compare`: the grid's
    extra pairs of arms."""
    from meds_cli.commands.ablate_eval import results_path
    from meds_cli.commands.ablate_report import write_report
    from meds_cli.commands.ablate_task import DONE, FAILED, check_config, task_outcome
    from meds_cli.core.names import child
    from meds_cli.engine.config import load_config

    finished, paths, unfinished = [], {}, {}
    for variant in variants:
        run_dir = child(folder, variant.name, f"the variants of '{folder}'")
        config = run_dir / "config.yaml"
        steps = load_config([str(config)]).train.steps if config.is_file() else 0
        paths[variant.name] = results_path(run_dir, eval_settings, steps)
        state, line = task_outcome(run_dir, paths[variant.name])
        if state == DONE:
            try:  # an edited config.yaml: its results are not the variant's
                check_config(run_dir, variant.name, variant.overrides)
            except UserError as error:
                state, line = FAILED, str(error)
        if state == DONE:
            finished.append(variant)
            continue
        if (active or {}).get(variant.name, ENDED) != ENDED:
            state, line = active[variant.name], None
        unfinished[variant.name] = {"state": state, "last_line": line}
    return write_report(folder, finished, paths, console, unfinished=unfinished, compare=compare)


def array_script(plan, settings: SlurmSettings) -> str:
    """The sbatch script of the grid's tasks (every value checked: a control character is one line)."""
    from meds_cli.commands.ablate_task import make_task
    from meds_cli.engine.launchers.slurm_array import render_array_script

    tasks = [make_task(plan.folder / v.name) for v in plan.variants]
    return render_array_script(tasks, plan.folder, settings, Path.cwd())

