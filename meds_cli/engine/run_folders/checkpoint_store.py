"""Which checkpoints of a run are whole, which one to resume from, and which old ones to delete.

A checkpoint folder (RUN/checkpoints/step_N) is complete when its manifest.json, written last,
lists every file with its size and sha256 and the files match. A folder without one was never
finished; a file missing, cut short or changed makes it unusable. Resume takes the newest
complete checkpoint and says which newer ones it passed over and why; `--step N` takes that one
or explains why not. Retention (`train.keep_checkpoints`) deletes older complete checkpoints
and any broken ones, never the newest complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Callable

from meds_cli.core.errors import UserError

MANIFEST = "manifest.json"
PREFIX = "step_"
TEMPORARY_SUFFIX = ".tmp"
_CHUNK = 1 << 20


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_path(run_dir: Path, step: int) -> Path:
    return checkpoints_root(run_dir) / f"{PREFIX}{step}"


def checkpoint_step(folder: Path) -> int | None:
    name = Path(folder).name
    digits = name[len(PREFIX):]
    return int(digits) if name.startswith(PREFIX) and digits.isdigit() else None


def all_steps(run_dir: Path) -> list[int]:
    """Steps of every checkpoint folder, complete or not, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(step for child in root.iterdir() if child.is_dir() and (step := checkpoint_step(child)) is not None)


def temporary_path(run_dir: Path, step: int) -> Path:
    """Where checkpoint `step` is written before it is published under its own name."""
    return checkpoints_root(run_dir) / f".{PREFIX}{step}{TEMPORARY_SUFFIX}"


def begin_checkpoint(run_dir: Path, step: int) -> Path:
    """A fresh temporary folder to write checkpoint `step` into; publish it with publish_checkpoint."""
    tmp = temporary_path(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def publish_checkpoint(tmp: Path, run_dir: Path, step: int) -> Path:
    """Rename the finished temporary folder to step_N (atomic on one filesystem) and make the
    rename durable."""
    final = checkpoint_path(run_dir, step)
    if final.exists():
        remove_checkpoint(final)
    os.replace(tmp, final)
    _sync_folder(final.parent)
    return final


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # no directory handles here (Windows): the rename is as durable as it gets
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the manifest


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST)


def file_digest(path: Path, *, sync: bool = False) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
        if sync:
            os.fsync(f.fileno())  # the data is on disk before the manifest says it is complete
    return digest.hexdigest()


def write_manifest(folder: Path, **extra) -> Path:
    """List every file of `folder` with size and sha256 in folder/manifest.json, as the last write
    of a checkpoint. `extra` (e.g. step=...) is recorded beside the files."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": file_digest(p, sync=True)}
             for p in _files(folder)}
    partial = folder / f".{MANIFEST}.partial"
    with partial.open("w") as f:
        json.dump({**extra, "files": files}, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, folder / MANIFEST)
    return folder / MANIFEST


def checkpoint_problem(folder: Path, *, deep: bool = True) -> str | None:
    """Why checkpoint `folder` cannot be used, or None when it is complete. `deep` compares
    checksums too (reads every byte); otherwise names and sizes only."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        entries = [(name, int(meta["bytes"]), str(meta["sha256"])) for name, meta in files.items()]
    except FileNotFoundError:
        return f"it has no {MANIFEST}, so it was never finished"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {MANIFEST} is damaged"
    for name, size, sha in entries:
        path = folder / name
        if not path.resolve().is_relative_to(folder.resolve()):
            return f"its {MANIFEST} names a file outside it ({name})"
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} is cut short ({actual} of {size} bytes)" if actual < size else \
                f"{name} has {actual} bytes, not {size}"
        if deep and file_digest(path) != sha:
            return f"{name} does not match its checksum"
    return None


# ---------------------------------------------------------------- choosing one


def find_usable_checkpoint(run_dir: Path, step: int | None = None, *,
                           say: Callable[[str], None] = lambda text: None) -> Path | None:
    """The checkpoint to resume from: `step` if given, else the newest complete one, passing over
    broken newer ones with a message through `say`. None when the run has no checkpoint folder
    at all; a UserError when it has some but none is usable, or `step` is missing or broken."""
    steps = all_steps(run_dir)
    root = checkpoints_root(run_dir)
    if step is not None:
        if step not in steps:
            have = ", ".join(map(str, steps)) or "none"
            raise UserError(f"'{run_dir}' has no checkpoint at step {step}; checkpoints: {have}")
        problem = checkpoint_problem(checkpoint_path(run_dir, step))
        if problem:
            usable = [s for s in steps
                      if s != step and checkpoint_problem(checkpoint_path(run_dir, s), deep=False) is None]
            hint = f"; complete checkpoints: {', '.join(map(str, usable))}" if usable else ""
            raise UserError(f"checkpoint {checkpoint_path(run_dir, step)} is unusable: {problem}{hint}")
        return checkpoint_path(run_dir, step)
    if not steps:
        return None
    problems: list[tuple[int, str]] = []
    for candidate in reversed(steps):
        folder = checkpoint_path(run_dir, candidate)
        problem = checkpoint_problem(folder)
        if problem is None:
            for older, text in problems:
                say(f"checkpoint {checkpoint_path(run_dir, older)} is unusable ({text}); using step {candidate}")
            return folder
        problems.append((candidate, problem))
    raise UserError(f"no usable checkpoint in {root} (" + "; ".join(f"step {s}: {text}" for s, text in problems)
                    + f"); to start the run over from step 0, delete {root}")


def require_checkpoint(run_dir: Path, step: int | None = None, *,
                       say: Callable[[str], None] = lambda text: None) -> Path:
    """Like find_usable_checkpoint, for readers that need one (eval, cluster-inspect)."""
    found = find_usable_checkpoint(run_dir, step, say=say)
    if found is None:
        raise UserError(f"'{run_dir}' has no checkpoint (looked in {checkpoints_root(run_dir)})")
    return found


# ---------------------------------------------------------------- retention


def remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint folder; its manifest goes first, so a kill halfway leaves an
    incomplete folder (never loaded, removed next time), not a complete-looking damaged one."""
    (Path(folder) / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def prune_checkpoints(run_dir: Path, keep: int, newest: int | None = None) -> list[Path]:
    """Keep the newest `keep` complete checkpoints (all of them when keep is 0) and delete the
    other checkpoint folders older than the newest complete one, broken ones and leftovers of
    interrupted writes included. Returns what was deleted.

    `newest`: the step just written. Checkpoints after it (a run resumed from an earlier step
    with --step) are left alone; the run overwrites them as it gets there."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    steps = [s for s in all_steps(run_dir) if newest is None or s <= newest]
    complete = [s for s in steps if checkpoint_problem(checkpoint_path(run_dir, s), deep=False) is None]
    if not complete:
        return []  # nothing is safe to delete while no checkpoint is whole
    kept = set(complete if keep == 0 else complete[-keep:])
    removed = [checkpoint_path(run_dir, s) for s in steps if s < complete[-1] and s not in kept]
    root = checkpoints_root(run_dir)
    removed += sorted(p for p in root.iterdir()
                      if p.is_dir() and p.name.startswith(".") and p.name.endswith(TEMPORARY_SUFFIX))
    for folder in removed:
        remove_checkpoint(folder)
    return removed
