"""The two launchers of one machine: in this process, one task after another (today's `meds
ablate`), and N task processes at once (`--jobs N`), each with its share of the CPU threads and,
where there are GPUs, its own GPU (CUDA_VISIBLE_DEVICES), its output in <task>/task.log."""

from __future__ import annotations

import os
import subprocess
from typing import Callable

from meds_cli.core.cpu_budget import cores_available
from meds_cli.core.errors import UserError
from meds_cli.engine.launchers.tasks import ENDED, QUEUED, RUNNING, Task

TASK_LOG = "task.log"


class InProcessLauncher:
    """Runs each task by calling `run(task)` here, one after another; submit returns when all
    have run. A Ctrl-C stops the grid (the folders keep what was done)."""

    def __init__(self, run: Callable[[Task], None]):
        self.run = run
        self.tasks: list[Task] = []

    def submit(self, tasks: list[Task]) -> str:
        self.tasks = list(tasks)
        for task in tasks:
            self.run(task)
        return f"ran {len(tasks)} tasks in this process"

    def poll(self) -> dict[str, str]:
        return {task.name: ENDED for task in self.tasks}

    def stop(self) -> None:
        """Nothing runs beside the command: the Ctrl-C already stopped the task."""


def thread_share(jobs: int, cores: int) -> int:
    """CPU threads of each of `jobs` tasks sharing `cores` (at least 1)."""
    return max(1, cores // jobs)


def task_environment(slot: int, jobs: int, cores: int, gpus: int, base: dict) -> dict:
    """The environment of the task in `slot` (0..jobs-1): its thread share, and with GPUs, one of
    them (slot modulo the GPU count, so 8 slots on 8 GPUs get one each)."""
    env = {**base, "OMP_NUM_THREADS": str(thread_share(jobs, cores))}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(slot % gpus)
    return env


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class ProcessLauncher:
    """Runs up to `jobs` task processes at once on this machine; poll starts the next queued
    task in a slot that freed. A task that fails ends (its error in its folder); the others go on."""

    def __init__(self, jobs: int):
        if jobs < 1:
            raise UserError(f"--jobs {jobs}: give the number of tasks to run at once, 1 or more")
        self.jobs = jobs
        self.cores = cores_available()
        self.gpus = visible_gpus()
        self.queued: list[Task] = []
        self.running: dict[int, tuple[Task, subprocess.Popen]] = {}  # slot -> task
        self.ended: list[Task] = []

    def submit(self, tasks: list[Task]) -> str:
        self.queued = list(tasks)
        # More slots than tasks would only be looped over (and shrink each task's thread share): as many as tasks.
        self.jobs = max(1, min(self.jobs, len(tasks)))
        self._fill_slots()
        gpus = f", one GPU each of {self.gpus}" if self.gpus else ""
        return (f"running {len(tasks)} tasks, {self.jobs} at once on this machine "
                f"({thread_share(self.jobs, self.cores)} CPU threads each{gpus}); logs: <task>/{TASK_LOG}")

    def _fill_slots(self) -> None:
        for slot in range(self.jobs):
            if slot in self.running or not self.queued:
                continue
            task = self.queued.pop(0)
            env = task_environment(slot, self.jobs, self.cores, self.gpus, dict(os.environ))
            with open(task.folder / TASK_LOG, "ab") as log:
                process = subprocess.Popen(task.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                           stdin=subprocess.DEVNULL)
            self.running[slot] = (task, process)

    def poll(self) -> dict[str, str]:
        for slot, (task, process) in list(self.running.items()):
            if process.poll() is not None:
                self.ended.append(task)
                del self.running[slot]
        self._fill_slots()
        states = {task.name: ENDED for task in self.ended}
        states.update({task.name: RUNNING for task, _ in self.running.values()})
        states.update({task.name: QUEUED for task in self.queued})
        return states

    def stop(self) -> None:
        """Stop the running tasks (Ctrl-C in the command): each resumes from its checkpoint next time."""
        for _, process in self.running.values():
            process.terminate()
        for _, process in self.running.values():
            process.wait()
