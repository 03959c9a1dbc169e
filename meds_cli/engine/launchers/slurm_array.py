"""The Slurm launcher of a grid: every task is one task of one job array, rendered as a readable
sbatch script in the grid's folder (<grid>/ablate.sbatch: edit and resubmit it by hand if you
like). A task's output goes to <task>/slurm-<job>_<index>.out (appended to on a requeue); the
job ids are kept in <grid>/slurm_jobs.json, so a rerun of the command resubmits only the tasks
that are neither finished nor still queued or running."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from meds_cli.core.errors import UserError
from meds_cli.core.files import replace_text
from meds_cli.core.read_back import read_json, require
from meds_cli.engine.launchers.script_text import comment, directive, output_directive, shell_word
from meds_cli.engine.launchers.slurm_settings import SlurmSettings, error_line, sbatch_lines, sbatch_submit
from meds_cli.engine.launchers.tasks import ENDED, QUEUED, RUNNING, Task

SCRIPT = "ablate.sbatch"
JOBS_FILE = "slurm_jobs.json"  # {job id: [task names, by array index]}
ARRAY_LOGS = "slurm-logs"  # what an array task prints before its own log opens


def render_array_script(tasks: list[Task], folder: Path, settings: SlurmSettings, workdir: Path) -> str:
    """The sbatch script running `tasks` as array tasks 0..len-1, each its own command line (one
    Slurm task each: --ntasks=1, which --gpus-per-task also needs). Every value goes through
    script_text (checked, quoted): a control character anywhere is one line, before anything is written."""
    folder = folder.resolve()
    where = "the ablation folder (--output)"
    output = output_directive(where, folder / ARRAY_LOGS, "%A_%a.out")  # first: its errors name the folder
    limit = f"%{settings.max_parallel}" if settings.max_parallel else ""
    commands = "\n".join(f"    {index}) COMMAND=({' '.join(shell_word('a task command', w) for w in task.command)}) ;;"
                         for index, task in enumerate(tasks))
    folders = "\n".join(f"    {index}) TASK={shell_word('a task folder', task.folder.resolve())} ;;"
                        for index, task in enumerate(tasks))
    header = "\n".join([
        comment(f"meds ablate: {len(tasks)} tasks of the grid in {folder}, one Slurm array task each"),
        comment("(train, then evaluate, in the task's folder). Written by `meds ablate --launcher slurm`;"),
        comment("rerunning that command resubmits only unfinished tasks. "
                f"By hand: sbatch {shlex.quote(str(folder / SCRIPT))}"),
        directive("job-name", f"meds-{folder.name}", where),
        directive("array", f"0-{len(tasks) - 1}{limit}"),
        directive("ntasks", 1),
        output,
        directive("open-mode", "append"),
        *sbatch_lines(settings)])
    return f"""#!/bin/bash
{header}
set -euo pipefail
case "$SLURM_ARRAY_TASK_ID" in
{folders}
esac
# The task's own log, in its folder; a requeued task appends to it.
exec >>"$TASK/slurm-${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}.out" 2>&1
echo "meds: array task $SLURM_ARRAY_TASK_ID on $(hostname), start ${{SLURM_RESTART_COUNT:-0}} after requeues"
# Torch's threads: the task's CPUs where --cpus-per-task was given.
if [[ -n "${{SLURM_CPUS_PER_TASK:-}}" ]]; then export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK; fi
# Slurm sends SIGTERM on scancel, preemption and the time limit: the log says so (the report shows its last line).
trap 'echo "meds: stopped by Slurm (SIGTERM: scancel, preemption or the time limit); rerunning the command \
resumes the task from its last checkpoint"; exit 143' TERM
cd {shell_word('the working folder', workdir)}
case "$SLURM_ARRAY_TASK_ID" in
{commands}
esac
"${{COMMAND[@]}}" &
wait $!
"""


def read_jobs(folder: Path) -> dict[str, list[str]]:
    """slurm_jobs.json, checked: {job id (digits): [task names]}; anything else is one line."""
    path = folder / JOBS_FILE
    if not path.is_file():
        return {}
    jobs = read_json(path)
    require(all(isinstance(job, str) and job.isdigit() and isinstance(names, list)
                and all(isinstance(name, str) for name in names) for job, names in jobs.items()),
            path, "is not a mapping of Slurm job ids to the names of their tasks")
    return jobs


def squeue_states(job_ids: list[str]) -> dict[tuple[str, int], str]:
    """(job id, array index) -> QUEUED or RUNNING for the array tasks Slurm still holds."""
    if not job_ids:
        return {}
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%F|%K|%t"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise UserError(f"squeue failed ({error_line(done)}); "
                        "is the Slurm controller up?")
    states = {}
    for line in done.stdout.splitlines():
        job, index, state = (line.split("|") + ["", "", ""])[:3]
        if job in job_ids and index.isdigit():
            # PD pending, CF configuring, RQ/RS requeued or resized: queued; the rest hold a node.
            states[(job, int(index))] = QUEUED if state in ("PD", "CF", "RQ", "RS", "RH") else RUNNING
    return states


def latest_submissions(folder: Path) -> dict[str, tuple[str, int]]:
    """task name -> (job id, array index) of its newest submission."""
    latest = {}
    for job, names in sorted(read_jobs(folder).items(), key=lambda item: int(item[0])):
        for index, name in enumerate(names):
            latest[name] = (job, index)
    return latest


def still_held(submissions: dict[str, tuple[str, int]]) -> dict[str, str]:
    """The tasks of `submissions` that Slurm still holds: name -> QUEUED or RUNNING."""
    states = squeue_states(sorted({job for job, _ in submissions.values()}))
    return {name: states[key] for name, key in submissions.items() if key in states}


class SlurmArrayLauncher:
    def __init__(self, folder: Path, settings: SlurmSettings, workdir: Path):
        self.folder = Path(folder)
        self.settings = settings
        self.workdir = workdir
        self.watched: dict[str, tuple[str, int]] = {}  # task name -> (job id, index) of its newest submission

    def submit(self, tasks: list[Task]) -> str:
        latest = latest_submissions(self.folder)
        active = still_held(latest)  # tasks of earlier submissions, still queued or running
        waiting = [t.name for t in tasks if t.name in active]
        new = [t for t in tasks if t.name not in active]
        self.watched = {name: latest[name] for name in waiting}
        note = f"; still queued or running from before: {', '.join(waiting)}" if waiting else ""
        if not new:
            return "nothing to submit" + note
        (self.folder / ARRAY_LOGS).mkdir(parents=True, exist_ok=True)
        script = self.folder / SCRIPT
        replace_text(script, render_array_script(new, self.folder, self.settings, self.workdir))
        job = sbatch_submit(script)
        jobs = read_jobs(self.folder)
        jobs[job] = [t.name for t in new]
        replace_text(self.folder / JOBS_FILE, json.dumps(jobs, indent=2) + "\n")
        self.watched.update({t.name: (job, index) for index, t in enumerate(new)})
        return (f"submitted Slurm job {job}: {len(new)} array tasks ({script}); follow it with "
                f"squeue -j {job} (sacct -j {job} where accounting is on){note}")

    def poll(self) -> dict[str, str]:
        states = squeue_states(sorted({job for job, _ in self.watched.values()}))
        return {name: states.get(key, ENDED) for name, key in self.watched.items()}

    def stop(self) -> None:
        """Ctrl-C in the command only stops the waiting: the array keeps running on the cluster."""
