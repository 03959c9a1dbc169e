"""Running untrusted generated programs: one sandboxed process per program, a thread pool over them.

Each program gets a fresh temporary working directory (removed afterwards), a scrubbed
environment, /dev/null or a file as stdin, stdout/stderr captured to files capped by
RLIMIT_FSIZE, and resource limits (CPU time, address space, file size, processes, open files).
The wall clock is enforced by the parent, which kills the whole process group.

Two isolation levels, probed once per process (`isolation_mode()`):
- 'netns' (root with util-linux `unshare` and `setpriv`): the program runs in new network and
  PID namespaces under an unprivileged uid/gid of its own with no_new_privs. No network exists, it cannot
  signal or see processes outside, RLIMIT_NPROC is enforced (it is not for root), it cannot
  write where other users may not, and when its PID namespace's init exits the kernel kills
  everything it started, escaped process groups included.
- 'sockets-disabled' (anything else): same user as the harness, socket creation disabled
  inside the child by the launcher, process-group kill. Weaker: say so when reporting results.

Outcome classes (`ProgramResult.outcome`): 'passed' (exited 0), the exception type name the
program died of ('SyntaxError', 'TypeError', ..., 'SystemExit' for a non-zero exit),
'Timeout', 'MemoryLimit' (MemoryError or address space exhausted), 'Killed' (any other
signal, output over the size limit included). Graders add 'WrongAnswer'. The exception type
is written by the launcher to a side file, never guessed from stderr.

This file is also the launcher: the child runs `python -S -s sandbox.py '<json config>'`, so
only the standard library is imported at module level.
"""

import json
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass, field

# Each concurrently running sandbox gets its own uid (no passwd entry needed): RLIMIT_NPROC
# counts per uid, so a fork bomb in one cannot starve its neighbours, and none can write into
# another's work dir. Harness process P uses uids BASE + P * UIDS_PER_PROCESS + slot, unique
# among the harnesses alive on the machine since their pids are (pid_max <= 2**22).
SANDBOX_UID_BASE = 990_000
UIDS_PER_PROCESS = 256
OUTPUT_CAP_BYTES = 64 * 1024  # what ProgramResult keeps of stdout / stderr
FILE_LIMIT_BYTES = 32 * 1024 * 1024  # RLIMIT_FSIZE: bounds stdout, stderr and any file written
MAX_PROCESSES = 64  # RLIMIT_NPROC of each sandbox uid
MAX_OPEN_FILES = 64
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 2048
_STATUS_FILE = ".sandbox_status"
_PROGRAM_FILE = "main.py"
_SIGNAL_OUTCOMES = {signal.SIGXCPU: "Timeout"}
_MEMORY_HINTS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")


@dataclass
class ProgramResult:
    outcome: str
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    # Files the caller asked for by name (`collect`), read back from the work dir, capped.
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Job:
    """Arguments of one `run_program` call, for `run_many`."""

    source: str
    stdin: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    collect: tuple[str, ...] = ()
    output_cap: int = OUTPUT_CAP_BYTES


# ----------------------------------------------------------------------------------------------
# The launcher: runs inside the child, sets limits, then executes the program in-process.
# ----------------------------------------------------------------------------------------------


