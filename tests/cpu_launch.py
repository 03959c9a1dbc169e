"""Launch N real CPU processes under Accelerate for the multi-process tests.

`accelerate launch --cpu --num_processes 2` starts ONE process unless an mpirun hostfile is
configured (its simple launcher runs the script once), so a test built on it compares one
process with itself. The multi-GPU launcher (torch.distributed.run) starts N processes, and
ACCELERATE_USE_CPU=1 makes Accelerate join them in a gloo group on the CPU. Every script run
through here reports the world size it saw, and the tests check it.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_cpu(processes: int, script_args: list[str], *, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `accelerate launch ... SCRIPT_ARGS` with `processes` CPU processes; fails the test on a
    non-zero exit, showing the end of stderr."""
    mode = ["--cpu"] if processes == 1 else ["--multi_gpu", "--main_process_port", str(free_port())]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", *script_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result
