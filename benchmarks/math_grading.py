"""Math answer equivalence for rewards and eval: math-verify in a pool of killable workers.

math-verify (HuggingFace) parses LaTeX to SymPy and compares numerically and symbolically. Its
own time limits use SIGALRM, which works only in a main thread and cannot interrupt a loop in C
(a big-integer power), so every comparison runs in a worker process with a hard wall-clock
limit per answer: a worker past it is killed and replaced, and the answer counts as wrong with
outcome 'timeout'. Workers are fresh interpreters, started lazily and replaced in the
background, so one hung answer costs its time limit and nothing more.

Both sides are first put in one spelling (benchmarks.latex_forms: `\\cfrac`, `\\dfrac`, `\\tfrac`
are `\\frac`, `\\left`/`\\right` only size their delimiters, brace-less `\\frac13` and `\\sqrt2` are
braced). Before any worker is asked, the parent settles the easy cases: no answer ('no_answer'), the same
text as the gold answer, and plain numbers on both sides (`number_match`: exact as fractions, or
a decimal that is the other number rounded, with at least six significant digits). A decimal
answer against a gold answer that is an exact expression (\\sqrt{2}, \\pi/4) gets the same rule
in a worker, with the gold evaluated by SymPy; inside tuples, sets and intervals math-verify's own
rounding (six decimal places) applies.

Reward safety: math-verify counts `\\boxed{27 + 82}` as equal to 109, so a policy could be
rewarded for boxing the question. In strict mode (the default, for rewards and eval alike), when
the gold answer is a plain number the prediction must itself be a plain number literal
(`answer_extraction.number_literal_value`: no operator between numbers except a fraction bar).
Gold answers that are expressions, sets, intervals or text are left to math-verify either way.
"""

import importlib
import json
import logging
import math
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from multiprocessing.connection import Connection, wait
from typing import Sequence

from benchmarks.answer_extraction import (
    SPACE_INSIDE_NUMBER,
    NumberLiteral,
    extract_answer,
    integer_literal_value,
    read_number_literal,
)
from benchmarks.latex_forms import plain_latex
from benchmarks.number_match import decimal_stands_for, numbers_match
from meds_cli.core.cpu_budget import worker_count
from meds_cli.core.records import Verdict

OUTCOMES = ("correct", "wrong", "no_answer", "timeout")
# How long a fresh worker may take to import math-verify and SymPy before the pool gives up.
_STARTUP_LIMIT_S = 120.0


# --- the parent-side checks: no worker needed ---------------------------------------------


def integer_answer_equal(pred: str | None, gold: int) -> bool:
    """True only when pred is an integer literal equal to gold (the arithmetic task's reward).

    See `integer_literal_value` for what counts as a literal: `$-1,234$` and `\\text{42}` do,
    `27 + 82`, `109.0` and `109 apples` do not.
    """
    value = integer_literal_value(pred)
    return value is not None and value == gold


def _squash(text: str) -> str:
    """text without the whitespace that cannot change what it says: whitespace between two parts
    of a number is kept (as a NUL), since "2 7" is not the text "27"."""
    return "".join(SPACE_INSIDE_NUMBER.sub("\0", text).split())


_PERCENT = re.compile(r"%|percent|pct")


def _has_percent(text: str) -> bool:
    """A percentage: `%`, or the word (`28 percent`, `28 pct`), which math-verify reads too."""
    return _PERCENT.search(text) is not None


def _checker_text(text: str) -> str:
    """What math-verify is given: a plain number literal rewritten as LaTeX it reads right.

    math-verify reads `4.5e33` as 4.5·e·33 (Euler's e) and cannot read `-1./3` (both are gold
    answers in Minerva-Math); the exact value written as an integer or `\\frac{p}{q}` avoids that.
    Percentages keep their text: 10\\% must stay comparable with 0.1. Anything else goes in
    latex_forms's one spelling: math-verify misreads brace-less arguments (`\\sqrt[3]2`).
    """
    literal = read_number_literal(text)
    if literal is None or _has_percent(text):
        return plain_latex(text)
    value = literal.value
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _prejudge(pred: str | None, gold: str, strict: bool) -> Verdict | None:
    """The verdict when it needs no symbolic checker, else None."""
    if pred is None or not pred.strip():
        return Verdict(False, None, "no_answer")
    if _squash(plain_latex(pred)) == _squash(plain_latex(gold)):
        # The same text is the same answer; spares math-verify a slow parse of a long gold.
        return Verdict(True, pred, "correct", {"by": "identical"})
    gold_number = read_number_literal(gold)
    if gold_number is None:
        return None  # an expression, a set, text: a worker decides
    pred_number = read_number_literal(pred)
    if pred_number is None:
        if strict:
            return Verdict(False, pred, "wrong", {"by": "strict", "reason": "not a number literal"})
        return None
    if pred_number.value != gold_number.value and _has_percent(pred + gold):
        return None  # 10\\% against 0.1: math-verify reads percentages
    same, how = numbers_match(pred_number, gold_number)
    return Verdict(same, pred, "correct" if same else "wrong", {"by": how})