def _set_limits(config: dict) -> None:
    cpu = int(config["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (config["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config["processes"]:
        resource.setrlimit(resource.RLIMIT_NPROC, (config["processes"],) * 2)


def _disable_sockets() -> None:
    """Best-effort network block for the fallback mode: every way to make a socket raises."""
    import _socket
    import socket

    def refuse(*args, **kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    for module in (socket, _socket):
        for name in ("socket", "socketpair", "fromfd", "create_connection", "create_server"):
            if hasattr(module, name):
                setattr(module, name, refuse)


def _write_status(text: str) -> None:
    try:
        # os.open and os.write held from the start: the program may have disabled open()
        # and co. (the code graders do, as EvalPlus does) before it fails.
        fd = _OS_OPEN(_STATUS_ABSPATH, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _OS_WRITE(fd, (text + "\n").encode())
        finally:
            _OS_CLOSE(fd)
    except (OSError, TypeError):
        pass  # a full disk or a program that deleted its dir loses the detail, not the run


def _exit_code(exit: SystemExit) -> int:
    if exit.code is None:
        return 0
    return exit.code if isinstance(exit.code, int) else 1


def _run_user_program(path: str) -> int:
    """Execute the program as __main__; record the type of the exception that ends it."""
    import types

    main = types.ModuleType("__main__")
    main.__file__ = path
    sys.modules["__main__"] = main
    try:
        with open(path, encoding="utf-8") as handle:
            code = compile(handle.read(), path, "exec")
        exec(code, main.__dict__)
    except SystemExit as exit:
        code = _exit_code(exit)
        if code:
            _write_status("exception SystemExit")
        return code
    except BaseException as error:  # the program's failure is the result, whatever it is
        _write_status(f"exception {type(error).__name__}")
        try:
            import traceback

            traceback.print_exception(error)
        except BaseException:
            pass  # no memory left to format it: the status line already says what happened
        return 1
    return 0


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(code)


def _reap_as_init(child: int) -> int:
    """PID 1 of the namespace: wait for the program, pass on its exit status.

    The program must not be PID 1 itself: the kernel drops default-action signals it sends
    to itself or raises by exceeding RLIMIT_FSIZE, so it could never be killed by them."""
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    if os.WIFSIGNALED(status):
        _write_status(f"signal {os.WTERMSIG(status)}")
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _launch(config: dict) -> None:
    global _STATUS_ABSPATH
    _STATUS_ABSPATH = os.path.abspath(_STATUS_FILE)
    _set_limits(config)
    # Python ignores SIGXFSZ (to raise OSError instead); a program over the file-size limit,
    # a flood of output included, is to be stopped, not left to catch the error and go on.
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    if os.getpid() == 1:
        child = os.fork()
        if child:
            _flush_and_exit(_reap_as_init(child))
    sys.path.extend(config["site_packages"])
    if config["block_sockets"]:
        _disable_sockets()
    sys.argv = [_PROGRAM_FILE]
    _flush_and_exit(_run_user_program(os.path.abspath(_PROGRAM_FILE)))


_STATUS_ABSPATH = _STATUS_FILE
_OS_OPEN, _OS_WRITE, _OS_CLOSE = os.open, os.write, os.close


if __name__ == "__main__":
    _launch(json.loads(sys.argv[1]))


# ----------------------------------------------------------------------------------------------
# The parent side: isolation probe, one program, many programs.
# ----------------------------------------------------------------------------------------------

import functools  # noqa: E402  (parent-only imports: the launcher above starts faster without them)
import logging  # noqa: E402
import select  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Iterable, Sequence  # noqa: E402

log = logging.getLogger(__name__)
_LOGGED = threading.Event()


class _UidPool:
    """Hands out a free sandbox uid of this process's range; a uid is free again once its
    program (and, by the PID namespace, everything the program started) is gone."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid, self._free = None, []

    def acquire(self) -> int:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked copy of the harness
                self._pid = os.getpid()
                base = SANDBOX_UID_BASE + self._pid * UIDS_PER_PROCESS
                self._free = list(range(base + UIDS_PER_PROCESS - 1, base - 1, -1))
            if not self._free:
                raise RuntimeError(f"more than {UIDS_PER_PROCESS} sandboxes at once in one process")
            return self._free.pop()

    def release(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


_UIDS = _UidPool()


def _namespace_prefix(uid: int) -> list[str]:
    return [
        "unshare", "--net", "--pid", "--fork", "--kill-child",
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
    ]  # fmt: skip


@functools.cache
def isolation_mode() -> str:
    """'netns' when namespaces and a uid switch work here (root + util-linux), else
    'sockets-disabled'. Probed once by running `true` inside the namespaces."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
        return "sockets-disabled"
    try:
        probe = subprocess.run(_namespace_prefix(SANDBOX_UID_BASE) + ["true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "sockets-disabled"
    return "netns" if probe.returncode == 0 else "sockets-disabled"


def _log_mode_once() -> None:
    if not _LOGGED.is_set():
        _LOGGED.set()
        log.info("sandbox network isolation: %s", isolation_mode())


@functools.cache
def _base_dir() -> str:
    """Root of all work dirs: only traversable by others, so one sandbox cannot list the
    (same-uid) work dirs of the sandboxes running beside it."""
    base = tempfile.mkdtemp(prefix="meds-sandbox-")
    os.chmod(base, 0o711)
    return base


def _make_workdir(source: str, stdin: str | None, uid: int) -> str:
    workdir = tempfile.mkdtemp(dir=_base_dir())
    with open(os.path.join(workdir, _PROGRAM_FILE), "w", encoding="utf-8") as handle:
        handle.write(source)
    os.chmod(os.path.join(workdir, _PROGRAM_FILE), 0o644)
    if stdin is not None:
        with open(os.path.join(workdir, ".stdin"), "w", encoding="utf-8") as handle:
            handle.write(stdin)
    if isolation_mode() == "netns":
        os.chown(workdir, uid, uid)
    return workdir


def _child_env(workdir: str) -> dict[str, str]:
    """A fresh environment: nothing of the parent's leaks in (keys, tokens, proxies)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1",  # the launcher's folder stays off sys.path
        # Fixed string hashing: the order of a set of strings (and so of a tuple built from
        # one) must be the same in the run that made the expected output and in the graded one.
        "PYTHONHASHSEED": "0",
        # BLAS pools would spend the process limit on threads.
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


@functools.cache
def _site_packages() -> list[str]:
    """The harness interpreter's site-packages folders (numpy and co. for the programs)."""
    import site

    return [path for path in site.getsitepackages() if os.path.isdir(path)]


def _command(timeout_s: float, memory_mb: int, uid: int) -> list[str]:
    netns = isolation_mode() == "netns"
    config = {
        "cpu_s": int(timeout_s) + 1,
        "memory_bytes": memory_mb * 1024 * 1024,
        "file_bytes": FILE_LIMIT_BYTES,
        "open_files": MAX_OPEN_FILES,
        # Without a uid switch RLIMIT_NPROC would count (and starve) the harness's own user.
        "processes": MAX_PROCESSES if netns else 0,
        "block_sockets": not netns,
        "site_packages": _site_packages(),
    }
    # -S: `site` runs the venv's .pth hooks (an editable install's finder alone is tens of ms
    # of imports); the launcher puts the site-packages folders on sys.path itself. Not -I: it
    # would ignore PYTHONHASHSEED, and the environment is ours in full anyway.
    launcher = [sys.executable, "-S", "-s", os.path.abspath(__file__), json.dumps(config)]
    return (_namespace_prefix(uid) if netns else []) + launcher


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait(process: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for the process to exit; False when the time ran out first.

    A pidfd wakes us the moment it exits; Popen.wait(timeout) polls with sleeps of up to
    50 ms, which would dominate the cost of a short program."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        try:
            process.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(max(timeout_s, 0) * 1000):
            return False
    finally:
        os.close(pidfd)
    process.wait()
    return True


def _stop(process: subprocess.Popen) -> None:
    """Kill a program that ran out of time, everything it started included.

    In 'netns' mode the namespace's init is killed first, so that `unshare` outlives it and
    reaps it (the kernel then kills the rest of the namespace); killing the whole group at
    once would orphan the init to PID 1 of the machine as a zombie that counts against the
    sandbox uid's process limit until someone reaps it."""
    try:
        with open(f"/proc/{process.pid}/task/{process.pid}/children") as handle:
            children = [int(pid) for pid in handle.read().split()]
    except OSError:
        children = []
    for child in children:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if children:
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(process.pid)
    process.wait()


def _read_capped(path: str, cap: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(cap)
    except OSError:
        return b""


def _status(workdir: str) -> tuple[str | None, int | None]:
    """(exception type name, fatal signal number) recorded by the launcher, if any."""
    exception, signum = None, None
    for line in _read_capped(os.path.join(workdir, _STATUS_FILE), 4096).decode(errors="replace").splitlines():
        kind, _, value = line.partition(" ")
        if kind == "exception" and value.isidentifier():
            exception = exception or value
        elif kind == "signal" and value.isdigit():
            signum = int(value)
    return exception, signum


def classify(
    returncode: int, exception: str | None, signum: int | None, timed_out: bool, stderr: str
) -> str:
    """The outcome class of a finished program (see the module docstring)."""
    if timed_out:
        return "Timeout"
    if signum is None and returncode < 0:
        signum = -returncode
    if signum is not None:
        if signum in _SIGNAL_OUTCOMES:
            return _SIGNAL_OUTCOMES[signum]
        if signum in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS) and any(
            hint in stderr for hint in _MEMORY_HINTS
        ):
            return "MemoryLimit"  # the allocator failed somewhere Python could not raise
        return "Killed"
    if exception == "MemoryError":
        return "MemoryLimit"
    if exception:
        return exception
    return "passed" if returncode == 0 else "SystemExit"


def _spawn(command: list[str], workdir: str, stdin_file, stdout, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=workdir,
        env=_child_env(workdir),
        stdin=stdin_file,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # its own process group, killed as a whole
        close_fds=True,
    )


def run_program(
    source: str,
    stdin: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    collect: Sequence[str] = (),
    output_cap: int = OUTPUT_CAP_BYTES,
) -> ProgramResult:
    """Run one Python program in the sandbox and classify how it ended.

    `collect` names files the program writes in its work dir to return in `files` (capped
    by RLIMIT_FSIZE); `output_cap` is how much of stdout/stderr is kept."""
    _log_mode_once()
    uid = _UIDS.acquire()
    try:
        return _run_in_workdir(source, stdin, timeout_s, memory_mb, collect, output_cap, uid)
    finally:
        _UIDS.release(uid)


def _run_in_workdir(source, stdin, timeout_s, memory_mb, collect, output_cap, uid) -> ProgramResult:
    workdir = _make_workdir(source, stdin, uid)
    try:
        out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
        stdin_path = os.path.join(workdir, ".stdin") if stdin is not None else os.devnull
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(stdin_path, "rb") as inp:
            start = time.monotonic()
            process = _spawn(_command(timeout_s, memory_mb, uid), workdir, inp, out, err)
            timed_out = not _wait(process, timeout_s)
            if timed_out:
                _stop(process)
            duration = time.monotonic() - start
            _kill_group(process.pid)  # background children left by a program that exited
        stdout = _read_capped(out_path, output_cap).decode(errors="replace")
        stderr = _read_capped(err_path, output_cap).decode(errors="replace")
        exception, signum = _status(workdir)
        outcome = classify(process.returncode, exception, signum, timed_out, stderr)
        files = {name: _read_capped(os.path.join(workdir, name), FILE_LIMIT_BYTES) for name in collect}
        return ProgramResult(outcome, process.returncode, stdout, stderr, duration, files)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_job(job: Job) -> ProgramResult:
    try:
        return run_program(job.source, job.stdin, job.timeout_s, job.memory_mb, job.collect, job.output_cap)
    except OSError:
        # A transient harness-side failure (fork EAGAIN, EMFILE): retry once; a second one is
        # a problem of this machine, not of the program, and must surface.
        time.sleep(0.5)
        return run_program(job.source, job.stdin, job.timeout_s, job.memory_mb, job.collect, job.output_cap)


def run_many(jobs: Iterable[Job], workers: int | None = None) -> list[ProgramResult]:
    """Run jobs in parallel (threads, each waiting on its own sandboxed process); results in
    the order of jobs. A program's failure is its result; it never raises here."""
    jobs = list(jobs)
    if not workers:
        # Imported here: the sandboxed child runs this file alone, where the project is not importable.
        from meds_cli.core.cpu_budget import worker_count

        workers = worker_count()
    if workers == 1 or len(jobs) <= 1:
        return [_run_job(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(_run_job, jobs))
