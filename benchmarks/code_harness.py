"""The harness program that runs a solution on its tests inside the sandbox, and its report.

One sandboxed program per (problem, solution): a fixed script that reads the solution, the test
inputs and the limits from stdin, calls the solution on each input and appends one JSON record
per input to a report file. It never sees an expected output: outputs are compared in the
grader (code_compare), so a returned object with a rigged `__eq__` cannot pass.

Inputs come in groups (EvalPlus's base and plus tests), each run as EvalPlus runs it:
- the solution is loaded afresh for each group (EvalPlus runs each group in a new process);
- each input has its own time limit, enforced with a SIGALRM timer that raises `Timeout`
  inside the solution, and the group as a whole a wall-clock budget counted from the start
  of its loading; after a time-out the rest of the group is not run (it has failed);
- an exception fails that input only (EvalPlus stops the group there: the verdict is the same,
  and the pass-rate reward keeps counting the inputs after it);
- a solution that does not load (a syntax error, an exception, loading past the group's budget)
  ends the program: every test then fails with that outcome;
- in 'call' mode the solution's stdin, stdout and stderr are a sink (printing is free, reading
  fails), and for candidates (`guard`) what EvalPlus's reliability guard disables is disabled
  (file removal, `open`, process creation and signalling, `os.chdir`/`getcwd`, ...), after
  loading the modules EvalPlus's own process has loaded where the solution imports them.

Modes: 'call' (function on each input), 'method' (LeetCode's Solution().name(*args)), 'stdio'
(the whole program per stdin text), 'check' (HumanEval's check(candidate)), 'script' (a test
script run after the solution; a hub copy's tests). Records: {"i": index, "t": seconds,
"ok": encoded output} (plus "set": the output as a set, or "set_exc", where the grader
compares sets), {"i", "t", "exc": exception type name} (a time-out is "Timeout"), or
{"i", "big": true} for an output with more than MAX_OUTPUT_ITEMS items.
"""

import functools
import inspect
import json
import re

from benchmarks import code_values
from benchmarks.sandbox import ProgramResult

REPORT_FILE = "report.jsonl"
# An output whose JSON form is longer than this comes back as the digest of its equality form
# (code_values.digest): some plus inputs give outputs of megabytes.
DIGEST_OVER = 256 * 1024
# An output with more items than this is digested without being encoded first (encoding millions
# of items costs seconds; its JSON form would be long anyway).
DIGEST_ITEMS = 20_000
# An output with more items than this (Mbpp/255 has one of 1.6 million 77-tuples) costs more to
# ship or digest than the test is worth: an expected output that big leaves its input out.
MAX_OUTPUT_ITEMS = 10_000_000

