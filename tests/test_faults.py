"""kill -9 at random points of a real `meds train` (tiny model, copy task, a few steps), then
resume until done: the final weights, optimizer state and learning metrics equal those of a run
that was never interrupted, bit for bit.

Where each kill lands is drawn from a seeded generator: during start-up, or a random fraction of
a step after the k-th step the process logged, so kills hit model loading, sampling, updates and
checkpoint writes (a checkpoint every step, two kept). A run killed before it wrote config.yaml
holds no run yet: `--resume` says to start it again with --output, and that is what the loop
does. The default test kills three times; the slow one ten times.
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from meds_cli.app import app
from meds_cli.engine.run_folders import run_dir as runs
from meds_cli.engine.run_folders.checkpoint_store import checkpoint_path, checkpoint_step, find_usable_checkpoint
from meds_cli.engine.run_folders.state_codec import load_state
from meds_cli.engine.trainer import TIMING_KEYS

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def train_command(steps: int) -> list[str]:
    return [sys.executable, "-m", "meds_cli", "train", "--model", "tiny-llama", "--task", "copy", "--algo", "grpo",
            "--steps", str(steps), "-q", "--set", "rollout.max_new_tokens=3", "--set", "rollout.prompts_per_step=4",
            "--set", "rollout.group_size=4", "--set", "model.lora.rank=4", "--set", "optim.lr=0.01",
            "--set", "optim.warmup_steps=1", "--set", "optim.schedule=cosine", "--set", "train.checkpoint_every=1",
            "--set", "train.keep_checkpoints=2"]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(args: list[str], run: Path) -> tuple[float, float]:
    """Run to the end; returns (seconds until its first step was logged, seconds per step)."""
    t0 = time.perf_counter()
    proc = start(args)
    first = None
    while proc.poll() is None:
        if first is None and runs.metrics_rows(run):
            first = time.perf_counter() - t0
        time.sleep(0.02)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    total = time.perf_counter() - t0
    first = first or total
    return first, max(total - first, 0.1) / max(len(runs.metrics_rows(run)), 1)


def newest_step(rows: list[dict]) -> int:
    return max((row["step"] for row in rows), default=0)


def learning_rows(run: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in runs.metrics_rows(run)]


def assert_same_run(a: Path, b: Path, steps: int) -> None:
    wa, wb = (load_file(str(checkpoint_path(r, steps) / "weights.safetensors")) for r in (a, b))
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    oa, ob = (load_state(checkpoint_path(r, steps), "optimizer") for r in (a, b))
    for key in oa["state"]:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(oa["state"][key][field], ob["state"][key][field]), (key, field)
    assert oa["param_groups"] == ob["param_groups"]
    assert learning_rows(a) == learning_rows(b)
    assert [row["step"] for row in learning_rows(b)] == list(range(1, steps + 1))


def kill_somewhere(proc: subprocess.Popen, run: Path, rng: random.Random, steps: int, startup: float,
                   step_time: float) -> str:
    """kill -9 at a random point: during start-up, or a random fraction of a step after the k-th
    step this process logged (its checkpoint write, the next sampling or update)."""
    checkpoint = find_usable_checkpoint(run) if (run / "checkpoints").is_dir() else None
    resumed_from = checkpoint.name if checkpoint else None
    done = checkpoint_step(checkpoint) if checkpoint else 0
    k = rng.randint(0, min(2, steps - done))  # 0: during start-up; at most two steps on, so kills spread over the run
    stale = (run / "metrics.jsonl").read_bytes() if (run / "metrics.jsonl").is_file() else b""
    if k == 0:
        time.sleep(rng.uniform(0, 1.2) * startup)
    else:
        # Rows left from a killed process do not count: wait for this one's own step done + k.
        while proc.poll() is None:
            now = (run / "metrics.jsonl").read_bytes() if (run / "metrics.jsonl").is_file() else b""
            if now != stale and newest_step(runs.metrics_rows(run)) >= done + k:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 1.0) * step_time)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return f"from {resumed_from}: killed {'in start-up' if k == 0 else f'{k} step(s) in'} (exit {proc.returncode})"


def killed_run(run: Path, steps: int, kills: int, startup: float, step_time: float, seed: int) -> list[str]:
    """Start, kill -9 at a random point, continue (resume, or start again when the folder holds
    no run yet) `kills` times; then run to the end. Returns where each kill landed."""
    rng = random.Random(seed)
    log = []
    for _ in range(kills):
        if (run / "config.yaml").is_file():
            args = [*train_command(steps), "--resume", str(run)]
        else:
            if run.exists():  # what --resume says about such a folder, and its advice is what we do
                result = CliRunner().invoke(app, ["train", "--resume", str(run)])
                assert result.exit_code == 2 and f"start it again with --output {run}" in result.output, result.output
            args = [*train_command(steps), "--output", str(run)]
        log.append(kill_somewhere(start(args), run, rng, steps, startup, step_time))
    finish([*train_command(steps), "--resume" if (run / "config.yaml").is_file() else "--output", str(run)], run)
    return log


@pytest.mark.parametrize("kills, steps, seed", [
    pytest.param(3, 4, 0),
    pytest.param(10, 8, 1, marks=pytest.mark.slow),
])
def test_kill_9_at_random_points_then_resume_reaches_the_same_weights(tmp_path, kills, steps, seed):
    straight = tmp_path / "straight"
    startup, step_time = finish([*train_command(steps), "--output", str(straight)], straight)
    log = killed_run(tmp_path / "killed", steps, kills, startup, step_time, seed)
    print("\n".join(log))
    assert_same_run(straight, tmp_path / "killed", steps)
    leftovers = [p.name for p in (tmp_path / "killed" / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == [], log  # the last run cleaned up after the killed ones
    assert not (tmp_path / "killed" / ".lock").exists()
