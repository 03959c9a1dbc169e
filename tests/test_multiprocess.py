"""Two processes under `accelerate launch` (CPU, gloo) make the same update as one process
with the same global batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, out: Path) -> dict:
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(ROOT / "tests" / "ddp_update_check.py"), str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_file(str(out / "weights.safetensors"))


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    one = launch(1, tmp_path / "one")
    two = launch(2, tmp_path / "two")
    initial = None
    assert one.keys() == two.keys() and one
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-6, rtol=1e-4), name
    # the update did something, and the second PPO epoch saw a ratio different from 1
    lora_b = [n for n in one if "lora_B" in n]
    assert any(one[n].abs().max() > 0 for n in lora_b), initial
    assert float((tmp_path / "one" / "ratio.txt").read_text()) != 1.0
