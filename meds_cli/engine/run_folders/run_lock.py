"""One process per run folder: a lock held for the life of a run.

Two `meds train` writing one folder would interleave metrics and overwrite each other's
checkpoints, so the second one refuses at once. The lock is the file RUN/.lock:
- where the OS offers it (fcntl), an exclusive flock on that file: the kernel drops it when the
  holder exits, however it exits (kill -9 included), so a lock is never stale;
- elsewhere, the file's existence, with the holder's pid, host and process start time in it: a
  lock whose process is gone (or whose pid now belongs to a process that started later) is
  stale and taken over; a lock from another host is only trusted, as there is no way to check it.
The file names the holder either way, so the refusal says who holds the folder.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

from meds_cli.core.errors import UserError
from meds_cli.core.processes import process_alive, process_start_time

LOCK_NAME = ".lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None


def holder_info() -> dict:
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "process_start": process_start_time(pid),
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def holder_is_gone(info: dict) -> bool:
    """True when the process that wrote `info` no longer runs (on this host)."""
    if info.get("host") != socket.gethostname():
        return False
    pid = info.get("pid")
    if not isinstance(pid, int) or pid <= 0 or not process_alive(pid):
        return True
    started = info.get("process_start")
    now = process_start_time(pid)
    return started is not None and now is not None and now != started


def describe(info: dict) -> str:
    if not info:
        return "another process"
    return f"process {info.get('pid', '?')} on {info.get('host', '?')} (since {info.get('since', '?')})"


def read_holder(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


class RunLock:
    """`with RunLock(run_dir):` holds the folder for the block; a second holder gets a UserError."""

    def __init__(self, run_dir: Path, *, use_flock: bool = fcntl is not None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.use_flock = use_flock and fcntl is not None
        self._fd: int | None = None
        self._held = False

    def refusal(self, info: dict) -> UserError:
        return UserError(f"run folder '{self.run_dir}' is in use by {describe(info)}; wait for that run to end "
                         f"or stop it (two runs in one folder would overwrite each other's checkpoints)")

    def acquire(self) -> "RunLock":
        if self._held:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.use_flock and self._acquire_flock():
            return self
        self._acquire_file()
        return self

    def _acquire_flock(self) -> bool:
        """True when the flock is held; False when this filesystem has no flock (use the file)."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self.refusal(read_holder(self.path)) from None
            except OSError as error:
                os.close(fd)
                if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    return False
                raise
            # The holder before us unlinks the file as it lets go: if it did so while we
            # waited, our lock is on a file nobody else will open; start again.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                self._write_info()
                self._held = True
                return True
            os.close(fd)

    def _acquire_file(self) -> None:
        for _ in range(2):
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                info = read_holder(self.path)
                if not holder_is_gone(info) and info:
                    raise self.refusal(info) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            self._write_info()
            self._held = True
            return
        raise self.refusal(read_holder(self.path))

    def _write_info(self) -> None:
        data = (json.dumps(holder_info()) + "\n").encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        try:
            self.path.unlink(missing_ok=True)  # while still locked, so no one locks the old file
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._held

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class FolderLock(RunLock):
    """The same lock on another kind of folder (an eval's output, an ablation), its refusal
    saying what the folder is and why two writers cannot share it."""

    def __init__(self, folder: Path, what: str, why: str):
        super().__init__(folder)
        self.what, self.why = what, why

    def refusal(self, info: dict) -> UserError:
        return UserError(f"{self.what} '{self.run_dir}' is in use by {describe(info)}; wait for it to end or stop it "
                         f"({self.why})")
