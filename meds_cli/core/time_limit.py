"""Calling code we do not control (the user's reward functions) with a time limit, so that one
that never returns stops the run with a line instead of hanging it for ever."""

from __future__ import annotations

import signal
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


class TimeLimitExceeded(BaseException):
    """The call ran past its limit. A BaseException, so that the called code's own
    `except Exception:` cannot swallow it and carry on."""


def call_with_time_limit(fn: Callable[[], T], seconds: float) -> T:
    """fn() or TimeLimitExceeded after `seconds` (0: no limit).

    In the main thread an interval timer interrupts the call itself (pure Python loops and sleeps
    included). Elsewhere, or while another timer is running, the call runs in a daemon thread
    that is waited for `seconds`; one that overruns is left behind, and the process ends soon
    after, because the caller stops the run."""
    if not seconds or seconds <= 0:
        return fn()
    if (threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)):
        return _with_timer(fn, seconds)
    return _in_thread(fn, seconds)


def _with_timer(fn: Callable[[], T], seconds: float) -> T:
    def overran(signum, frame):
        raise TimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, overran)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_thread(fn: Callable[[], T], seconds: float) -> T:
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed to the caller's thread as it is
            outcome["error"] = error

    worker = threading.Thread(target=target, daemon=True, name="time-limited call")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeLimitExceeded()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
