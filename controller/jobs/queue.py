"""Where a job stands in its Kueue queue, read from the cluster: :func:`read_queue` fetches what
``controller.jobs.read.queue`` describes, and :class:`QueueNotes` says it as it changes (``wait``,
``--follow``). Nothing here polls: the queue is read when the job changes.
"""

from __future__ import annotations

from typing import Any

from controller.errors import ClusterError, Forbidden, NotFound
from controller.jobs.read.queue import (
    PENDING,
    PREEMPTED,
    QueueView,
    describe,
    is_true,
    preemption_line,
    preemptions,
    queue_name,
    queued,
    state,
    summary,
    workload_of,
)
from controller.kube.client import Cluster
from controller.kubeflow import CLUSTER_QUEUE, LOCAL_QUEUE, WORKLOAD


def read_queue(cluster: Cluster, job: dict[str, Any]) -> QueueView | None:
    """Fetch what :func:`describe` needs for ``job`` and describe it; None without a queue.

    Requests: the namespace's Workloads (one list), the LocalQueue, the ClusterQueue
    (cluster-scoped: skipped when the user may not read it), the Workload's events (only when
    it was preempted), and the visibility API's pending list (only while pending; a cluster
    that does not serve it answers 404 once)."""
    name = queue_name(job)
    if name is None:
        return None
    namespace = job["metadata"].get("namespace", "default")
    try:
        workloads = cluster.list_objects(WORKLOAD, namespace)
    except (NotFound, Forbidden) as e:
        view = QueueView(local_queue=name)
        view.problem = (
            "Kueue is not installed (the API server does not serve workloads)"
            if isinstance(e, NotFound)
            else f"cannot read it: RBAC forbids listing workloads in {namespace} (k8s/rbac.yaml "
            "grants it)"
        )
        return view
    local_queue, missing = None, False
    try:
        local_queue = cluster.get_object(LOCAL_QUEUE, name, namespace)
    except NotFound:
        missing = True
    except Forbidden:
        pass
    cq_name = (local_queue or {}).get("spec", {}).get("clusterQueue")
    wl = workload_of(job, workloads)
    admitted_cq = ((wl or {}).get("status", {}).get("admission") or {}).get("clusterQueue")
    cluster_queue = None
    if (cq_name or admitted_cq) and state(wl) == PENDING:
        cluster_queue = _get(cluster, CLUSTER_QUEUE, admitted_cq or cq_name)
    events: list[dict[str, Any]] = []
    if wl is not None and (preemptions(wl) or is_true(wl, PREEMPTED)):
        try:
            events = cluster.list_events(
                namespace, field_selector=f"involvedObject.name={wl['metadata']['name']}"
            )
        except ClusterError:
            events = []
    pending = None
    if wl is not None and state(wl) == PENDING:
        pending = cluster.pending_workloads(namespace, name)
    view = describe(
        job,
        workloads,
        local_queue=local_queue,
        cluster_queue=cluster_queue,
        events=events,
        pending=pending,
        local_queue_missing=missing,
    )
    return view


def _get(cluster: Cluster, api: Any, name: str, namespace: str | None = None) -> dict | None:
    try:
        return cluster.get_object(api, name, namespace)
    except (NotFound, Forbidden):
        return None


class QueueNotes:
    """Lines about a job's place in its queue, fed the job each time it changes (``wait``,
    ``--follow``): where it waits and for what when it is queued (again after a preemption),
    and by what it was admitted when Kueue starts it. Reads the queue only then, never on a
    timer. State across calls (was the job queued?), hence a class."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.was_queued = False
        self.last: str | None = None

    def see(self, job: dict[str, Any]) -> str | None:
        """The line to print for this version of ``job``, or None (nothing new)."""
        if queued(job):
            view = read_queue(self.cluster, job)
            line = summary(view) if view is not None else None
            preempted = preemption_line(view) if view is not None else None
            if line and preempted and not self.was_queued and view.state == PENDING:
                line += f" ({preempted})"  # queued again: say why
            self.was_queued = True
        elif self.was_queued and queue_name(job):
            self.was_queued = False
            view = read_queue(self.cluster, job)
            line = summary(view) if view is not None else None
        else:
            return None
        if line is None or line == self.last:
            return None
        self.last = line
        return line
