"""The sandbox contains hostile programs, classifies how programs end, and keeps running."""

import os
import signal
import socket
import subprocess
import textwrap

import pytest

from benchmarks.sandbox import (
    MAX_PROCESSES,
    SANDBOX_UID_BASE,
    Job,
    classify,
    isolation_mode,
    run_many,
    run_program,
)

netns_only = pytest.mark.skipif(
    isolation_mode() != "netns", reason="needs root + unshare/setpriv (uid switch, namespaces)"
)


def run(source: str, **kwargs):
    return run_program(textwrap.dedent(source), **kwargs)


def processes_of(uid: int) -> list[str]:
    """Processes owned by uid still alive (zombies included)."""
    assert uid >= SANDBOX_UID_BASE
    listing = subprocess.run(["ps", "-eo", "uid=,pid=,stat=,cmd="], capture_output=True, text=True).stdout
    return [line for line in listing.splitlines() if int(line.split()[0]) == uid]


def test_isolation_mode_is_known():
    assert isolation_mode() in ("netns", "sockets-disabled")


def test_passing_program_output_and_stdin():
    result = run("print(input()[::-1])", stdin="abc\n")
    assert (result.outcome, result.exit_code, result.stdout) == ("passed", 0, "cba\n")
    assert result.duration_s > 0


def test_stdin_is_closed_by_default():
    assert run("input()").outcome == "EOFError"


@pytest.mark.parametrize(
    "source, outcome",
    [
        ("def f(:\n    pass", "SyntaxError"),
        ("1 + 'a'", "TypeError"),
        ("1 / 0", "ZeroDivisionError"),
        ("[][1]", "IndexError"),
        ("{}['k']", "KeyError"),
        ("undefined_name", "NameError"),
        ("import no_such_module_xyz", "ModuleNotFoundError"),
        ("assert False", "AssertionError"),
        ("def f(): f()\nf()", "RecursionError"),
        ("class Custom(Exception): pass\nraise Custom()", "Custom"),
        ("import sys; sys.exit(3)", "SystemExit"),
        ("import sys; sys.exit(0)", "passed"),
    ],
)
def test_exception_types_are_reported_exactly(source, outcome):
    assert run(source).outcome == outcome


def test_exception_type_does_not_come_from_stderr_text():
    result = run("import sys; sys.stderr.write('Traceback...\\nZeroDivisionError: no\\n')")
    assert result.outcome == "passed"


def test_infinite_loop_times_out():
    result = run("while True: pass", timeout_s=1)
    assert result.outcome == "Timeout"
    assert result.duration_s < 5


def test_huge_allocation_is_a_memory_limit():
    result = run("x = bytearray(20 * 1024**3)", memory_mb=512)
    assert result.outcome == "MemoryLimit"


def test_killed_by_a_signal():
    assert run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)").outcome == "Killed"
    assert run("import ctypes; ctypes.string_at(0)").outcome == "Killed"  # segfault


def test_printing_a_gigabyte_is_capped_and_stopped():
    result = run("import sys\nwhile True:\n    sys.stdout.write('x' * 1_000_000)", timeout_s=20)
    assert result.outcome == "Killed"
    assert len(result.stdout) <= 64 * 1024
    assert result.duration_s < 10


def test_parent_environment_does_not_leak(monkeypatch):
    monkeypatch.setenv("MEDS_TEST_SECRET", "hunter2")
    result = run("import os; print(os.environ.get('MEDS_TEST_SECRET')); print(sorted(os.environ))")
    assert "hunter2" not in result.stdout
    assert result.stdout.startswith("None")


def test_work_dir_is_fresh_and_removed():
    first = run("import os; print(os.getcwd()); print(os.listdir('.'))").stdout.splitlines()
    assert not os.path.exists(first[0])
    second = run("import os; print(os.getcwd())").stdout.strip()
    assert second != first[0]


def test_no_connection_reaches_a_loopback_listener():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        result = run(
            f"""
            import socket
            s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
            s.sendall(b"leak")
            """
        )
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert result.outcome in ("OSError", "PermissionError", "ConnectionRefusedError", "TimeoutError")


@netns_only
def test_file_outside_the_work_dir_cannot_be_written(tmp_path):
    target = tmp_path / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('pwned')")
    assert result.outcome == "PermissionError"
    assert not target.exists()


@netns_only
def test_file_outside_the_work_dir_cannot_be_deleted(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("precious")
    os.chmod(tmp_path, 0o755)  # visible to others, still not writable by them
    result = run(f"import os; os.remove({str(victim)!r})")
    assert result.outcome == "PermissionError"
    assert victim.read_text() == "precious"


@netns_only
def test_parent_process_cannot_be_signalled():
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(True))
    try:
        result = run(
            f"""
            import os, signal
            for target in ({os.getpid()}, os.getppid()):
                try:
                    os.kill(target, signal.SIGUSR1)
                except OSError as error:
                    print(type(error).__name__)
            """
        )
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert not received
    assert result.outcome == "passed"


@netns_only
def test_process_limit_holds_for_a_bounded_fork_loop():
    result = run(
        f"""
        import os, time
        print(os.getuid())
        made = 0
        try:
            for _ in range({MAX_PROCESSES * 2}):
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                made += 1
        except BlockingIOError:
            pass
        print(made)
        """,
        timeout_s=10,
    )
    uid, made = map(int, result.stdout.split())
    assert result.outcome == "passed"
    assert made < MAX_PROCESSES
    assert not processes_of(uid)  # the sleeping children died with the namespace


@netns_only
def test_fork_bomb_is_contained_and_cleaned_up():
    bomb = ("import os, sys\nprint(os.getuid(), flush=True)\n"
            "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    results = run_many([Job(bomb, timeout_s=1), Job("print('alive')")], workers=2)
    assert results[0].outcome == "Timeout"
    assert results[1].outcome == "passed" and results[1].stdout == "alive\n"
    assert not processes_of(int(results[0].stdout))
    assert run("print('still fine')").stdout == "still fine\n"


def test_pool_keeps_order_and_survives_hostile_jobs():
    jobs = [
        Job("print(1)"),
        Job("while True: pass", timeout_s=0.5),
        Job("1/0"),
        Job("x = bytearray(20 * 1024**3)", memory_mb=512),
        Job("import os; os._exit(7)"),
        Job("print(2)"),
    ]
    outcomes = [r.outcome for r in run_many(jobs, workers=3)]
    assert outcomes == ["passed", "Timeout", "ZeroDivisionError", "MemoryLimit", "SystemExit", "passed"]


def test_collected_files_come_back():
    result = run("open('out.txt', 'w').write('data')", collect=("out.txt", "missing.txt"))
    assert result.files == {"out.txt": b"data", "missing.txt": b""}


@pytest.mark.parametrize(
    "returncode, exception, signum, timed_out, stderr, outcome",
    [
        (0, None, None, False, "", "passed"),
        (-9, None, None, True, "", "Timeout"),
        (152, None, signal.SIGXCPU, False, "", "Timeout"),
        (1, "MemoryError", None, False, "", "MemoryLimit"),
        (134, None, signal.SIGABRT, False, "Fatal Python error: Cannot allocate memory", "MemoryLimit"),
        (139, None, signal.SIGSEGV, False, "", "Killed"),
        (1, "ValueError", None, False, "", "ValueError"),
        (3, None, None, False, "", "SystemExit"),
    ],
)
def test_classify(returncode, exception, signum, timed_out, stderr, outcome):
    assert classify(returncode, exception, signum, timed_out, stderr) == outcome
