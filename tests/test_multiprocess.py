"""Two processes under `accelerate launch` (CPU, gloo) make the same update as one process
with the same global batch."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.cpu_launch import ROOT, launch_cpu


def launch(processes: int, out: Path) -> dict:
    out.mkdir(parents=True)
    launch_cpu(processes, [str(ROOT / "tests" / "ddp_update_check.py"), str(out)])
    assert int((out / "world.txt").read_text()) == processes  # really that many processes
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
