"""A user's own task, in a project of its own that the image does not hold: the e2e tests of a
job that heals itself (tests/e2e/test_stuck.py, test_heal.py) ship it with the job as its
workdir (``task: hangtask:build``).

The ``vision`` task whose loss one rank computes more slowly (``slow_s`` a step on
``slow_rank``: a straggler, as a slower GPU is), with a training set of its own making whose
reads stall on one rank (on ``hang_rank``, its ``hang_at``-th read waits in :func:`_stuck_here`
for ``hang_s``): a data set that hangs, as one on a stuck network file system does. With
``hang_once`` (a file on a volume the pods share) it hangs in the job's first run only: it makes
the file first, and a run that finds it reads on.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

#: What :func:`_stuck_here` prints on stderr first, then the time (seconds since the epoch).
HANGS = "hangtask: hanging from"


def _stuck_here(seconds: float) -> None:
    """Where a hung rank is: the watchdog names this function."""
    print(f"{HANGS} {time.time():.3f}", file=sys.stderr, flush=True)
    time.sleep(seconds)


class Stalling(Dataset):
    """``inner``'s samples, stalling as asked, on this rank."""

    def __init__(self, inner: Dataset, *, hang_at: int, hang_s: float, once: str):
        self.inner, self.hang_at, self.hang_s = inner, hang_at, hang_s
        self.once = Path(once) if once else None
        self.reads = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        if self.hang_s and self.reads == self.hang_at and self._first_time():
            _stuck_here(self.hang_s)
        return self.inner[i]

    def _first_time(self) -> bool:
        if self.once is None:
            return True
        try:
            self.once.touch(exist_ok=False)
        except FileExistsError:
            return False
        return True


def build(
    slow_rank: int | None = None,
    slow_s: float = 0.0,
    hang_rank: int | None = None,
    hang_at: int = 0,
    hang_s: float = 0.0,
    hang_once: str = "",
    **vision_args: Any,
):
    from trainer.tasks.vision import build as vision

    task = vision(**vision_args)
    rank = int(os.environ.get("RANK", "0"))
    datasets = task.build_datasets

    def build_datasets():
        train, evaluation = datasets()
        stalling = Stalling(
            train,
            hang_at=hang_at,
            hang_s=hang_s if rank == hang_rank else 0.0,
            once=hang_once,
        )
        return stalling, evaluation

    task.build_datasets = build_datasets
    if rank == slow_rank and slow_s:
        loss = task.loss

        def slow_loss(model, batch):
            if model.training:
                time.sleep(slow_s)
            return loss(model, batch)

        task.loss = slow_loss
    return task
