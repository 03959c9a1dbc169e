"""Launchers: where the tasks of a grid run. A task is a folder with its resolved config and the
command line that trains and evaluates it; a launcher only decides where that command runs:
in this process (`in_process`), N at once on this machine (`processes`, `--jobs N`), or as the
tasks of one Slurm job array (`slurm`, a readable sbatch script in the grid's folder). All
three have one small interface (tasks.Launcher: submit, poll, stop; tasks.collect waits), so the ablation never
asks which one it has, and the report is built from the task folders alone.

Imports only the core; imported by the command line (meds_cli/commands/ablate.py, train.py).
"""

from meds_cli.core.errors import UserError

LAUNCHERS = ("local", "slurm")  # --launcher of `meds train` and `meds ablate`


def check_launcher(name: str) -> None:
    if name not in LAUNCHERS:
        raise UserError(f"--launcher '{name}' is not a launcher; accepted: {', '.join(LAUNCHERS)}")
