"""The run-folder lock: one holder at a time, released on exit, never stale after a kill -9."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meds_cli.core.errors import UserError
from meds_cli.core.processes import process_start_time
from meds_cli.engine.run_folders.run_lock import LOCK_NAME, RunLock, holder_is_gone

ROOT = Path(__file__).resolve().parent.parent
HOLD = """
import sys, time
from meds_cli.engine.run_folders.run_lock import RunLock
lock = RunLock(sys.argv[1], use_flock=sys.argv[2] == "flock").acquire()
print("held", flush=True)
time.sleep(120)
"""


def holder(run_dir: Path, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), mode], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_holder_is_refused_with_who_holds_it(tmp_path):
    with RunLock(tmp_path / "run") as first:
        assert first.held and (tmp_path / "run" / LOCK_NAME).is_file()
        with pytest.raises(UserError) as error:
            RunLock(tmp_path / "run").acquire()
        message = str(error.value)
        assert f"process {os.getpid()} on {socket.gethostname()}" in message and "\n" not in message
    assert not (tmp_path / "run" / LOCK_NAME).exists()  # released on exit
    with RunLock(tmp_path / "run"):
        pass


@pytest.mark.parametrize("mode", ["flock", "file"])
def test_a_lock_of_a_killed_process_is_taken_over(tmp_path, mode):
    run = tmp_path / "run"
    proc = holder(run, mode)
    try:
        with pytest.raises(UserError, match=f"process {proc.pid} "):
            RunLock(run, use_flock=mode == "flock").acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run / LOCK_NAME).is_file()  # a kill -9 leaves the file behind ...
    with RunLock(run, use_flock=mode == "flock") as lock:  # ... but not the lock
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert lock.held


def test_file_lock_staleness_rules(tmp_path):
    me = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": process_start_time(os.getpid())}
    assert not holder_is_gone(me)
    assert not holder_is_gone({**me, "host": "some-other-host"})  # cannot check another host: trusted
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert holder_is_gone({**me, "pid": int(done.stdout)})  # a finished process
    if me["process_start"] is not None:
        assert holder_is_gone({**me, "process_start": me["process_start"] - 1})  # pid reused by a later process
    assert holder_is_gone({"host": socket.gethostname(), "pid": "x"})


def test_file_mode_refuses_a_live_holder_and_takes_a_stale_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lock_file = run / LOCK_NAME
    lock_file.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "process_start": process_start_time(os.getpid()), "since": "now"}))
    with pytest.raises(UserError, match="in use by process"):
        RunLock(run, use_flock=False).acquire()
    lock_file.write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname()}))
    with RunLock(run, use_flock=False):
        assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    assert not lock_file.exists()


def test_flock_on_a_file_unlinked_meanwhile_is_retried(tmp_path, monkeypatch):
    """A holder unlinks the lock file as it lets go: a process that locked the old file just
    then must notice and lock the file that is there now, or two processes would both hold."""
    import fcntl

    from meds_cli.engine.run_folders import run_lock

    run = tmp_path / "run"
    run.mkdir()
    calls = []

    class ReleasedMeanwhile:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, flags):
            fcntl.flock(fd, flags)
            calls.append(fd)
            if len(calls) == 1:  # the previous holder's release lands between our open and our check
                (run / LOCK_NAME).unlink()

    monkeypatch.setattr(run_lock, "fcntl", ReleasedMeanwhile)
    lock = RunLock(run).acquire()
    assert len(calls) == 2
    assert os.fstat(lock._fd).st_ino == os.stat(run / LOCK_NAME).st_ino
    lock.release()


def test_a_lock_is_released_when_its_process_exits_normally(tmp_path):
    run = tmp_path / "run"
    code = f"from meds_cli.engine.run_folders.run_lock import RunLock\nRunLock({str(run)!r}).acquire()\n"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    start = time.time()
    with RunLock(run):
        assert time.time() - start < 5
