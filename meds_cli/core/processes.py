"""Other processes on this machine, as /proc and the kernel describe them: whether one still
runs, when it started, who started it. For the run lock (a holder that died), the cache (a
writer that died mid-write) and the tests' launcher (the workers of a hung launch)."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (field 3 of the line first), or None
    where unknown (no such process, not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count fields after its ')'.
    return stat[stat.rfind(")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux), or None where unknown.
    Tells a live process from an unrelated one that got the same pid later."""
    fields = stat_fields(pid)
    try:
        return int(fields[19])  # field 22 of the whole line
    except (TypeError, IndexError, ValueError):
        return None


def parent_pid(pid: int) -> int | None:
    fields = stat_fields(pid)
    try:
        return int(fields[1])  # field 4 of the whole line
    except (TypeError, IndexError, ValueError):
        return None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    except OSError:
        return False
    return True
