"""When the loop checkpoints, and what: every ``checkpoint.every_steps`` steps and at the end of a
run that did not fail, the state its parts compose; and the ``checkpoint`` event once a save is
complete. Where and how the state is stored (in the background, a manifest last, keep-last-k,
fallback on resume) is ``trainer.checkpoint.manager``'s.

A save whose write failed (after the store's retries) is a ``checkpoint_failed`` event and a
warning that says where and what the server answered; training goes on and the next save is
tried. ``max_failed_saves`` of them in a row (0: never), or a failed last save of a run that
completed (its result would be lost), raise SavesFailed: the job restarts
(``trainer.health.restart``) from the last checkpoint that is complete.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from trainer.checkpoint.manager import CheckpointManager
from trainer.contract import CHECKPOINT, CHECKPOINT_FAILED

log = logging.getLogger(__name__)


class SavesFailed(Exception):
    """Saves failed ``max_failed_saves`` times in a row, or the last save of a run that
    completed: the job should restart from its last complete checkpoint. Its text says why."""


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
        max_failed_saves: int = 0,
    ):
        self.storage, self.report = storage, report
        self.every_steps = every_steps
        self.saved_step = saved_step  # the step the newest checkpoint holds, if it is this run's
        self.max_failed_saves = max_failed_saves
        self.failed_in_row = 0

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

    def report_completed(self, wait: bool = False, final: bool = False) -> None:
        """A ``checkpoint`` event for each save that completed, a ``checkpoint_failed`` event
        for each that failed (``wait``: once the save in flight has). Raises SavesFailed when
        ``max_failed_saves`` failed in a row, or (``final``: the run completed) the last one."""
        for fields in self.storage.flush() if wait else self.storage.completed():
            if "error" not in fields:
                self.failed_in_row = 0
                self.report.event(CHECKPOINT, **fields)
                continue
            self.failed_in_row += 1
            self._failed(fields, final)

    def _failed(self, fields: dict[str, Any], final: bool, quiet: bool = False) -> None:
        limit = self.max_failed_saves
        self.report.event(
            CHECKPOINT_FAILED, **fields, failed_in_row=self.failed_in_row, limit=limit
        )
        log.warning(
            "checkpoint: cannot write step %d (%s); %d in a row%s",
            fields["step"],
            fields["error"],
            self.failed_in_row,
            "" if final else "; training goes on and the next save is tried",
        )
        if self.saved_step == fields["step"]:
            self.saved_step = None  # no checkpoint holds it: the run's last save tries again
        if quiet:
            return
        if limit and final:
            raise SavesFailed(
                f"checkpoint: the last save, of step {fields['step']}, failed: {fields['error']}"
            )
        if limit and self.failed_in_row >= limit:
            raise SavesFailed(
                f"checkpoint: {self.failed_in_row} saves in a row failed, the last of step "
                f"{fields['step']}: {fields['error']}"
            )

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for the save in flight (at most ``timeout_s``) on a path that may be failing
        already: each outcome is reported, as by :meth:`report_completed`, and none raises."""
        for fields in self.storage.flush(timeout_s):
            if "error" in fields:
                self.failed_in_row += 1
                self._failed(fields, final=False, quiet=True)
            else:
                self.failed_in_row = 0
                self.report.event(CHECKPOINT, **fields)