# --- the worker side ------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _parse(text: str, op_timeout: int) -> list:
    """math-verify's parse of an answer; raises math-verify's TimeoutException on a time-out."""
    from math_verify import parse

    try:
        # The answer is already extracted; boxing it makes math-verify take it whole.
        return parse("\\boxed{" + text + "}", parsing_timeout=op_timeout, raise_on_error=True)
    except Exception:  # math-verify's TimeoutException is a BaseException and passes through
        return []


def _real_value(parsed: list, digits: int) -> Fraction | None:
    """The value of a parsed answer that is one real number (\\sqrt{2}, \\pi/4), exact to well
    past `digits` significant digits; None for anything else (a symbol, a set, a complex number)."""
    import sympy

    for expr in parsed:
        if isinstance(expr, sympy.Basic) and expr.is_number:
            try:
                value = sympy.N(expr, digits + 30)
            except Exception:  # SymPy cannot evaluate it: math-verify still compares it
                return None
            if isinstance(value, sympy.Float) and value.is_finite:
                numerator, denominator = sympy.Rational(value).as_numer_denom()
                return Fraction(int(numerator), int(denominator))
            return None
    return None


def _decimal_stands_for_gold(decimal: NumberLiteral | None, gold_parsed: list) -> bool:
    """True when the answer is a decimal that is the gold answer's value rounded (number_match's rule)."""
    if decimal is None or decimal.unit is None:
        return False
    value = _real_value(gold_parsed, decimal.digits)
    return value is not None and decimal_stands_for(decimal, value)


def judge_pair(pred: str, gold: str, op_timeout: int) -> tuple[str, dict]:
    """(outcome, detail) for one answer: runs in a worker process (SIGALRM needs its main thread)."""
    from math_verify import verify
    from math_verify.errors import TimeoutException

    try:
        gold_parsed = _parse(_checker_text(gold), op_timeout)
        if not _has_percent(pred + gold) and _decimal_stands_for_gold(read_number_literal(pred), gold_parsed):
            return "correct", {"by": "rounding"}
        # A decimal that is no rounding of the gold may still equal it exactly (1.0 and \\sqrt{1}):
        # math-verify compares it as the exact fraction it is.
        pred_parsed = _parse(_checker_text(pred), op_timeout)
    except TimeoutException:
        return "timeout", {"by": "math_verify", "reason": "parse time-out"}
    if not gold_parsed:
        return "wrong", {"by": "math_verify", "reason": "gold answer does not parse"}
    if not pred_parsed:
        return "wrong", {"by": "math_verify", "reason": "answer does not parse"}
    timed_out = False
    # verify() stops at the first error when raising, so each pair is tried on its own.
    for g in gold_parsed:
        for p in pred_parsed:
            try:
                if verify(g, p, timeout_seconds=op_timeout, raise_on_error=True):
                    return "correct", {"by": "math_verify"}
            except TimeoutException:
                timed_out = True
            except Exception:
                pass
    if timed_out:
        return "timeout", {"by": "math_verify", "reason": "comparison time-out"}
    return "wrong", {"by": "math_verify"}


