"""When the loop checkpoints, and what: every ``checkpoint.every_steps`` steps and at the end of a
run that did not fail, the state its parts compose; and the ``checkpoint`` event once a save is
complete. Where and how the state is stored (in the background, a manifest last, keep-last-k,
fallback on resume) is ``trainer.checkpoint.manager``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from trainer.checkpoint.manager import CheckpointManager
from trainer.contract import CHECKPOINT


class _Events(Protocol):
    """Where the ``checkpoint`` event goes (rank 0's reporter)."""

    def event(self, name: str, **fields: Any) -> None: ...


class CheckpointCadence:
    """The save cadence over a :class:`CheckpointManager`, and the ``checkpoint`` event."""

    def __init__(
        self,
        storage: CheckpointManager,
        report: _Events,
        *,
        every_steps: int,
        saved_step: int | None,
    ):
        self.storage, self.report = storage, report
        self.every_steps = every_steps
        self.saved_step = saved_step  # the step the newest checkpoint holds, if it is this run's

    def should_save(self, step: int, last: bool = False) -> bool:
        """Whether to save at ``step``: on the cadence, or as the ``last`` step of the run when
        no checkpoint holds it yet."""
        if last:
            return step != self.saved_step
        return bool(self.every_steps) and step % self.every_steps == 0

    def save(self, step: int, state_dict: Callable[[], dict[str, Any] | None]) -> None:
        """Checkpoint now, on every rank (``state_dict`` is collective: rank 0's state, None
        elsewhere). The step pays for the copy off the device; the write runs in the
        background and :meth:`report_completed` reports it once it is complete."""
        self.storage.save(step, state_dict)
        self.saved_step = step

    def report_completed(self, wait: bool = False) -> None:
        """A ``checkpoint`` event for each save that completed (``wait``: once the save in
        flight has). Raises trainer.checkpoint.manager.CheckpointError if a write failed."""
        for fields in self.storage.flush() if wait else self.storage.completed():
            self.report.event(CHECKPOINT, **fields)

    def close(self) -> None:
        """Wait for the save in flight on a path that may be failing already: a failed write
        is logged, not raised; a completed one is reported."""
        for fields in self.storage.close():
            self.report.event(CHECKPOINT, **fields)
