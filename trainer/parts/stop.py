"""Why a run stops before ``max_steps``: SIGTERM (preemption) or a loss that is not finite.

Both are decided together by every rank: the loop reads them from the step's ``[loss, stop]``
flags, which are reduced over the ranks with the gradients (``trainer.parts.step``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger(__name__)


class StopRequest:
    """SIGTERM's handler: only a flag, which the next step carries to every rank.

    It holds nothing else, so a handler left installed until the process group is gone keeps no
    trainer (and no DDP module, which holds the group) alive.
    """

    def __init__(self) -> None:
        self.requested = False

    def on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True


class NonfiniteSkips:
    """Steps skipped because their loss was NaN or inf, against ``max_nonfinite_skips``."""

    def __init__(self, budget: int):
        self.budget = budget
        self.count = 0

    def over_budget(self, loss: float, step: int) -> bool:
        """Count ``step`` if its loss is not finite; True once that is one skip too many."""
        if math.isfinite(loss):
            return False
        self.count += 1
        if self.count > self.budget:
            return True
        log.warning(
            "step %d: loss is %s; skipping this step (%d/%d)", step, loss, self.count, self.budget
        )
        return False

    def advice(self, loss: float, step: int) -> str:
        """The line that ends a run stopped by a non-finite loss."""
        return (
            f"step {step}: loss is {loss}; stopping (max_nonfinite_skips={self.budget}). "
            "Lower lr, raise warmup_steps or grad_clip, or try precision=bf16."
        )

    def state_dict(self) -> dict[str, Any]:
        return {"nonfinite_skips": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state.get("nonfinite_skips", 0)
