"""The run folder: config snapshot, provenance, metrics.jsonl, checkpoints, resume.

runs/<time>-<algo>-<tag>/
  config.yaml        the fully resolved config (pass it back with --config to repeat the run)
  command.txt        the command line
  provenance.json    git commit, package versions, host
  metrics.jsonl      one JSON object per step
  checkpoints/step_N/  weights.safetensors (trainable weights), adapter/ (peft, for eval),
                     optimizer.pt, scheduler.pt, rng_<rank>.pt, algorithm.pt, state.json
A checkpoint is written under a temporary name and renamed, so a kill never leaves half of one.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from meds_cli.core.errors import UserError

PACKAGES = ["torch", "transformers", "accelerate", "peft", "hdbscan", "datasets", "math-verify", "meds"]


def new_run_dir(root: str, algo: str, tag: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{algo}" + (f"-{tag}" if tag else "")
    path = Path(root) / name
    suffix = 1
    while path.exists():  # two runs started in the same second
        suffix += 1
        path = Path(root) / f"{name}-{suffix}"
    return path


def claim_run_dir(path: Path) -> Path:
    """Create the run folder; refuse one that already holds a run (nothing is overwritten)."""
    if path.exists() and any(path.iterdir()):
        raise UserError(f"run folder '{path}' already holds files; continue it with --resume {path} or choose another --output")
    path.mkdir(parents=True, exist_ok=True)
    return path


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def write_provenance(run_dir: Path, argv: list[str]) -> None:
    (run_dir / "command.txt").write_text(" ".join(argv) + "\n")
    info = {"git_commit": git_commit(), "packages": package_versions(), "python": sys.version.split()[0],
            "platform": platform.platform(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (run_dir / "provenance.json").write_text(json.dumps(info, indent=2) + "\n")


class MetricsLog:
    """metrics.jsonl, one object per step; on resume, rows after the checkpoint are dropped so
    that a resumed run's file reads like an uninterrupted one."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        kept = [row for row in self.rows() if row.get("step", 0) <= step]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))


# ---------------------------------------------------------------- checkpoints


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step}"


def list_checkpoints(run_dir: Path) -> list[int]:
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    steps = []
    for child in folder.iterdir():
        if child.name.startswith("step_") and child.name[5:].isdigit() and (child / "state.json").is_file():
            steps.append(int(child.name[5:]))
    return sorted(steps)


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    steps = list_checkpoints(run_dir)
    if not steps:
        raise UserError(f"'{run_dir}' has no checkpoint (looked in {Path(run_dir) / 'checkpoints'})")
    if step is None:
        return checkpoint_dir(run_dir, steps[-1])
    if step not in steps:
        raise UserError(f"'{run_dir}' has no checkpoint at step {step}; available: {', '.join(map(str, steps))}")
    return checkpoint_dir(run_dir, step)


def temporary_checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f".step_{step}.tmp"


def begin_checkpoint(run_dir: Path, step: int) -> Path:
    """A fresh temporary folder to write checkpoint `step` into; publish it with finish_checkpoint."""
    tmp = temporary_checkpoint_dir(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def finish_checkpoint(tmp: Path, run_dir: Path, step: int) -> Path:
    final = checkpoint_dir(run_dir, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)  # atomic on one filesystem
    return final


def resolve_run_dir(path: str) -> Path:
    run_dir = Path(path)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"'{path}' is not a run folder (no config.yaml in it)")
    return run_dir
