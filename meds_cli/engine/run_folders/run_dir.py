"""The run folder: config snapshot, provenance, metrics.jsonl, checkpoints, resume.

runs/<time>-<algo>-<tag>/
  config.yaml        the fully resolved config (pass it back with --config to repeat the run)
  command.txt        the command line
  provenance.json    git commit, package versions, host
  metrics.jsonl      one JSON object per step
  resumes.jsonl      one row per resume: the step and the settings changed
  checkpoints/step_N/  see meds_cli/engine/run_folders/checkpoints.py (all data, no pickles; manifest.json last)
  .lock              held while a process trains in the folder (meds_cli/engine/run_folders/run_lock.py)
A checkpoint is written under a temporary name and renamed, so a kill never leaves half of one.
"""

from __future__ import annotations

import fnmatch
import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from meds_cli.core.errors import FULL_DISK_ERRNOS, UserError, os_error
from meds_cli.core.jsonl import append_rows, read_rows, rewrite_rows
from meds_cli.engine.run_folders.checkpoint_store import (
    all_steps,
    checkpoint_path,
    checkpoint_problem,
    require_checkpoint,
)
from meds_cli.engine.run_folders.run_lock import LOCK_NAME, RunLock

METRICS_FILE = "metrics.jsonl"
PACKAGES = ["torch", "transformers", "accelerate", "peft", "hdbscan", "datasets", "math-verify", "meds-rl"]


def new_run_dir(root: str, algo: str, tag: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"{stamp}-{algo}" + (f"-{tag}" if tag else "")
    path = Path(root) / name
    suffix = 1
    while path.exists():  # two runs started in the same second
        suffix += 1
        path = Path(root) / f"{name}-{suffix}"
    return path


def check_output_path(path: Path) -> None:
    """Refuse an --output that cannot become a run folder: a file, or a path through a file."""
    for place in [path, *path.parents]:
        if place.exists():
            if place.is_dir():
                return
            if place == path:
                raise UserError(f"--output '{path}' is a file, not a folder; choose another --output")
            raise UserError(f"--output '{path}' cannot be made: '{place}' is a file, not a folder")


def claim_run_dir(path: Path, lock: RunLock | None = None, prepared: tuple[str, ...] = ()) -> Path:
    """Create the run folder and take its lock; refuse one that already holds a run (nothing is
    overwritten) or that another process holds. The lock file itself does not count as content,
    nor do the files matching a `prepared` pattern: what a launcher put there before the run
    (a grid task's config.yaml and its log)."""
    check_output_path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if lock is not None:
            lock.acquire()
    except OSError as error:
        raise os_error(error, f"create the run folder '{path}'") from None
    if any(p.name != LOCK_NAME and not any(fnmatch.fnmatch(p.name, pattern) for pattern in prepared)
           for p in path.iterdir()):
        if lock is not None:
            lock.release()
        raise UserError(f"run folder '{path}' already holds files; continue it with --resume {path} "
                        "or choose another --output")
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
    that a resumed run's file reads like an uninterrupted one. A last line cut short by a kill is
    skipped by every reader (meds_cli/core/jsonl.py)."""

    def __init__(self, path: Path):
        self.path = path

    def append(self, row: dict) -> None:
        append_rows(self.path, [row])

    def rows(self) -> list[dict]:
        return read_rows(self.path)

    def truncate_after(self, step: int) -> None:
        rewrite_rows(self.path, [row for row in self.rows() if row.get("step", 0) <= step])


def metrics_rows(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (what every report reads)."""
    return MetricsLog(Path(run_dir) / METRICS_FILE).rows()


# ---------------------------------------------------------------- checkpoints (run_folders/checkpoint_store.py)


def list_checkpoints(run_dir: Path) -> list[int]:
    """Steps of the run's complete checkpoints (names and sizes checked), oldest first."""
    return [s for s in all_steps(run_dir) if checkpoint_problem(checkpoint_path(run_dir, s), deep=False) is None]


def interrupted_run_error(error: OSError, run_dir: Path, what: str | None = None) -> UserError:
    """One line for a run stopped by its storage (a full disk, a folder turned read-only): what
    could not be written, why, the checkpoint the run can resume from, and the command that does.
    `what`: 'checkpoint N', or None for the file the error names."""
    what = what or (f"'{error.filename}'" if error.filename else f"to the run folder '{run_dir}'")
    reason = error.strerror or str(error)
    if error.errno in FULL_DISK_ERRNOS:
        head, fix = f"disk full while writing {what} ({reason})", "free some space"
    else:
        where = f": {error.filename}" if error.filename and error.filename not in what else ""
        head, fix = f"could not write {what} ({reason}{where})", "fix that"
    steps = list_checkpoints(run_dir)
    resume = (f"the run can resume from checkpoint {steps[-1]}" if steps else
              "the run has no checkpoint yet, so a resume starts it over from step 0")
    return UserError(f"{head}; {resume}: {fix}, then run meds train --resume {run_dir}")


def find_checkpoint(run_dir: Path, step: int | None = None, say=lambda text: None) -> Path:
    """Checkpoint `step`, or the newest complete one (newer broken ones passed over with a
    message through `say`); a UserError when there is none to use."""
    return require_checkpoint(run_dir, step, say=say)


# The file `meds ablate` writes at the top of an ablation folder (its plan); its runs are the folders in it.
ABLATION_FILE = "tasks.json"


def resolve_run_dir(path: str) -> Path:
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise UserError(f"'{path}' is not a run folder (no such folder)")
    if (run_dir / ABLATION_FILE).is_file() and not (run_dir / "config.yaml").is_file():
        runs = sorted(p.name for p in run_dir.iterdir() if (p / "config.yaml").is_file())
        shown = ", ".join(runs[:4]) + (f" and {len(runs) - 4} more" if len(runs) > 4 else "")
        example = f" ({run_dir / runs[0]})" if runs else ""
        raise UserError(f"'{path}' is an ablation folder (meds ablate), not a run folder; its runs are the folders "
                        f"in it ({shown or 'none yet'}): give one of them{example}; `meds ablate --collect {path}` "
                        "reports them all side by side, evaluated as the ablation ran them")
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"'{path}' is not a run folder (no config.yaml in it); a run killed while its model was "
                        f"loading holds no run yet: start it again with --output {path}")
    return run_dir


def newest_run(root: str | Path = "runs") -> Path:
    """The run folder under `root` written to last (its metrics or config): what a command given
    no run folder works on, right after `meds train`."""
    root = Path(root)
    found = [p for p in root.iterdir() if (p / "config.yaml").is_file()] if root.is_dir() else []
    if not found:
        raise UserError(f"no run folder under '{root}' (a folder with a config.yaml); give a run folder")

    def last_written(run: Path) -> float:
        return max((run / name).stat().st_mtime for name in ("config.yaml", "metrics.jsonl") if (run / name).is_file())

    return max(found, key=lambda run: (last_written(run), run.name))
