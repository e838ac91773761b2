"""The loop's phases that are not steps, in one vocabulary, and the one place the loop enters them.

The ledger (``trainer.health.ledger``) times each phase into its buckets; the watchdog
(``trainer.health.watchdog``) stops its clock on every rank while one lasts. Each observes the
phases through ``phase(name, step)``, a context manager; :class:`Phases` enters a phase once for
all of them, in the order they were given, and leaves it in reverse.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

#: An evaluation (every rank, collective).
EVALUATION = "evaluation"
#: A save: the state gathered and copied off the device (the write runs in the background).
SAVE = "save"
#: The wait for the write still in flight, before the run says it is done and exits.
LAST_WRITE = "last write"

PHASES = (EVALUATION, SAVE, LAST_WRITE)


class Observer(Protocol):
    def phase(self, name: str, step: int) -> contextlib.AbstractContextManager:
        """Observe phase ``name`` at ``step`` for as long as the block runs."""


class Phases:
    """Enters a phase for every observer at once: ``with phases(EVALUATION, step): ...``."""

    def __init__(self, *observers: Observer):
        self.observers = observers

    @contextlib.contextmanager
    def __call__(self, name: str, step: int) -> Iterator[None]:
        assert name in PHASES, name
        with contextlib.ExitStack() as stack:
            for observer in self.observers:
                stack.enter_context(observer.phase(name, step))
            yield
