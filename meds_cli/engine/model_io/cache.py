"""The meds cache: model folders made once and reused (dequantized GGUF models, checkpoints merged
into their base model for vLLM).

A folder is written under a private temporary name and renamed into place, so an interrupted
or failed write (a full disk, Ctrl-C) never leaves something a later load would take for a whole
copy, and what it had written is removed at once instead of filling the disk run after run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

from meds_cli.core.errors import UserError, os_error, storage_error
from meds_cli.core.processes import process_alive

PARTIAL = ".partial-"  # a folder being written: NAME.partial-HOST-PID
COMPLETE_MARK = "config.json"  # written by every model folder's save_pretrained


def cache_dir() -> Path:
    # An empty MEDS_CACHE (a shell's `export MEDS_CACHE=`) means unset, not the current folder.
    return Path(os.environ.get("MEDS_CACHE") or Path.home() / ".cache" / "meds")


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARK).is_file()


def reuse(folder: Path) -> bool:
    """Whether `folder` is a whole cached copy; if so it is marked as used (its mtime), which
    decides what `publish_folder(keep=...)` keeps."""
    if not is_complete(folder):
        return False
    try:
        os.utime(folder)
    except OSError:  # a read-only cache is still read
        pass
    return True


def _writer_tag() -> str:
    # The host too: a cache in a home folder shared by a cluster's nodes holds other machines'
    # writers, whose process ids mean nothing here.
    return f"{socket.gethostname()}-{os.getpid()}"


def remove_abandoned(folder: Path) -> None:
    """Remove the temporary folders of this machine's writers that died mid-write (killed: no
    cleanup ran)."""
    if not folder.is_dir():
        return
    host = socket.gethostname()
    for path in folder.glob(f"*{PARTIAL}*"):
        writer_host, _, pid = path.name.rsplit(PARTIAL, 1)[1].rpartition("-")
        if writer_host == host and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def publish_folder(target: Path, write: Callable[[Path], None], keep: int | None = None) -> Path:
    """`target`, written by `write(folder)` into a temporary folder and renamed into place; with
    `keep`, only the `keep` most recently used whole copies beside it are kept.

    Two processes writing the same target at once both succeed: the first rename wins and the
    other's copy is dropped. A full disk or a read-only cache is one line naming the cache folder
    and MEDS_CACHE."""
    remove_abandoned(target.parent)
    partial = target.with_name(f"{target.name}{PARTIAL}{_writer_tag()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write(partial)
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        failed = storage_error(error)
        if failed is None:
            raise
        raise UserError(f"{os_error(failed, f'write to the meds cache in {target.parent}')}; "
                        f"MEDS_CACHE sets where the cache is") from None
    try:
        partial.rename(target)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not is_complete(target):
            raise
    if keep is not None:
        _keep_newest(target, keep)
    return target


def _keep_newest(target: Path, keep: int) -> None:
    # Not the folders being written: config.json comes first in them, before the weights.
    copies = [path for path in target.parent.iterdir()
              if path != target and PARTIAL not in path.name and is_complete(path)]
    copies.sort(key=lambda path: path.stat().st_mtime, reverse=True)
    for path in copies[max(keep - 1, 0):]:
        shutil.rmtree(path, ignore_errors=True)


def is_hex_key(text: str, length: int) -> bool:
    """Whether `text` is a key of `length` lowercase hex digits, as this cache names things."""
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


def file_digest(path: Path) -> str:
    """A hash of the file's bytes, remembered per (path, size, mtime) in the cache so that a load
    reads a large file once, and files with the same bytes anywhere (a reinstall, a fresh clone's
    venv) share one cached copy."""
    stat = path.stat()
    where = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    memo = cache_dir() / "digests" / hashlib.sha256(where.encode()).hexdigest()[:32]
    try:
        known = memo.read_text().strip()
        if is_hex_key(known, 32):  # not one cut short by a writer that died
            return known
    except OSError:
        pass
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    known = digest.hexdigest()
    try:  # a read-only cache only costs the hash next time
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(known)
    except OSError:
        pass
    return known
