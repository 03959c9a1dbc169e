"""Launch N real CPU processes under Accelerate for the multi-process tests.

`accelerate launch --cpu --num_processes 2` starts ONE process unless an mpirun hostfile is
configured (its simple launcher runs the script once), so a test built on it compares one
process with itself. The multi-GPU launcher (torch.distributed.run) starts N processes, and
ACCELERATE_USE_CPU=1 makes Accelerate join them in a gloo group on the CPU. Every script run
through here reports the world size it saw, and the tests check it.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from meds_cli.core.processes import parent_pid

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """The processes started by `pid`, their children and so on."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        children.setdefault(parent_pid(int(entry.name)), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def launch_cpu(processes: int, script_args: list[str], *, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `accelerate launch ... SCRIPT_ARGS` with `processes` CPU processes; fails the test on a
    non-zero exit, showing the end of stderr."""
    mode = ["--cpu"] if processes == 1 else ["--multi_gpu", "--main_process_port", str(free_port())]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *script_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as launcher:
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The workers too: torch.distributed.run starts each in its own session, and a hung
            # worker left running holds the output pipes open (and the test with them).
            for pid in [*descendants(launcher.pid), launcher.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            stdout, stderr = launcher.communicate()
            pytest.fail(f"the launch did not end within {timeout} s; its stderr ends:\n{stderr[-4000:]}")
    assert launcher.returncode == 0, stderr[-4000:]
    return subprocess.CompletedProcess(cmd, launcher.returncode, stdout, stderr)