_PROGRAM = r'''
import builtins, copy, io, json, os, signal, sys, time


class Timeout(Exception):
    """Raised inside the solution when its input's (or its group's) time is up."""


def _on_alarm(signum, frame):
    raise Timeout()


def _alarm(seconds):
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3) if seconds is not None else 0)


class _Sink(io.TextIOBase):
    """stdout, stderr and stdin of a guarded solution: writes vanish, reads fail."""

    def writable(self):
        return True

    def write(self, text):
        return len(text)

    def readable(self):
        return False

    def read(self, *args):
        raise OSError("stdin is not readable")

    readline = read


def _guard():
    """Disable what EvalPlus's reliability guard disables in the process it tests in."""
    import shutil, subprocess

    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                 "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod",
                 "fchown", "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, None)
    subprocess.Popen = None
    builtins.open = builtins.exit = builtins.quit = builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def _items(value, budget=MAX_OUTPUT_ITEMS):
    """How many items value holds (containers and their contents), counted up to budget + 1
    without walking all of a huge one."""
    stack, seen = [value], 0
    while stack and seen <= budget:
        item = stack.pop()
        seen += 1
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
    return seen


_TOO_BIG = object()


def _encoded(value):
    """value in the wire format; a digest when it is long; _TOO_BIG past MAX_OUTPUT_ITEMS."""
    try:
        items = _items(value)
        if items > MAX_OUTPUT_ITEMS:
            return _TOO_BIG
        if items > DIGEST_ITEMS:
            return {"$": "digest", "v": digest(value)}
        encoded = encode_value(value)
        if len(json.dumps(encoded)) > DIGEST_OVER:
            encoded = {"$": "digest", "v": digest(value)}
        return encoded
    except BaseException:  # a cyclic or pathological object: still an answer, a wrong one
        return {"$": "repr", "t": type(value).__name__, "v": "<unencodable>"}


def _load(source, name):
    namespace = {"__name__": name, "__builtins__": builtins}
    exec(compile(source, "solution.py", "exec"), namespace)
    return namespace


def _function(namespace, name):
    if name not in namespace:
        raise NameError(f"name '{name}' is not defined")
    return namespace[name]


def _run_stdio(source, text):
    sys.stdin, sys.stdout = io.StringIO(text), io.StringIO()
    try:
        _load(source, "__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):
            raise
    finally:
        output, sys.stdin, sys.stdout = sys.stdout.getvalue(), sys.__stdin__, sys.__stdout__
    return output


def _callable(payload):
    """What runs the solution on one input (an argument list, or stdin text), from a fresh load."""
    mode, source = payload["mode"], payload["solution"]
    if mode == "call":
        function = _function(_load(source, "solution"), payload["entry_point"])
        return lambda args: function(*args)
    if mode == "method":
        method = getattr(_function(_load(source, "solution"), "Solution")(), payload["entry_point"])
        return lambda args: method(*args)
    compile(source, "solution.py", "exec")  # stdio: a syntax error is the program's outcome
    return lambda text: _run_stdio(source, text)


class _Group:
    """One group of inputs with its limits: per input, and the group's wall-clock budget."""

    def __init__(self, spec):
        self.limits = spec.get("limits")
        budget = spec.get("budget")
        self.deadline = None if budget is None else time.monotonic() + budget

    def extend(self, seconds):
        """Give the group back time spent on the harness's own work (encoding an output): EvalPlus
        compares outputs in the process, at C speed, where this harness must serialise them."""
        if self.deadline is not None:
            self.deadline += seconds

    def left(self):
        """Seconds left to the group; None without a budget."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def seconds_for(self, position):
        """The timer for an input: its own limit within what is left to the group."""
        left, limit = self.left(), None if self.limits is None else self.limits[position]
        return left if limit is None else limit if left is None else min(limit, left)


def _timed(seconds, work):
    """work() under a timer (None: none); a Timeout raised as the timer fires propagates."""
    if seconds is not None and seconds <= 0:
        raise Timeout()
    try:
        _alarm(seconds)
        return work()
    finally:
        _alarm(None)


def _record(index, seconds, output, set_view, group):
    record, start = {"i": index, "t": seconds}, time.monotonic()
    encoded = _encoded(output)
    group.extend(time.monotonic() - start)
    if encoded is _TOO_BIG:
        record["big"] = True
    else:
        record["ok"] = encoded
    if set_view:  # under the group's remaining time: set() of an endless iterator never returns
        try:
            record["set"] = encode_value(_timed(group.left(), lambda: set(output)))
        except BaseException as error:
            record["set_exc"] = "Timeout" if isinstance(error, Timeout) else type(error).__name__
    return record


def _run_group(payload, spec, first, emit):
    group, inputs = _Group(spec), decode_value(spec["inputs"])
    # A solution that fails to load, in time or at all, ends the program: every test fails with
    # that outcome (EvalPlus's process for the group dies the same way, or runs out of time).
    call = _timed(group.left(), lambda: _callable(payload))
    for position, args in enumerate(inputs):
        index, seconds = first + position, group.seconds_for(position)
        if seconds is not None and seconds <= 0:
            for rest in range(position, len(inputs)):
                emit({"i": first + rest, "exc": "Timeout"})
            return
        args = copy.deepcopy(args)
        start = time.perf_counter()
        try:
            output = _timed(seconds, lambda: call(args))
        except BaseException as error:  # the test's outcome, whatever the solution raised
            _alarm(None)
            elapsed = time.perf_counter() - start
            timed_out = isinstance(error, Timeout)
            emit({"i": index, "t": elapsed, "exc": "Timeout" if timed_out else type(error).__name__})
            if timed_out:  # the group has failed; EvalPlus stops it here
                for rest in range(position + 1, len(inputs)):
                    emit({"i": first + rest, "exc": "Timeout"})
                return
            continue
        emit(_record(index, time.perf_counter() - start, output, payload.get("set_view"), group))


def _main():
    payload = json.loads(sys.stdin.read())
    sys.stdin = io.StringIO()
    report = os.open("''' + REPORT_FILE + r'''", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def emit(record):
        os.write(report, (json.dumps(record) + "\n").encode())

    signal.signal(signal.SIGALRM, _on_alarm)
    mode, source = payload["mode"], payload["solution"]
    if mode == "call":  # as EvalPlus: what the solution prints is swallowed, reading fails
        sys.stdin = sys.stdout = sys.stderr = _Sink()
    if payload.get("guard"):
        for name in payload.get("preload", ()):  # loaded before the guard, as in EvalPlus's process
            try:
                __import__(name)
            except BaseException:
                pass
        _guard()
    if mode in ("check", "script"):
        namespace = _load(source, "solution")
        exec(compile(payload["test"], "test.py", "exec"), namespace)
        if mode == "check":
            namespace["check"](_function(namespace, payload["entry_point"]))
        return
    first = 0
    try:
        for spec in payload["groups"]:
            _run_group(payload, spec, first, emit)
            first += len(spec["inputs"])
    except BaseException:  # the solution did not load: the program's outcome, with its traceback
        sys.stderr = sys.__stderr__
        raise


_main()
'''


