"""When the loop checkpoints, and what: every ``checkpoint.every_steps`` steps and at the end of a
run that did not fail, the state its parts compose. Where and how the state is stored (atomic
writes, keep-last-k, fallback on resume) is ``trainer.checkpoint``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.checkpoint import CheckpointManager
from trainer.contract import CHECKPOINT
from trainer.metrics import Reporter


class Checkpointer:
    """The save cadence over a :class:`CheckpointManager`, and the ``checkpoint`` event."""

    def __init__(
        self,
        storage: CheckpointManager,
        report: Reporter,
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

    def save(self, step: int, state: dict[str, Any] | None) -> Path:
        """Checkpoint ``state`` (rank 0's; None elsewhere) now, on every rank, and report it."""
        path = self.storage.save(state, step)
        self.saved_step = step
        self.report.event(CHECKPOINT, step=step, path=str(path))
        return path
