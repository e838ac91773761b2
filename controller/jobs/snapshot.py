"""One job as one command reads it: the job, its pods, the namespace's events, its Kueue
Workloads, rank 0's pod and the tail of its log, each fetched once, on first use, then read (as
a kr8s object is fetched by ``refresh`` and then read). Every reader of the command takes the
:class:`Snapshot`, never the cluster, for these: ``status`` asks the API server for each once
(``tests/e2e/test_status_reads.py`` counts its requests), and a reader that needs only some
(the failure report: the pods and the events) reads only those.

A read that fails stays failed: each reader that asks again gets the same error, with no second
request, and decides whether it can do without (the queue says Kueue is missing, goodput leaves
the events out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from controller.errors import ClusterError
from controller.jobs.find import find_job
from controller.jobs.rank0 import rank0_pod
from controller.jobs.read.apis import JobKind
from controller.jobs.read.explain import job_kind
from controller.jobs.read.loglines import split_timestamp
from controller.jobs.read.trainer_events import TrainerEvents
from controller.kube.client import Cluster
from controller.kubeflow import WORKLOAD

#: Rank 0's log lines read at first: enough for its progress, its verdicts, its last checkpoint
#: and its newest ``goodput`` event (one is printed every window).
TAIL_LINES = 500

T = TypeVar("T")


class Snapshot:
    """The job ``job`` (of ``kind``: by its apiVersion and kind when not given) on ``cluster``;
    ``pods`` and ``events``, where the caller has read them already."""

    def __init__(
        self,
        cluster: Cluster,
        job: dict[str, Any],
        kind: JobKind | None = None,
        *,
        pods: list[dict[str, Any]] | None = None,
        events: list[dict[str, Any]] | None = None,
    ):
        self.cluster, self.job = cluster, job
        self.kind = kind or job_kind(job)
        self.name: str = job["metadata"]["name"]
        self.namespace: str = job["metadata"].get("namespace", "default")
        # what -> (the value, or the error its read raised)
        self._read: dict[Any, tuple[Any, ClusterError | None]] = {}
        if pods is not None:
            self._read["pods"] = (pods, None)
        if events is not None:
            self._read["events"] = (events, None)

    @classmethod
    def find(
        cls, cluster: Cluster, name: str, namespace: str, api: str | None = None, *, where: str
    ) -> Snapshot:
        """The snapshot of the job ``namespace/name`` in whichever API has it
        (``controller.jobs.find``; ``where`` starts its errors)."""
        kind, job = find_job(cluster, name, namespace, api, where=where)
        job.setdefault("metadata", {}).setdefault("namespace", namespace)
        return cls(cluster, job, kind)

    def _once(self, what: Any, read: Callable[[], T]) -> T:
        if what not in self._read:
            try:
                self._read[what] = (read(), None)
            except ClusterError as e:
                self._read[what] = (None, e)
        value, error = self._read[what]
        if error is not None:
            raise error
        return value

    def pods(self) -> list[dict[str, Any]]:
        """Every pod of the job (``kind.pods_selector``)."""
        selector = self.kind.pods_selector(self.name)
        return self._once("pods", lambda: self.cluster.list_pods(self.namespace, selector))

    def events(self) -> list[dict[str, Any]]:
        """The namespace's events: each reader picks its own (the job's, its pods', its
        Workload's)."""
        return self._once("events", lambda: self.cluster.list_events(self.namespace))

    def events_of(self, name: str) -> list[dict[str, Any]]:
        """The events about the object ``name`` (the job's own, a Workload's); none where the
        events cannot be read (they only explain)."""
        try:
            events = self.events()
        except ClusterError:
            return []
        return [e for e in events if e.get("involvedObject", {}).get("name") == name]

    def workloads(self) -> list[dict[str, Any]]:
        """The namespace's Kueue Workloads (NotFound where Kueue is not installed)."""
        return self._once("workloads", lambda: self.cluster.list_objects(WORKLOAD, self.namespace))

    def rank0(self) -> dict[str, Any] | None:
        """The pod of global rank 0 (``controller.jobs.rank0``), found among :meth:`pods`; in
        an elastic job, the worker whose log tail has the newest event (each tail read once:
        rank 0's is kept as :meth:`tail`)."""
        return self._rank0()[0]

    def _rank0(self) -> tuple[dict[str, Any] | None, list[str] | None]:
        return self._once(
            "rank0",
            lambda: rank0_pod(
                self.cluster,
                self.namespace,
                self.job,
                self.kind,
                pods=self.pods(),
                tail_lines=TAIL_LINES,
            ),
        )

    def tail(self, lines: int = TAIL_LINES) -> list[str]:
        """The last ``lines`` lines of rank 0's log, each with its timestamp (none without a
        rank 0, or while its pod is Pending). More lines than read so far are a second read of
        that log, kept in turn."""
        pod, found = self._rank0()
        if pod is None or pod.get("status", {}).get("phase") == "Pending":
            return []
        if found is not None and lines <= TAIL_LINES:
            return found
        read = max(lines, TAIL_LINES)
        text = self._once(("tail", read), lambda: self._read_log(pod, read))
        return text.splitlines()[-lines:] if lines else []

    def previous_tail(self) -> list[str]:
        """The last :data:`TAIL_LINES` lines of rank 0's run before this one (its container
        before the last restart), each with its timestamp; none where there was none."""
        pod = self.rank0()
        if pod is None or pod.get("status", {}).get("phase") == "Pending":
            return []
        try:
            return self._once(
                "previous", lambda: self._read_log(pod, TAIL_LINES, previous=True)
            ).splitlines()
        except ClusterError:
            return []

    def _read_log(self, pod: dict[str, Any], lines: int, *, previous: bool = False) -> str:
        return self.cluster.read_log(
            pod["metadata"]["name"],
            self.namespace,
            container=self.kind.container,
            tail_lines=lines,
            timestamps=True,
            previous=previous,
        )

    def trainer(self) -> TrainerEvents:
        """What rank 0's :meth:`tail` says (the trainer's events); nothing where the log cannot
        be read."""
        return self._once("trainer", self._trainer)

    def _trainer(self) -> TrainerEvents:
        events = TrainerEvents()
        try:
            tail = self.tail()
        except ClusterError:
            return events
        pod = self.rank0()
        name = pod["metadata"]["name"] if pod is not None else None
        events.see_lines([split_timestamp(line)[1] for line in tail], pod=name)
        return events
