"""call_with_time_limit: a call that overruns is stopped, in the main thread (timer) and in any
other thread (waited for in a helper thread); values and errors come back as they were."""

import signal
import threading
import time

import pytest

from meds_cli.core.time_limit import TimeLimitExceeded, call_with_time_limit


def spin():
    while True:
        pass


def test_value_and_error_come_back_and_no_timer_is_left_running():
    handler = signal.getsignal(signal.SIGALRM)
    assert call_with_time_limit(lambda: 7, 5) == 7
    with pytest.raises(ZeroDivisionError):
        call_with_time_limit(lambda: 1 / 0, 5)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is handler


def test_no_limit_calls_directly():
    assert call_with_time_limit(lambda: threading.current_thread(), 0) is threading.main_thread()


def test_an_endless_loop_in_the_main_thread_is_interrupted():
    start = time.perf_counter()
    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(spin, 0.2)
    assert time.perf_counter() - start < 5


def test_outside_the_main_thread_the_caller_stops_waiting():
    outcome = {}

    def caller():
        try:
            call_with_time_limit(lambda: threading.Event().wait(3), 0.2)
        except TimeLimitExceeded:
            outcome["stopped"] = True
        outcome["value"] = call_with_time_limit(lambda: threading.current_thread().name, 5)

    worker = threading.Thread(target=caller)
    worker.start()
    worker.join(10)
    assert outcome == {"stopped": True, "value": "time-limited call"}
