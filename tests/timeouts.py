"""pytest-timeout's per-test SIGALRM timer, paused for setup that is not the test."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def outside_test_timeout() -> Iterator[None]:
    """pytest-timeout's SIGALRM timer paused, resumed afterwards with its remaining time.

    Setup such as a cold tools build (about 15 min on 2 cores), a cold base image or the trainer
    image rebuilt after a code change and imported into the node must not count against the
    per-test timeout of whichever test first asks for it.
    """
    paused = None
    if threading.current_thread() is threading.main_thread():
        paused = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if paused and paused[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *paused)
