"""A task of a grid and the interface every launcher keeps (submit, poll, collect)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

QUEUED, RUNNING, ENDED = "queued", "running", "ended"  # what a launcher knows of a task; done or failed
# is read from the task's folder (ablate_task.task_outcome), whichever launcher ran it


@dataclass
class Task:
    name: str  # the variant's folder name, unique in the grid
    folder: Path  # <grid>/<name>: the resolved config.yaml, the run, its logs
    command: list[str] = field(default_factory=list)  # the process that runs it: train, then evaluate


class Launcher(Protocol):
    def submit(self, tasks: list[Task]) -> str:
        """Start (or queue) the tasks; returns a line saying where they run and how to follow them."""

    def poll(self) -> dict[str, str]:
        """task name -> QUEUED, RUNNING or ENDED, for the tasks submitted."""

    def stop(self) -> None:
        """Ctrl-C in the command: what becomes of the tasks still running (the launcher says)."""


def collect(launcher: Launcher, on_progress: Callable[[int, int], None] | None = None,
            every_s: float = 2.0) -> None:
    """Wait until every submitted task has ended; on_progress(ended, total) after each poll."""
    while True:
        states = launcher.poll()
        ended = sum(state == ENDED for state in states.values())
        if on_progress is not None:
            on_progress(ended, len(states))
        if ended == len(states):
            return
        time.sleep(every_s)