def _cap_cpu(seconds: int) -> None:
    """Let the kernel end this process (SIGXCPU) after `seconds` more CPU time.

    The parent kills a worker past its wall-clock limit; this is the backstop for a worker whose
    parent died while it was stuck in C code, which would otherwise spin on as an orphan.
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def serve(read_fd: int, write_fd: int, judge_name: str, op_timeout: int, memory_limit_mb: int,
          cpu_limit_s: int) -> None:
    """A worker's main loop: answer (pred, gold) jobs read from read_fd until it closes or sends None.

    Runs in a fresh interpreter (see MathGrader._start); judge_name is 'module:function'.
    """
    # Ctrl-C is the parent's to handle; a worker interrupted mid-job would only print noise.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if memory_limit_mb > 0:
        limit = memory_limit_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # math-verify warns on every time-out; the parent counts them instead.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    import math_verify  # noqa: F401  (import before 'ready' so no job's time limit pays for it)

    module, _, function = judge_name.partition(":")
    judge = getattr(importlib.import_module(module), function)
    jobs, results = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    results.send("ready")
    while True:
        try:
            job = jobs.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        _cap_cpu(cpu_limit_s)
        try:
            result = judge(job[0], job[1], op_timeout)
        except MemoryError:
            result = ("wrong", {"by": "math_verify", "reason": "memory limit"})
        results.send(result)


# --- the pool -------------------------------------------------------------------------------

_SERVE = "import sys; from benchmarks.math_grading import serve; serve(*__import__('json').loads(sys.argv[1]))"


@dataclass
class _Worker:
    process: subprocess.Popen
    jobs: Connection  # parent -> worker
    results: Connection  # worker -> parent
    started: float
    ready: bool = False


class MathGrader:
    """Grades (predicted final answer, gold answer) pairs with math-verify in worker processes.

    workers: pool size (default: this process's share of the cores, at most 16). timeout_s: wall-clock limit per
    answer; past it the worker is killed and replaced and the answer is a 'timeout'. strict: the
    plain-number rule of the module docstring. memory_limit_mb: address-space limit of each
    worker (0: none), so a runaway SymPy expression fails instead of swapping. judge:
    'module:function' run on each pair in the worker (a test hook; default judge_pair).
    `counts` tallies outcomes over the grader's life and `restarts` the workers killed.

    Workers are fresh interpreters (`python -c`), not multiprocessing children: 'fork' is unsafe
    in a trainer that holds CUDA and threads, and 'spawn' re-imports the caller's __main__, which
    breaks scripts without a main guard and `python -` pipelines.
    """

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 5.0,
        strict: bool = True,
        memory_limit_mb: int = 4096,
        judge: str = "benchmarks.math_grading:judge_pair",
    ):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.workers = workers or worker_count()
        self.timeout_s = float(timeout_s)
        self.strict = strict
        self.memory_limit_mb = memory_limit_mb
        self.judge = judge
        # math-verify's own per-operation limit (whole seconds) sits below the hard limit, so a
        # slow but interruptible step ends inside the worker and the worker survives.
        self.op_timeout = max(1, math.ceil(self.timeout_s) - 1)
        self._pool: list[_Worker] = []
        self._lock = threading.Lock()
        self.counts: Counter = Counter()
        self.restarts = 0

    # -- public API

    def grade_many(self, pairs: Sequence[tuple[str | None, str]], strict: bool | None = None) -> list[Verdict]:
        """Verdicts for (predicted answer text or None, gold answer) pairs, in order."""
        strict = self.strict if strict is None else strict
        verdicts: list[Verdict | None] = []
        todo: deque[int] = deque()
        for i, (pred, gold) in enumerate(pairs):
            verdict = _prejudge(pred, str(gold), strict)
            verdicts.append(verdict)
            if verdict is None:
                todo.append(i)
        if todo:
            jobs = {i: (pairs[i][0].strip(), str(pairs[i][1]).strip()) for i in todo}
            with self._lock:
                results = self._run(jobs, todo)
            for i, (outcome, detail) in results.items():
                verdicts[i] = Verdict(outcome == "correct", pairs[i][0], outcome, detail)
        self.counts.update(v.outcome for v in verdicts)
        return verdicts  # type: ignore[return-value]

    def grade_responses(
        self, pairs: Sequence[tuple[str, str]], extraction: str = "boxed", strict: bool | None = None
    ) -> list[Verdict]:
        """Verdicts for (full response, gold answer) pairs: extract the final answer, then grade."""
        answers = [(extract_answer(response, extraction), gold) for response, gold in pairs]
        return self.grade_many(answers, strict)

    def close(self) -> None:
        """Stop the workers (a later call to grade starts new ones)."""
        with self._lock:
            for worker in self._pool:
                worker.jobs.close()  # end of input: an idle worker exits at once
            deadline = time.monotonic() + 1.0
            for worker in self._pool:
                try:
                    worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                self._kill(worker)
            self._pool = []

    def __enter__(self) -> "MathGrader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        for worker in getattr(self, "_pool", []):
            if worker.process.poll() is None:
                worker.process.kill()

    # -- the pool machinery

    def _start(self) -> _Worker:
        job_read, job_write = os.pipe()
        result_read, result_write = os.pipe()
        cpu_limit_s = math.ceil(self.timeout_s) + 5
        config = [job_read, result_write, self.judge, self.op_timeout, self.memory_limit_mb, cpu_limit_s]
        # The worker must import what this process imports, including paths added at run time.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, json.dumps(config)],
            pass_fds=(job_read, result_write),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        os.close(job_read)
        os.close(result_write)
        return _Worker(
            process, Connection(job_write, readable=False), Connection(result_read, writable=False), time.monotonic()
        )

    @staticmethod
    def _kill(worker: _Worker) -> None:
        if worker.process.poll() is None:
            worker.process.kill()
        try:
            worker.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        for conn in (worker.jobs, worker.results):
            if not conn.closed:
                conn.close()

    def _replace(self, worker: _Worker) -> _Worker:
        self._kill(worker)
        self.restarts += 1
        fresh = self._start()
        self._pool[self._pool.index(worker)] = fresh
        return fresh

    def _run(self, jobs: dict[int, tuple[str, str]], todo: deque[int]) -> dict[int, tuple[str, dict]]:
        """Run every job to an outcome, keeping at most one job on each worker."""
        while len(self._pool) < min(self.workers, len(todo)):
            self._pool.append(self._start())
        results: dict[int, tuple[str, dict]] = {}
        idle = [w for w in self._pool if w.ready]
        starting = [w for w in self._pool if not w.ready]
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        while todo or busy:
            while idle and todo:
                worker = idle.pop()
                if worker.process.poll() is not None:  # died while idle: no job of ours is lost
                    starting.append(self._replace(worker))
                    continue
                i = todo.popleft()
                try:
                    worker.jobs.send(jobs[i])
                except OSError:  # died just now: replace it and retry the job
                    todo.appendleft(i)
                    starting.append(self._replace(worker))
                    continue
                busy[worker.results] = (worker, i, time.monotonic() + self.timeout_s)
            deadlines = [d for _, _, d in busy.values()] + [w.started + _STARTUP_LIMIT_S for w in starting]
            ready = wait(list(busy) + [w.results for w in starting], max(0.0, min(deadlines) - time.monotonic()))
            for conn in ready:
                if conn in busy:
                    worker, i, _ = busy.pop(conn)
                    try:
                        results[i] = conn.recv()
                        idle.append(worker)
                    except (EOFError, OSError):  # killed from outside, e.g. out of memory
                        results[i] = ("timeout", {"reason": "worker died"})
                        starting.append(self._replace(worker))
                else:
                    worker = next(w for w in starting if w.results is conn)
                    starting.remove(worker)
                    try:
                        worker.ready = conn.recv() == "ready"
                    except (EOFError, OSError):
                        worker.ready = False
                    if not worker.ready:
                        self._pool.remove(worker)
                        self._kill(worker)
                        raise RuntimeError("math grader: a worker died on start (see its error above)")
                    idle.append(worker)
            now = time.monotonic()
            for conn, (worker, i, deadline) in list(busy.items()):
                if deadline <= now:
                    del busy[conn]
                    results[i] = ("timeout", {"reason": f"killed after {self.timeout_s:g} s"})
                    starting.append(self._replace(worker))
            for worker in starting:
                if worker.started + _STARTUP_LIMIT_S <= now:
                    raise RuntimeError(f"math grader: a worker took over {_STARTUP_LIMIT_S:g} s to start")
        return results


# --- module-level convenience ---------------------------------------------------------------

_shared: MathGrader | None = None
_shared_lock = threading.Lock()


def shared_grader() -> MathGrader:
    """The process-wide grader (default settings), created on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathGrader()
        return _shared


def grade_response(response: str, gold: str, extraction: str = "boxed", strict: bool = True) -> Verdict:
    """Grade one full response against a gold answer with the shared grader."""
    return shared_grader().grade_responses([(response, gold)], extraction, strict)[0]


def grade_responses(
    responses: Sequence[str], golds: Sequence[str], extraction: str = "boxed", strict: bool = True
) -> list[Verdict]:
    """Grade full responses against their gold answers (in order) with the shared grader."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
    return shared_grader().grade_responses(list(zip(responses, golds)), extraction, strict)
