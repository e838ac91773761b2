"""A daemon thread that writes the newest of the values handed to it, so that the loop never waits
on the network or a disk: the ledger's record beside the checkpoints (``trainer.health.ledger``)
and the TrainJob's progress (``trainer.telemetry.progress_api``).

A value submitted while an older one still waits replaces it: only the newest is written. A rate
limit (``due``) holds a value until its time and then writes the newest; a heartbeat
(``heartbeat_s``, ``beat``) writes again, made from the last value, when nothing new came for
that long. The thread is a daemon: a run that ends never waits for it past :meth:`close`'s
timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class NewestWriter(Generic[T]):
    """Writes with ``write(value)`` in a daemon thread named ``name`` (``write`` handles its own
    errors: one that escapes ends the thread).

    - ``due(closing)``: the ``time.monotonic()`` before which no write starts (a rate limit),
      asked again whenever the thread wakes; ``closing`` says :meth:`close` was called.
    - ``heartbeat_s``, ``beat(last)``: when no value came for ``heartbeat_s``, the value
      ``beat`` makes from the last one written is written too (None: nothing to write).
    """

    def __init__(
        self,
        write: Callable[[T], None],
        *,
        name: str,
        due: Callable[[bool], float] | None = None,
        heartbeat_s: float | None = None,
        beat: Callable[[T], T | None] | None = None,
    ):
        self._write, self.due = write, due
        self.heartbeat_s, self.beat = heartbeat_s, beat
        self.pending: T | None = None  # the newest value not written yet
        self.writing: T | None = None  # the value being written now
        self.last: T | None = None  # the last value taken to be written
        #: How many times ``heartbeat_s`` passed with nothing new: the heartbeat's chances.
        self.beats = 0
        self.closing = self.stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, value: T) -> None:
        """Write ``value`` next (replacing one that still waits). Never blocks on the write."""
        with self._cond:
            if not (self.closing or self.stopped):
                self.pending = value
                self._cond.notify_all()

    def keep(self, value: T) -> None:
        """Write ``value`` again, unless a newer one came meanwhile (after a write that failed
        in a way that may pass)."""
        with self._cond:
            if self.pending is None and not self.stopped:
                self.pending = value

    def stop(self) -> None:
        """Write nothing more: the value waiting is dropped and the thread ends."""
        with self._cond:
            self.stopped, self.pending = True, None
            self._cond.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Write what waits (when it is due), then end; wait at most ``timeout_s``. True when
        the thread has ended."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds, checked after every write and heartbeat chance."""
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                value = self._next()
                if value is None:
                    if self.stopped or (self.closing and self.pending is None):
                        self._cond.notify_all()
                        return
                    continue
                self.writing = value
            try:
                self._write(value)
            finally:
                with self._cond:
                    self.writing = None
                    self._cond.notify_all()

    def _next(self) -> T | None:
        """Under the lock: the value to write now, or None (nothing, or a heartbeat with nothing
        to say: the caller looks again)."""
        idle = self.pending is None and not (self.closing or self.stopped)
        if idle and not self._cond.wait(self.heartbeat_s) and self.pending is None:
            # heartbeat_s passed and nothing came (a wait without a timeout never gets here)
            self.beats += 1
            self._cond.notify_all()
            if self.beat is not None and self.last is not None and not self.closing:
                return self.beat(self.last)
            return None
        if self.stopped or self.pending is None:
            return None
        while self.due is not None and not self.stopped:
            left = self.due(self.closing) - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)  # a newer value that comes meanwhile is the one written
        if self.stopped or self.pending is None:
            return None
        value, self.pending = self.pending, None
        self.last = value
        return value
