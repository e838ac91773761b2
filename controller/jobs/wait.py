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
from controller.jobs.follow import RankFollower
from controller.jobs.read.apis import PYTORCHJOB_KIND, JobKind
from controller.jobs.read.explain import is_elastic
from controller.jobs.read.history import RunHistory
from controller.jobs.read.view import POD, JobView
from controller.jobs.read.why import Waiting, WaitNotes
from controller.jobs.watches import JobWatch
from controller.kube.client import Cluster
from controller.kube.watch import RESYNC
from controller.progress import describe

#: Of rank 0's runs already there when ``wait`` starts, the lines it reads for verdicts.
TAIL_LINES = 200


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
    history: RunHistory | None = None,
    say: Callable[[str], None] | None = None,
    where: str = "wait",
) -> dict[str, Any]:
    """Block until the job is Succeeded or Failed; returns the job. NotFound if it vanishes,
    WaitTimeout after ``timeout_s`` (with what keeps the job from running). ``on_change(job)``
    sees each new condition.

    The job, its pods and the namespace's events are watched (``JobWatch``) and the job's view
    is tested after each change. With ``say``, why the job does not run is said as it changes
    (``controller.jobs.read.why.WaitNotes``: a problem at once, a step once it lasts), and what
    the trainer says ails the running job as it comes: rank 0's log is followed quietly, into
    the view, for its verdict on a rank that is stuck (and that the job moves again) and its
    stragglers (``controller.progress.describe``). With ``history``, the pods are recorded
    meanwhile (their last state, and with a ``PodHistory`` the log tail of each failed run), for
    the failure report once pods are gone. ``where`` starts the timeout's message (the
    command).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = None
    next_note: float | None = None
    view = JobView(kind, name, history=history)
    notes = WaitNotes(kind, name, view=view)
    rank0: RankFollower | None = None
    alerts = 0  # of view.trainer.alerts, those said
    with JobWatch(cluster, view, namespace, deadline=deadline) as watch:
        try:
            while not watch.expired():
                change = watch.next(until=next_note)
                if view.gone:
                    if not view.seen:
                        cluster.get_job(name, namespace, api=kind.api)  # NotFound, as said
                    raise NotFound(f"wait: job {namespace}/{name} was deleted before it ended")
                if view.job is not None and view.condition != last:
                    last = view.condition
                    if on_change is not None:
                        on_change(view.job)
                if view.terminal:
                    return view.job
                if say is None:
                    continue
                if rank0 is None and view.job is not None:
                    rank0 = _rank0_quietly(cluster, view, watch, namespace)
                    rank0.see_pods()
                elif rank0 is not None and change is not None and change.what == POD:
                    rank0.see_pods()
                for event in view.trainer.alerts[alerts:]:
                    say(f"job {name}: {describe(event)}")
                alerts = len(view.trainer.alerts)
                lines, next_note = notes.due(time.monotonic())
                for line in lines:
                    say(f"job {name}: {line}")
        finally:
            if rank0 is not None:
                rank0.stop()
    raise timeout_error(where, namespace, name, timeout_s, last, notes.current())


def _rank0_quietly(
    cluster: Cluster, view: JobView, watch: JobWatch, namespace: str
) -> RankFollower:
    """A follower of rank 0's log that prints nothing: its lines go into ``view`` through
    ``watch``, where the trainer's events are read (``view.trainer``)."""
    assert view.job is not None
    return RankFollower(
        cluster,
        namespace,
        view.name,
        0,
        watch.put_log,
        lambda _: None,  # re-attaching to a log is the follower's business, not wait's
        view.kind,
        elastic=is_elastic(view.job),
        tail_lines=TAIL_LINES,
        view=view,
        final_reads=False,
    )


def timeout_error(
    where: str,
    namespace: str,
    name: str,
    timeout_s: float | None,
    state: str | None,
    waiting: list[Waiting],
) -> WaitTimeout:
    """``--timeout`` is over: the job's state and, first thing, what keeps it from running
    (problems before steps); each further reason on a line of its own."""
    ordered = sorted(waiting, key=lambda w: not w.problem)
    head = f"{where}: job {namespace}/{name} has not ended after {timeout_s or 0:g} s (got {state}"
    head += f"; {ordered[0].line()})" if ordered else ")"
    return WaitTimeout(
        "\n".join([head, *(f"  and {w.line()}" for w in ordered[1:])]),
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
