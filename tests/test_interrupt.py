"""Ctrl-C during `meds train`: the step in progress finishes, a checkpoint is written, the
process exits with 130 and prints how to resume; the run then resumes from that checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from meds_cli.engine.run_folders.run_dir import MetricsLog, list_checkpoints

ROOT = Path(__file__).resolve().parent.parent


def test_ctrl_c_checkpoints_and_exits_cleanly(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "meds_cli", "train", "--model", "tiny-llama", "--task", "copy", "--algo", "grpo",
           "--steps", "500", "--output", str(run), "-q", "--set", "train.checkpoint_every=0",
           "--set", "rollout.max_new_tokens=2", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    steps = list_checkpoints(run)
    assert len(steps) == 1
    assert f"--resume {run}" in err
    assert MetricsLog(metrics).rows()[-1]["step"] == steps[0]
    assert not any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())
