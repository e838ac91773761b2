"""Wait for a job to end (or vanish) by watching it: no polling loop.

The watch resumes from the last resourceVersion after a dropped connection and re-lists on
410 Gone (``controller.kube.watch``), so an API server restart costs a reconnect, not the
answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from controller.errors import DdpjobError, NotFound
from controller.jobs.explain import job_condition, job_terminal
from controller.kube.client import Cluster
from controller.kube.watch import RESYNC


def job_count(etype: str, obj: dict[str, Any]) -> int | None:
    """After a (re-)list, how many jobs matched; None for ordinary events."""
    return obj.get("count") if etype == RESYNC else None


class WaitTimeout(DdpjobError):
    """The job did not end (or vanish, for ``delete``) within ``--timeout``."""

    exit_code = 1

    def __init__(self, message: str, *, name: str, namespace: str, deleting: bool = False):
        super().__init__(message)
        self.name, self.namespace, self.deleting = name, namespace, deleting


def wait_for_job(
    cluster: Cluster,
    name: str,
    namespace: str,
    *,
    timeout_s: float | None = None,
    on_change: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Block until the job is Succeeded or Failed; returns the job. NotFound if it vanishes,
    WaitTimeout after ``timeout_s``. ``on_change(job)`` sees each new condition."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    seen = False
    for etype, job in cluster.watch(
        "job", namespace, field_selector=f"metadata.name={name}", deadline=deadline
    ):
        if etype == RESYNC:
            if job_count(etype, job) == 0:
                if not seen:
                    cluster.get_job(name, namespace)  # NotFound, in the API's words
                raise NotFound(f"wait: job {namespace}/{name} was deleted before it ended")
            continue
        if etype == "DELETED":
            raise NotFound(f"wait: job {namespace}/{name} was deleted before it ended")
        seen = True
        cond = job_condition(job)
        if cond != last and on_change is not None:
            on_change(job)
        last = cond
        if job_terminal(job):
            return job
    raise WaitTimeout(
        f"wait: job {namespace}/{name} has not ended after {timeout_s:g} s (got {last})",
        name=name,
        namespace=namespace,
    )


def wait_deleted(
    cluster: Cluster, name: str, namespace: str, *, timeout_s: float | None = None
) -> None:
    """Block until the job object is gone (with Foreground deletion: after its pods)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for etype, obj in cluster.watch(
        "job", namespace, field_selector=f"metadata.name={name}", deadline=deadline
    ):
        if etype == "DELETED" or job_count(etype, obj) == 0:
            return
    raise WaitTimeout(
        f"delete: job {namespace}/{name} still exists after {timeout_s:g} s "
        "(its pods may be stuck terminating)",
        name=name,
        namespace=namespace,
        deleting=True,
    )
