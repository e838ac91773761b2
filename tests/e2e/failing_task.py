"""A task plug-in that raises mid-training on one rank (``task=failing_task:build``, put on the
pods' volume by tests/e2e/helpers.plugin_on_claim): the job must end Failed and ``submit --wait``
must name the replica, exit code and last lines."""

from __future__ import annotations

import os
from typing import Any


def build(fail_at_call: int = 8, fail_rank: int = 0, **vision_args: Any):
    from trainer.tasks.vision import build as vision

    task = vision(**vision_args)
    loss = task.loss
    calls = {"n": 0}
    rank = int(os.environ.get("RANK", "0"))

    def failing_loss(model, batch):
        calls["n"] += 1
        if rank == fail_rank and calls["n"] >= fail_at_call:
            raise RuntimeError(f"injected failure at call {calls['n']} on rank {rank}")
        return loss(model, batch)

    task.loss = failing_loss
    return task
