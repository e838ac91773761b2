"""One job as its watches show it: the job, its pods, its events and what its pods went
through, kept current by folding in the watch stream one item at a time, and what the trainer's
events say, fed by whoever reads a log of the job (``status``: rank 0's tail). ``wait``,
``--follow`` and ``status`` read this one view; what they say about it is read from it by the
readers beside it (``why``, ``explain``, ``queue``).

The stream is what ``controller.jobs.watches`` hands over, ``(what, etype, obj)``: ``what`` is
the watch (``JOB``, ``POD``, ``EVENT``), ``etype`` and ``obj`` what ``controller.kube.watch``
yields (ADDED, MODIFIED, DELETED, or RESYNC with ``{"count": n}`` after each (re-)list); or
``(LOG, pod, {"lines": [...]})``, lines of rank 0's log that a follower read (``wait`` follows
it quietly, for the trainer's verdict on a job that makes no progress); or
``(ERROR, what, {"error": exc})`` when a watch failed. ``status`` feeds it one snapshot instead
(:meth:`JobView.of`).

Pure: no clock, no API. A new thing to know about a job is a new reader of this view (or, for
what the trainer prints, of :attr:`JobView.trainer`), not another loop over the stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.jobs.read.apis import JobKind
from controller.jobs.read.explain import job_events
from controller.jobs.read.history import FailedRun, RunHistory
from controller.jobs.read.queue import workload_event
from controller.jobs.read.trainer_events import TrainerEvents
from controller.kube.watch import RESYNC

#: The watches of a job (the ``what`` of an item), rank 0's log, and the item of a watch that
#: failed.
JOB, POD, EVENT, LOG, ERROR = "job", "pod", "event", "log", "error"
DELETED = "DELETED"


@dataclass(frozen=True)
class Change:
    """What one item changed: ``what`` (``JOB``, ``POD``, ``EVENT``) and, for a pod whose
    training container just failed, that run (its log tail is worth reading now)."""

    what: str
    failed_run: FailedRun | None = None


class JobView:
    """The job ``name`` (of ``kind``) as last seen: :attr:`job`, its live :attr:`pods` by UID,
    its :attr:`events` (the job's, its controllers' objects' and its Kueue Workload's), the
    :attr:`history` of its pods
    (every pod's last state, each failed run), what the :attr:`trainer` said, and whether the
    job is :attr:`gone`."""

    def __init__(self, kind: JobKind, name: str, *, history: RunHistory | None = None):
        self.kind, self.name = kind, name
        self.job: dict[str, Any] | None = None
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.events: dict[str, dict[str, Any]] = {}  # uid -> the event as last seen
        self.history = history if history is not None else RunHistory()
        self.trainer = TrainerEvents()
        self.seen = False  # the job has been seen
        self.gone = False  # the job was deleted, or a list found none
        self.pods_listed = False  # the pod watch's first list is in

    @classmethod
    def of(
        cls,
        kind: JobKind,
        job: dict[str, Any],
        pods: list[dict[str, Any]],
        events: list[dict[str, Any]] | None = None,
        *,
        trainer: TrainerEvents | None = None,
    ) -> JobView:
        """The view of one read: the job, its pods, (when read) the namespace's events and
        (when read) what the trainer's events in a log of the job say."""
        view = cls(kind, job["metadata"]["name"])
        if trainer is not None:
            view.trainer = trainer
        view.apply(JOB, "ADDED", job)
        for pod in pods:
            view.apply(POD, "ADDED", pod)
        view.apply(POD, RESYNC, {"count": len(pods)})
        view.see_events(events or [])
        return view

    def see_events(self, events: list[dict[str, Any]]) -> None:
        """Fold in events read at once (the job's are kept)."""
        for event in events:
            self.apply(EVENT, "ADDED", event)

    def apply(self, what: str, etype: str, obj: dict[str, Any]) -> Change | None:
        """Fold one item of the stream in; what it changed (None: nothing of this job's). The
        error of a watch that failed is raised."""
        if what == ERROR:
            raise obj["error"]
        if what == LOG:
            self.trainer.see_lines(obj["lines"], pod=etype or None)
            return Change(LOG)
        if what == JOB:
            if etype == DELETED or (etype == RESYNC and not obj.get("count")):
                self.gone = True
            elif etype != RESYNC:
                self.job, self.seen = obj, True
            else:
                return None
            return Change(JOB)
        if what == POD:
            if etype == RESYNC:
                self.pods_listed = True
                return Change(POD)
            uid = _key(obj, self.pods)
            if etype == DELETED:
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = obj
            return Change(POD, self.history.record(obj))  # a deleted pod's last state too
        if what == EVENT and etype != RESYNC and self._mine(obj):
            uid = _key(obj, self.events)
            if etype == DELETED:
                self.events.pop(uid, None)
            else:
                self.events[uid] = obj
            return Change(EVENT)
        return None

    def _mine(self, event: dict[str, Any]) -> bool:
        """The event is about the job, what its controllers made, or its Kueue Workload."""
        return bool(job_events(self.name, [event])) or workload_event(
            self.kind.api.kind, self.name, event
        )

    @property
    def condition(self) -> str | None:
        """The job's state in one word (``JobKind.condition``); None before it is seen."""
        return self.kind.condition(self.job) if self.job is not None else None

    @property
    def terminal(self) -> str | None:
        """``Succeeded`` or ``Failed`` once the job has ended, else None."""
        return self.kind.terminal(self.job) if self.job is not None else None

    def pod_list(self) -> list[dict[str, Any]]:
        return list(self.pods.values())

    def event_list(self) -> list[dict[str, Any]]:
        return list(self.events.values())


def _key(obj: dict[str, Any], known: dict[str, dict[str, Any]]) -> str:
    """The object's UID; a dict without one (written by hand, never served) gets a key of its
    own."""
    meta = obj.get("metadata", {})
    return meta.get("uid") or meta.get("name") or f"#{len(known)}"
