"""Wait for a job to end (or vanish) by watching it: no polling loop.

The watch resumes from the last resourceVersion after a dropped connection and re-lists on
410 Gone (``controller.kube.watch``), so an API server restart costs a reconnect, not the
answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from controller.errors import DdpjobError, NotFound
from controller.jobs.apis import PYTORCHJOB_KIND, JobKind
from controller.kube.client import Cluster
from controller.kube.watch import RESYNC

if TYPE_CHECKING:
    from controller.jobs.status import PodHistory

#: After the job ended, how long the pod recorder may take to finish what it was reading.
RECORDER_GRACE_S = 5.0


def job_count(etype: str, obj: dict[str, Any]) -> int | None:
    """After a (re-)list, how many jobs matched; None for ordinary events."""
    return obj.get("count") if etype == RESYNC else None


class WaitTimeout(DdpjobError):
    """The job did not end (or vanish, for ``delete``) within ``--timeout``."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        name: str,
        namespace: str,
        deleting: bool = False,
        pods_selector: str = "",
    ):
        super().__init__(message)
        self.name, self.namespace, self.deleting = name, namespace, deleting
        self.pods_selector = pods_selector  # the job's pods (deleting: what may be stuck)


def wait_for_job(
    cluster: Cluster,
    name: str,
    namespace: str,
    *,
    kind: JobKind = PYTORCHJOB_KIND,
    timeout_s: float | None = None,
    on_change: Callable[[dict[str, Any]], None] | None = None,
    history: PodHistory | None = None,
) -> dict[str, Any]:
    """Block until the job is Succeeded or Failed; returns the job. NotFound if it vanishes,
    WaitTimeout after ``timeout_s``. ``on_change(job)`` sees each new condition.

    With ``history``, a second watch records the job's pods meanwhile (their last state and the
    log tail of each failed run), for the failure report once pods are gone.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    seen = False
    recorder = _PodRecorder(cluster, kind, name, namespace, history, deadline)
    try:
        for etype, job in cluster.watch(
            "job",
            namespace,
            field_selector=f"metadata.name={name}",
            deadline=deadline,
            api=kind.api,
        ):
            if etype == RESYNC:
                if job_count(etype, job) == 0:
                    if not seen:
                        cluster.get_job(name, namespace, api=kind.api)  # NotFound, as said
                    raise NotFound(f"wait: job {namespace}/{name} was deleted before it ended")
                continue
            if etype == "DELETED":
                raise NotFound(f"wait: job {namespace}/{name} was deleted before it ended")
            seen = True
            cond = kind.condition(job)
            if cond != last and on_change is not None:
                on_change(job)
            last = cond
            if kind.terminal(job):
                return job
    finally:
        recorder.stop()
    raise WaitTimeout(
        f"wait: job {namespace}/{name} has not ended after {timeout_s:g} s (got {last})",
        name=name,
        namespace=namespace,
    )


def wait_deleted(
    cluster: Cluster,
    name: str,
    namespace: str,
    *,
    kind: JobKind = PYTORCHJOB_KIND,
    timeout_s: float | None = None,
) -> None:
    """Block until the job object is gone, then its pods (watched both times).

    Foreground deletion removes the pods first only where every owner reference on the way
    blocks its owner's deletion; a TrainJob's JobSet, Job and pods may outlive it, and pods take
    their grace period to stop. A kind whose controller can create the pods again after that
    (``pods_recreated_within_s``) is watched that long after its pods are gone, and waited for
    again if any come. "Deleted, and its pods" must be true when this returns."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    gone = False
    for etype, obj in cluster.watch(
        "job", namespace, field_selector=f"metadata.name={name}", deadline=deadline, api=kind.api
    ):
        if etype == "DELETED" or job_count(etype, obj) == 0:
            gone = True
            break
    if gone and _pods_gone(cluster, kind, name, namespace, deadline):
        return
    what = "still exists" if not gone else "is gone, but some of its pods are not"
    raise WaitTimeout(
        f"delete: job {namespace}/{name} {what} after {timeout_s:g} s "
        "(its pods may be stuck terminating)",
        name=name,
        namespace=namespace,
        deleting=True,
        pods_selector=kind.pods_selector(name),
    )


def _pods_gone(
    cluster: Cluster, kind: JobKind, name: str, namespace: str, deadline: float | None
) -> bool:
    """Watch the job's pods until there are none (and none came again for
    ``kind.pods_recreated_within_s``): True, or False at ``deadline``."""
    pods: set[str] = set()
    quiet_until: float | None = None  # no pods since; done if none comes by then
    while deadline is None or time.monotonic() < deadline:
        until = deadline
        if quiet_until is not None:
            until = quiet_until if deadline is None else min(deadline, quiet_until)
        for etype, obj in cluster.watch(
            "pod", namespace, selector=kind.pods_selector(name), deadline=until
        ):
            # A (re-)list reports what vanished as DELETED and what is there as ADDED, then
            # RESYNC: the set is right after each event.
            if etype == "DELETED":
                pods.discard(obj["metadata"]["name"])
            elif etype != RESYNC:
                pods.add(obj["metadata"]["name"])
            if pods:
                quiet_until = None
            elif etype in (RESYNC, "DELETED"):
                if not kind.pods_recreated_within_s:
                    return True
                if quiet_until is None:
                    quiet_until = time.monotonic() + kind.pods_recreated_within_s
                    break  # watch again, until the quiet time is up
        else:  # the watch ended at `until`
            if quiet_until is not None and time.monotonic() >= quiet_until:
                return True
    return False


class _PodRecorder:
    """A thread watching the job's pods into a PodHistory (nothing without one)."""

    def __init__(
        self,
        cluster: Cluster,
        kind: JobKind,
        name: str,
        namespace: str,
        history: PodHistory | None,
        deadline: float | None,
    ):
        self.history = history
        self._stopped = threading.Event()
        self._busy = threading.Lock()
        if history is None:
            return
        self._thread = threading.Thread(
            target=self._run,
            args=(cluster, kind.pods_selector(name), namespace, deadline),
            daemon=True,
            name="record-pods",
        )
        self._thread.start()

    def _run(self, cluster: Cluster, selector: str, namespace: str, deadline: float | None):
        assert self.history is not None
        try:
            for etype, pod in cluster.watch("pod", namespace, selector=selector, deadline=deadline):
                if self._stopped.is_set():
                    return
                if etype != RESYNC:
                    with self._busy:
                        self.history.see(cluster, pod, namespace)
        except DdpjobError:
            return  # the record is a help for the report, never a reason to fail the wait

    def stop(self) -> None:
        """Stop recording; wait (briefly) for a log tail being read right now."""
        self._stopped.set()
        if self._busy.acquire(timeout=RECORDER_GRACE_S):
            self._busy.release()