@functools.cache
def harness_source() -> str:
    """The harness program: its constants, the codec functions, then the driver."""
    constants = (f"DIGEST_OVER = {DIGEST_OVER}\nDIGEST_ITEMS = {DIGEST_ITEMS}\nMAX_OUTPUT_ITEMS = {MAX_OUTPUT_ITEMS}\n"
                 f"_NUMPY_KINDS = {code_values._NUMPY_KINDS!r}\n")  # fmt: skip
    codec = [code_values.encode_value, code_values.decode_value, code_values.equality_form,
             code_values._json_text, code_values.digest]  # fmt: skip
    return "\n\n".join([constants] + [inspect.getsource(f) for f in codec]) + _PROGRAM


# Modules EvalPlus's evaluation process has loaded before it disables os.putenv and co.: a
# solution importing them works there, and would fail here if they were first imported after
# the guard. Loaded before the guard when the solution imports them (loading costs time).
PRELOADED_BY_EVALPLUS = ("numpy", "multiprocessing", "pandas")


def payload(mode: str, solution: str, *, entry_point: str | None = None, groups: list[dict] | None = None,
            test: str | None = None, set_view: bool = False, guard: bool = False) -> str:
    """The harness's stdin. groups: [{"inputs": encoded list, "limits": [s] | None,
    "budget": s | None}], run in order, their inputs numbered on from one group to the next."""
    preload = [name for name in PRELOADED_BY_EVALPLUS if guard and _imports(solution, name)]
    return json.dumps({"mode": mode, "solution": solution, "entry_point": entry_point, "groups": groups or [],
                       "test": test, "set_view": set_view, "guard": guard, "preload": preload})  # fmt: skip


def _imports(source: str, module: str) -> bool:
    return re.search(rf"^[ \t]*(?:import|from)[ \t]+{module}\b", source, re.M) is not None


def read_records(result: ProgramResult) -> dict[int, dict]:
    """Per-input records from the harness's report, the first one per index; torn or
    unreadable lines skipped (a program killed mid-write leaves a partial last line)."""
    records: dict[int, dict] = {}
    for line in result.files.get(REPORT_FILE, b"").decode(errors="replace").splitlines():
        try:
            record = json.loads(line)
            records.setdefault(int(record["i"]), record)
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return records
