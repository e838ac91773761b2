"""A user's own task, in a project of its own that the image does not hold: the e2e tests of a
job that heals itself (tests/e2e/test_stuck.py, test_heal.py) ship it with the job as its
workdir (``task: hangtask:build``).

The ``vision`` task with a training set of its own making that one rank's reads can slow down
(``slow_s`` per sample on ``slow_rank``: a straggler) and stall (on ``hang_rank``, its
``hang_at``-th read waits in :func:`_stuck_here` for ``hang_s``): a data set that hangs, as one
on a stuck network file system does. With ``hang_once`` (a file on a volume the pods share) it
hangs in the job's first run only: it makes the file first, and a run that finds it reads on.
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
    """``inner``'s samples, read slowly or stalling as asked, on this rank."""

    def __init__(self, inner: Dataset, *, slow_s: float, hang_at: int, hang_s: float, once: str):
        self.inner, self.slow_s, self.hang_at, self.hang_s = inner, slow_s, hang_at, hang_s
        self.once = Path(once) if once else None
        self.reads = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        if self.slow_s:
            time.sleep(self.slow_s)
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
            slow_s=slow_s if rank == slow_rank else 0.0,
            hang_at=hang_at,
            hang_s=hang_s if rank == hang_rank else 0.0,
            once=hang_once,
        )
        return stalling, evaluation

    task.build_datasets = build_datasets
    return task
