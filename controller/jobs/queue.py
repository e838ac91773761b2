"""Where a job stands in its Kueue queue, read from the cluster: :func:`read_queue` takes what
``controller.jobs.read.queue`` describes from the job's snapshot and the cluster,
:func:`integration` whether Kueue manages the job's kind at all, and :class:`QueueNotes` says it
as it changes (``wait``, ``--follow``). Nothing here polls: the queue is read when the job
changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.errors import ClusterError, DdpjobError, Forbidden, NotFound
from controller.jobs.read.queue import (
    ADMITTED_STATE,
    CONFIG_KEY,
    CONFIG_MAP_NAME,
    CONFIG_MAP_NAMESPACE,
    PENDING,
    PREEMPTED,
    QueueView,
    config_text,
    describe,
    framework,
    integration_probe,
    integrations,
    is_true,
    preemption_line,
    preemptions,
    queue_name,
    queued,
    state,
    summary,
    suspended,
    unmanaged_line,
    workload_of,
)
from controller.jobs.snapshot import Snapshot
from controller.kube.client import Cluster
from controller.kubeflow import CLUSTER_QUEUE, LOCAL_QUEUE


def read_queue(snap: Snapshot) -> QueueView | None:
    """What :func:`describe` needs for the snapshot's job, described; None without a queue.

    Reads: the namespace's Workloads and, only when the Workload was preempted, the
    namespace's events (both the snapshot's); the LocalQueue, the ClusterQueue (cluster-scoped:
    skipped when the user may not read it), the visibility API's pending list (only while
    pending; a cluster that does not serve it answers 404 once), and for a held job with no
    Workload whether Kueue manages its kind (:func:`integration`), which it says as the problem
    when not."""
    cluster, job = snap.cluster, snap.job
    name = queue_name(job)
    if name is None:
        return None
    namespace = snap.namespace
    try:
        workloads = snap.workloads()
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
    # A held job without a Workload: Kueue may not manage its kind at all.
    unmanaged = wl is None and queued(job) and not missing
    if unmanaged and integration(cluster, job, name).managed is False:
        view = QueueView(local_queue=name, cluster_queue=cq_name)
        view.problem = unmanaged_line(job["kind"])
        return view
    admitted_cq = ((wl or {}).get("status", {}).get("admission") or {}).get("clusterQueue")
    cluster_queue = None
    if (cq_name or admitted_cq) and state(wl) == PENDING:
        cluster_queue = _get(cluster, CLUSTER_QUEUE, admitted_cq or cq_name)
    events: list[dict[str, Any]] = []
    if wl is not None and (preemptions(wl) or is_true(wl, PREEMPTED)):
        events = snap.events_of(wl["metadata"]["name"])
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


@dataclass
class Integration:
    """Whether the cluster's Kueue manages a job kind, from what could be read: its
    Configuration (the ConfigMap a manifest or Helm install keeps it in, where RBAC lets the
    user read it) and its webhook (a dry-run create of a job with a queue, not suspended: the
    webhook suspends it for a kind Kueue manages, and leaves it for any other)."""

    kind: str
    #: The Configuration lists the kind's framework (None: not read), and where it was read
    #: or why it was not.
    configured: bool | None
    config_note: str
    #: The webhook suspended the dry-run job (None: no answer), and what it said otherwise.
    webhook: bool | None
    webhook_note: str

    @property
    def managed(self) -> bool | None:
        """The running Kueue manages the kind: its webhook says so for now (the Configuration
        is read only at Kueue's start); the Configuration where the webhook gave no answer."""
        return self.webhook if self.webhook is not None else self.configured


@dataclass(frozen=True)
class KueueConfig:
    """Kueue's Configuration as read from its ConfigMap: the frameworks it enables (None: not
    read, or not a Configuration), and where it was read or why it was not."""

    frameworks: list[str] | None
    note: str


def kueue_config(cluster: Cluster) -> KueueConfig:
    """Read Kueue's Configuration (one get of its ConfigMap)."""
    where = f"ConfigMap {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}"
    try:
        frameworks = integrations(
            config_text(cluster.get_config_map(CONFIG_MAP_NAME, CONFIG_MAP_NAMESPACE))
        )
    except Forbidden:
        return KueueConfig(None, f"may not read {where}")
    except NotFound:
        return KueueConfig(None, f"no {where} (Kueue installed another way)")
    except ClusterError as e:
        return KueueConfig(None, f"cannot read {where} ({e})")
    if frameworks is None:
        return KueueConfig(None, f"{where} holds no Configuration under {CONFIG_KEY}")
    return KueueConfig(frameworks, f"{where} lists {', '.join(frameworks)}")


def integration(
    cluster: Cluster, job: dict[str, Any], queue: str, config: KueueConfig | None = None
) -> Integration:
    """Ask the cluster whether its Kueue manages ``job``'s kind (a manifest, or a job read
    back), both ways (:class:`Integration`). Two requests: a get of the ConfigMap (none when
    ``config`` was read already: ``doctor`` asks for every kind) and a dry-run create, which
    needs only the create permission ``submit`` needs anyway."""
    kind = job["kind"]
    config = config if config is not None else kueue_config(cluster)
    configured = framework(kind) in config.frameworks if config.frameworks is not None else None
    config_note = config.note
    try:
        got = cluster.create_job(integration_probe(job, queue), dry_run=True)
    except DdpjobError as e:
        return Integration(kind, configured, config_note, None, f"a dry-run create failed ({e})")
    held = suspended(got)
    what = f"a dry-run {kind} with a queue"
    note = f"its webhook suspended {what}" if held else f"its webhook left {what} unsuspended"
    return Integration(kind, configured, config_note, held, note)


def _get(cluster: Cluster, api: Any, name: str, namespace: str | None = None) -> dict | None:
    try:
        return cluster.get_object(api, name, namespace)
    except (NotFound, Forbidden):
        return None


class QueueNotes:
    """Lines about a job's place in its queue, fed the job each time it changes (``wait``,
    ``--follow``): where it waits and for what when it is queued (again after a preemption),
    and by what it was admitted when Kueue starts it, also when Kueue had already admitted it
    by the first version seen. Reads the queue only then, never on a timer. State across calls
    (was the job queued? was it seen before?), hence a class."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.was_queued = False
        self.seen = False
        self.last: str | None = None

    def see(self, job: dict[str, Any]) -> str | None:
        """The line to print for this version of ``job``, or None (nothing new)."""
        first, self.seen = not self.seen, True
        if queued(job):
            view = read_queue(Snapshot(self.cluster, job))
            line = summary(view) if view is not None else None
            preempted = preemption_line(view) if view is not None else None
            if line and preempted and not self.was_queued and view.state == PENDING:
                line += f" ({preempted})"  # queued again: say why
            self.was_queued = True
        elif (self.was_queued or first) and queue_name(job):
            # Admitted while we looked, or before the first version we saw (Kueue unsuspends
            # the job before its operator's status says so): by what. A job first seen further
            # on (finished, say) needs no queue line.
            view = read_queue(Snapshot(self.cluster, job))
            admitted = view is not None and (self.was_queued or view.state == ADMITTED_STATE)
            self.was_queued = False
            line = summary(view) if admitted else None
        else:
            return None
        if line is None or line == self.last:
            return None
        self.last = line
        return line
