"""One response's Python session, kept between its code blocks as a notebook keeps a kernel's,
and the sandbox runs of many responses' blocks at once.

How state is kept: each call runs one fresh sandboxed program (benchmarks/sandbox.py) that first
replays the response's earlier blocks with their output sent to /dev/null, then runs the new
block. A persistent process per response would save the replay, but the sandbox's isolation is
built around one program per run: its work dir is made and removed per program, its limits
(CPU time, memory, processes, files) hold for the process's whole life, and its PID namespace
dies with it. Replaying keeps every one of those guarantees unchanged, and a killed block cannot
leave a session half alive. Tool-integrated reasoning writes few, short blocks (ToRA and
Qwen2.5-Math's evaluation re-run earlier code the same way), so the replay costs little.

What the replay keeps: the blocks whose program survived them (finished or raised: an exception
keeps what was assigned before it, as a notebook cell does). A block that ended its process
(a time-out, the memory limit, a signal, os._exit) is left out of later replays, as if it had
never run. `random` is seeded with 0 before the first block, so a replay draws what the first run
drew; other generators (numpy's) are as repeatable as the program makes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from benchmarks.sandbox import DEFAULT_MEMORY_MB, Job, ProgramResult, run_many

_DONE_FILE = ".meds_cell_done"  # written by the replay program once the new block has ended
# The replay program; the launcher runs it as __main__. The blocks run in a namespace of their
# own, so they see nothing of it. It holds os.open and co. from the start: a block may replace them.
_REPLAY = """\
import os as _os, sys as _sys, time as _time


def _meds_replay(blocks, done_path):
    import random
    random.seed(0)
    open_, write, close, clock = _os.open, _os.write, _os.close, _time.perf_counter
    out, err = _sys.stdout, _sys.stderr
    out.reconfigure(line_buffering=True)  # what a block printed before a time-out is shown
    sink = open(_os.devnull, "w")
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    for number, source in enumerate(blocks, 1):
        last = number == len(blocks)
        _sys.stdout, _sys.stderr = (out, err) if last else (sink, sink)
        start = clock()
        try:
            exec(compile(source, "<block %d>" % number, "exec"), scope)
        except BaseException:
            if last:
                raise
        finally:
            if last:
                _sys.stdout, _sys.stderr = out, err
                fd = open_(done_path, _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o644)
                write(fd, repr(clock() - start).encode())
                close(fd)


_meds_replay(BLOCKS, _os.path.abspath(DONE_FILE))
"""


@dataclass
class CallResult:
    """One block's run: the sandbox's outcome class, the text the model reads back, seconds."""

    outcome: str  # 'passed', an exception name, 'Timeout', 'MemoryLimit', 'Killed'
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.outcome == "Timeout"

    @property
    def failed(self) -> bool:
        return self.outcome != "passed"


def replay_program(blocks: list[str]) -> str:
    """The program that replays blocks[:-1] silently, then runs blocks[-1]."""
    return (f"BLOCKS = {json.dumps(blocks)}\nDONE_FILE = {json.dumps(_DONE_FILE)}\n" + _REPLAY)


def failure_line(result: ProgramResult, time_limit_s: float, memory_mb: int) -> str:
    """One line saying how a failed block ended: the exception's last line, or the limit it hit."""
    if result.outcome == "Timeout":
        return f"TimeoutError: the code ran past its {time_limit_s:g} s time limit"
    if result.outcome == "MemoryLimit":
        return f"MemoryError: the code ran past its {memory_mb} MB memory limit"
    if result.outcome == "Killed":
        return "Killed: the code was stopped by a signal (too much output, or a crash)"
    if result.outcome == "SystemExit":
        return f"SystemExit: {result.exit_code}"
    # The traceback's last header line ('ValueError: ...', 'sympy...SympifyError: ...'); a
    # message of several lines is cut to its first.
    for line in reversed(result.stderr.splitlines()):
        if not line[:1].isspace() and line.partition(":")[0].endswith(result.outcome):
            return line.strip()
    return result.outcome


@dataclass
class PythonSession:
    """The blocks of one response that later blocks see, with the seconds each took."""

    time_limit_s: float = 10.0
    memory_mb: int = DEFAULT_MEMORY_MB
    output_cap: int = 64 * 1024  # bytes of stdout kept (the observation is cut to tokens later)
    blocks: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def job(self, source: str) -> Job:
        # The replay gets twice what its blocks took the first time (a busy machine is slower),
        # so a slow but finished earlier block never eats the new block's time.
        allowance = self.time_limit_s + 2 * sum(self.seconds)
        return Job(replay_program([*self.blocks, source]), timeout_s=allowance, memory_mb=self.memory_mb,
                   collect=(_DONE_FILE,), output_cap=self.output_cap)

    def record(self, source: str, result: ProgramResult) -> CallResult:
        """Keep the block for later replays if its process survived it; the model's view of the run."""
        done = result.files.get(_DONE_FILE, b"")
        try:
            block_seconds = float(done.decode())
        except ValueError:
            block_seconds = None  # the process died inside the block
        if block_seconds is not None and result.outcome != "Timeout":
            self.blocks.append(source)
            self.seconds.append(block_seconds)
        output = result.stdout
        if result.outcome != "passed":
            output += ("" if output.endswith("\n") or not output else "\n") + \
                failure_line(result, self.time_limit_s, self.memory_mb)
        return CallResult(result.outcome, output, result.duration_s)


def run_blocks(calls: list[tuple[PythonSession, str]], workers: int | None = None) -> list[CallResult]:
    """Run one block for each (session, source), in parallel sandboxed processes (a pool sized
    by this process's CPU budget unless `workers` is given); results in the order of calls."""
    results = run_many([session.job(source) for session, source in calls], workers=workers)
    return [session.record(source, result) for (session, source), result in zip(calls, results)]
