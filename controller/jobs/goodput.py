"""A job's goodput, read from its snapshot: :func:`read_goodput` takes what
``controller.jobs.read.goodput`` adds up (the job's events, its Kueue Workload, its pods, and
the trainer's newest ``goodput`` event from rank 0's log) and adds it up.
"""

from __future__ import annotations

import time
from typing import Any

from controller.errors import ClusterError
from controller.jobs.read.goodput import account, newest_ledger
from controller.jobs.read.loglines import split_timestamp
from controller.jobs.read.queue import queue_name, workload_of
from controller.jobs.snapshot import Snapshot
from trainer.contract import GOODPUT, parse_event


def read_goodput(snap: Snapshot, *, price_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """The accounting of the snapshot's job (``controller.jobs.read.goodput.account``)."""
    return account(
        snap.kind,
        snap.job,
        snap.pods(),
        ledger=_ledger(snap),
        events=snap.events_of(snap.name),
        workload=_workload(snap),
        now=time.time(),
        price_per_gpu_hour=price_per_gpu_hour,
    )


def _ledger(snap: Snapshot) -> dict[str, Any] | None:
    """The newest ``goodput`` event in rank 0's log; in the run before, when the current one
    has not printed one yet (a container just restarted)."""
    found = snap.trainer().newest(GOODPUT)
    if found is not None:
        return found
    events = [e for line in snap.previous_tail() if (e := parse_event(split_timestamp(line)[1]))]
    return newest_ledger(events)


def _workload(snap: Snapshot) -> dict[str, Any] | None:
    if queue_name(snap.job) is None:
        return None
    try:
        return workload_of(snap.job, snap.workloads())
    except ClusterError:  # no Kueue, or RBAC: the events still tell
        return None
