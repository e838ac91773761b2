"""Where a job stands in Kueue: its Workload, the LocalQueue and ClusterQueue it waits in, what
it waits for and why in Kueue's own words, when it was admitted, what preempted it, and whether
the cluster's Kueue manages the job's kind at all.

Kueue (v0.19, ``kueue.x-k8s.io/v1beta2``) admits a job that carries the label
``kueue.x-k8s.io/queue-name`` through that LocalQueue: its webhook creates the job suspended, it
makes a Workload for it (labelled with the job's UID), reserves quota in the LocalQueue's
ClusterQueue when it fits, then un-suspends the job. While it cannot, the Workload's
``QuotaReserved`` condition is False with Kueue's reason and message (with default feature gates
reason ``Pending`` and the flavor assigner's message; with ``UnadmittedWorkloadsObservability``
``WaitingForQuota``, ``ExceedsMaxQuota``, ``Misconfigured``, ...), and Kueue records a Warning
event on the Workload with the same reason and message. To make room for a workload of higher
priority it evicts (preempts) a lower one, which suspends that job again (its pods get SIGTERM)
until it is admitted again.

Kueue manages only the kinds its Configuration names in ``integrations.frameworks`` (read at
start; an empty list means ``batch/job``; since v0.19 upstream's configuration leaves
``kubeflow.org/pytorchjob`` out). For any other kind its webhook does nothing: a job created
suspended, as ddpjob creates one with a queue, stays suspended with no Workload, forever.

Pure functions on API dicts, exactly as the API serves them; ``controller.jobs.queue`` fetches
what they read.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from controller.jobs.read.explain import job_terminal
from controller.kubeflow import LABEL_JOB_UID, LABEL_PRIORITY_CLASS, LABEL_QUEUE

GPU = "nvidia.com/gpu"

#: Workload condition types (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED, ADMITTED, EVICTED, PREEMPTED, FINISHED = (
    "QuotaReserved",
    "Admitted",
    "Evicted",
    "Preempted",
    "Finished",
)

#: How a queued job's state reads, in the order a job goes through them.
WAITING_FOR_KUEUE = "waiting for Kueue"  # no Workload yet (Kueue down, or not its integration)
PENDING = "pending"  # in the queue: no quota reserved
ADMITTED_STATE = "admitted"  # quota reserved and admission checks passed: the job runs
EVICTED_STATE = "evicted"  # admitted, then evicted (preempted, ...): being suspended
FINISHED_STATE = "finished"

#: Kueue's reasons for a Workload it can never admit as things stand (the QuotaReserved
#: condition's, apis/kueue/v1beta2/workload_types.go); they do not clear by themselves. With
#: default feature gates Kueue says ``Pending`` (or ``Inadmissible`` for a missing queue) for
#: these too, and then only the flavor assigner's message tells: ``> maximum capacity``.
NEVER_REASONS = frozenset({"ExceedsMaxQuota", "Misconfigured", "Inadmissible", "NoMatchingFlavor"})
_NEVER_MESSAGE = "> maximum capacity"

#: The integration (``integrations.frameworks``) that manages each job kind ddpjob submits
#: (pkg/controller/jobs/.../*_controller.go, FrameworkName), and what an empty list means.
FRAMEWORKS = {"PyTorchJob": "kubeflow.org/pytorchjob", "TrainJob": "trainer.kubeflow.org/trainjob"}
DEFAULT_FRAMEWORKS = ("batch/job",)
#: Where a Kueue installed from upstream's manifests keeps its Configuration (Helm: the
#: ConfigMap ``<fullname>-manager-config`` in the release's namespace, the same key).
CONFIG_MAP_NAMESPACE, CONFIG_MAP_NAME = "kueue-system", "kueue-manager-config"
CONFIG_KEY = "controller_manager_config.yaml"

# Kueue's preemption message (pkg/scheduler/preemption/preemption.go, preemptionMessage).
_PREEMPTOR = re.compile(
    r"\(UID: (?P<uid>[^,]+), JobUID: (?P<job_uid>[^)]+)\) due to (?P<why>[^;]+)"
)


# ----------------------------------------------------------------------------------------
# The job's side (pure)


def queue_name(job: dict[str, Any]) -> str | None:
    """The LocalQueue the job was submitted to (its ``kueue.x-k8s.io/queue-name`` label)."""
    return (job.get("metadata", {}).get("labels") or {}).get(LABEL_QUEUE) or None


def suspended(job: dict[str, Any]) -> bool:
    """The job's own suspend switch (PyTorchJob ``runPolicy.suspend``, TrainJob ``suspend``),
    which Kueue holds on until it admits the job and turns on again when it evicts it."""
    spec = job.get("spec", {})
    return bool((spec.get("runPolicy") or {}).get("suspend") or spec.get("suspend"))


def queued(job: dict[str, Any]) -> str | None:
    """The LocalQueue a job waits in: it has a queue and is suspended (by Kueue, until it is
    admitted). A suspended job is not failed: ``wait`` and ``--follow`` wait through it."""
    if job.get("metadata", {}).get("deletionTimestamp"):
        return None
    name = queue_name(job)
    return name if name and suspended(job) else None


# ----------------------------------------------------------------------------------------
# Workloads (pure)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in obj.get("status", {}).get("conditions") or []}


def is_true(obj: dict[str, Any], ctype: str) -> bool:
    return conditions(obj).get(ctype, {}).get("status") == "True"


def workload_of(job: dict[str, Any], workloads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Workload Kueue made for ``job``: labelled with its UID, or owned by it; the newest
    when there are several (a job changed while suspended gets a new one)."""
    uid = job.get("metadata", {}).get("uid")
    if not uid:
        return None
    mine = [
        w
        for w in workloads
        if (w.get("metadata", {}).get("labels") or {}).get(LABEL_JOB_UID) == uid
        or any(o.get("uid") == uid for o in w.get("metadata", {}).get("ownerReferences") or [])
    ]
    return max(mine, key=lambda w: w["metadata"].get("creationTimestamp") or "", default=None)


def owner_name(workload: dict[str, Any]) -> str:
    """``kind namespace/name`` of the job a Workload is for (its controller owner)."""
    meta = workload.get("metadata", {})
    for o in meta.get("ownerReferences") or []:
        if o.get("controller", True):
            return f"{o.get('kind', '').lower()} {meta.get('namespace', '')}/{o.get('name', '')}"
    return f"workload {meta.get('namespace', '')}/{meta.get('name', '')}"


def state(workload: dict[str, Any] | None) -> str:
    """One word for where the Workload stands (the constants above)."""
    if workload is None:
        return WAITING_FOR_KUEUE
    if is_true(workload, FINISHED):
        return FINISHED_STATE
    # Evicted stays True after the job is stopped and the Workload requeued (until it is
    # admitted again); while the quota is still reserved, the job is being stopped.
    if is_true(workload, EVICTED) and is_true(workload, QUOTA_RESERVED):
        return EVICTED_STATE
    if is_true(workload, ADMITTED):
        return ADMITTED_STATE
    return PENDING


def verdict(workload: dict[str, Any]) -> tuple[str, str] | None:
    """Kueue's own reason the Workload is not admitted, as it writes it: ``(reason, message)``
    of its ``QuotaReserved`` condition while that is False (``Pending``, ``WaitingForQuota``,
    ``ExceedsMaxQuota``, ``Misconfigured``, ...), else of its ``Admitted`` condition while that
    is False (quota reserved, admission checks not ready). None when it is admitted, or Kueue
    has not looked at it yet."""
    conds = conditions(workload)
    for ctype in (QUOTA_RESERVED, ADMITTED):
        cond = conds.get(ctype, {})
        if cond.get("status") == "False":
            return cond.get("reason") or "", _one_line(cond.get("message"))
    return None


def never_admitted(reason: str, message: str) -> bool:
    """Kueue's verdict says the job can never be admitted as the queues stand (too big for the
    ClusterQueue, a queue that does not exist), not that it waits its turn."""
    return reason in NEVER_REASONS or _NEVER_MESSAGE in message


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _qty(value: Any) -> Decimal:
    from controller.quantity import parse_quantity

    return parse_quantity(str(value))


def requests(workload: dict[str, Any]) -> dict[str, Decimal]:
    """What the Workload asks of the ClusterQueue in total, per resource: Kueue's own sums
    (``status.resourceRequests``, per pod set), else count x the pod template's requests."""
    total: dict[str, Decimal] = {}
    sums = workload.get("status", {}).get("resourceRequests") or []
    if sums:
        for podset in sums:
            for name, value in (podset.get("resources") or {}).items():
                total[name] = total.get(name, Decimal(0)) + _qty(value)
        return total
    for podset in workload.get("spec", {}).get("podSets") or []:
        count = int(podset.get("count", 1))
        for c in podset.get("template", {}).get("spec", {}).get("containers") or []:
            res = c.get("resources") or {}
            for name, value in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
                total[name] = total.get(name, Decimal(0)) + count * _qty(value)
    return total


def manifest_requests(pods: list[tuple[str, dict[str, Decimal], dict[str, Any]]]) -> dict:
    """The same totals for a job not submitted yet (``doctor.pod_requests`` of its manifest)."""
    total: dict[str, Decimal] = {}
    for _, need, _ in pods:
        for name, value in need.items():
            total[name] = total.get(name, Decimal(0)) + value
    return total


# ----------------------------------------------------------------------------------------
# Kueue's events on a job's Workload (pure)

#: Kueue's Normal events on a Workload it admits (pkg/scheduler/scheduler.go): after one of
#: these, the Warnings before it are history.
_ADMITTING_EVENTS = frozenset({QUOTA_RESERVED, ADMITTED})


def workload_event(kind: str, job_name: str, event: dict[str, Any]) -> bool:
    """The event is about a Workload Kueue made for the job ``job_name`` of ``kind``
    (``PyTorchJob``): Kueue names it ``<kind, lowercased>-<job>-<5 hex digits of a hash>``
    (jobframework/workload_names.go), which no other job's Workload matches."""
    obj = event.get("involvedObject") or event.get("regarding") or {}
    if obj.get("kind") != "Workload":
        return False
    return (
        re.fullmatch(
            rf"{re.escape(kind.lower())}-{re.escape(job_name)}-[0-9a-f]{{5}}", obj.get("name", "")
        )
        is not None
    )


def said_last(kind: str, job_name: str, events: list[dict[str, Any]]) -> tuple[str, str] | None:
    """Kueue's latest verdict on the job's Workload from its events: the newest Warning (its
    scheduler records one with the QuotaReserved condition's reason and message each time it
    cannot admit it), or None when none came, or an admission came after it."""
    mine = [e for e in events if workload_event(kind, job_name, e)]
    if not mine:
        return None
    newest = max(mine, key=_seen_at)
    if newest.get("type") != "Warning" or newest.get("reason") in _ADMITTING_EVENTS:
        return None
    return newest.get("reason") or "", _one_line(newest.get("message") or newest.get("note"))


def _seen_at(event: dict[str, Any]) -> datetime:
    """When the event was last seen: a repeated event (events.k8s.io series, or a core/v1
    count) carries its newest time apart from its first."""
    stamps = [
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        event.get("firstTimestamp"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ]
    return max((datetime.fromisoformat(t) for t in stamps if t), default=_LONG_AGO)


_LONG_AGO = datetime.min.replace(tzinfo=timezone.utc)


# ----------------------------------------------------------------------------------------
# Kueue's configuration: which job kinds it manages (pure)


def integrations(config_text: str | None) -> list[str] | None:
    """The frameworks Kueue's Configuration (``controller_manager_config.yaml``) enables:
    ``integrations.frameworks``, or ``batch/job`` alone when that is empty or absent (Kueue's
    default). None when the text is not a Configuration (no text, not YAML, not a mapping)."""
    if not config_text:
        return None
    import yaml  # about 30 ms: only `doctor` and a held job's queue read Kueue's config

    try:
        config = yaml.safe_load(config_text)
    except yaml.YAMLError:
        return None
    if not isinstance(config, dict):
        return None
    frameworks = (config.get("integrations") or {}).get("frameworks") or []
    if not isinstance(frameworks, list):
        return None
    return [str(f) for f in frameworks] or list(DEFAULT_FRAMEWORKS)


def config_text(config_map: dict[str, Any]) -> str | None:
    """Kueue's Configuration in its ConfigMap (the ``controller_manager_config.yaml`` key)."""
    return (config_map.get("data") or {}).get(CONFIG_KEY)


def framework(kind: str) -> str:
    """The integration that manages job ``kind`` (``PyTorchJob`` -> kubeflow.org/pytorchjob)."""
    return FRAMEWORKS[kind]


#: The name of the dry-run job that asks Kueue's webhook whether it manages a kind.
PROBE_NAME = "ddpjob-kueue-probe"


def integration_probe(job: dict[str, Any], queue: str) -> dict[str, Any]:
    """A job like ``job`` (a manifest, or a job read back) with queue ``queue``, not suspended,
    to create with a dry run: Kueue's webhook suspends it if it manages the job's kind and
    leaves it as it is if not. Its own name, so that a job of ``job``'s name existing does not
    stop the dry run before the answer."""
    spec = copy.deepcopy(job.get("spec") or {})
    if job.get("kind") == "PyTorchJob":
        spec.setdefault("runPolicy", {})["suspend"] = False
    else:
        spec["suspend"] = False
    meta = job.get("metadata") or {}
    return {
        "apiVersion": job.get("apiVersion"),
        "kind": job.get("kind"),
        "metadata": {
            "name": PROBE_NAME,
            "namespace": meta.get("namespace", "default"),
            "labels": {LABEL_QUEUE: queue},
        },
        "spec": spec,
    }


def unmanaged_line(kind: str) -> str:
    """What a user with a queue on a cluster whose Kueue ignores ``kind`` needs to know, and the
    fix, in one line."""
    name = framework(kind)
    return (
        f"Kueue does not manage {kind}s on this cluster ({name} is not among its "
        "integrations): a job with queue: stays suspended forever, with no Workload. Enable "
        f"{name} in Kueue's integrations.frameworks (ConfigMap "
        f"{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME}, key {CONFIG_KEY}) and restart Kueue, or "
        "submit without queue:"
    )


# ----------------------------------------------------------------------------------------
# ClusterQueues (pure)


@dataclass
class Room:
    """One resource of one flavor in a ClusterQueue: its quota and what is reserved of it."""

    flavor: str
    resource: str
    quota: Decimal
    reserved: Decimal
    #: How much more it may borrow from its cohort (None: no limit said; 0: no cohort).
    borrow: Decimal | None

    @property
    def free(self) -> Decimal:
        return max(Decimal(0), self.quota - self.reserved)


def rooms(cluster_queue: dict[str, Any]) -> list[Room]:
    """Every (flavor, resource) the ClusterQueue covers, with quota and reservation."""
    cohort = cluster_queue.get("spec", {}).get("cohortName") or cluster_queue.get("spec", {}).get(
        "cohort"
    )
    reserved: dict[tuple[str, str], Decimal] = {}
    for f in cluster_queue.get("status", {}).get("flavorsReservation") or []:
        for r in f.get("resources") or []:
            reserved[(f.get("name", ""), r.get("name", ""))] = _qty(r.get("total", 0))
    out = []
    for group in cluster_queue.get("spec", {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            fname = flavor.get("name", "")
            for r in flavor.get("resources") or []:
                limit = r.get("borrowingLimit")
                borrow = (_qty(limit) if limit is not None else None) if cohort else Decimal(0)
                quota = _qty(r.get("nominalQuota", 0))
                held = reserved.get((fname, r.get("name", "")), Decimal(0))
                out.append(Room(fname, r.get("name", ""), quota, held, borrow))
    return out


def _fmt(v: Decimal) -> str:
    if v == v.to_integral_value():
        return str(int(v))
    gib = Decimal(1024**3)
    if v >= gib:
        return f"{(v / gib):.1f}Gi"
    return f"{v.normalize():f}"


def fmt_amount(resource: str, v: Decimal) -> str:
    """A resource amount as people read it: memory in Gi, CPU and GPUs as numbers."""
    if resource == "memory" or resource.endswith("memory"):
        gib = v / Decimal(1024**3)
        return f"{gib:.3g}Gi" if gib < 10 else f"{gib:.0f}Gi"
    return _fmt(v)


def _rooms_by_resource(cluster_queue: dict[str, Any]) -> dict[str, list[Room]]:
    """The ClusterQueue's rooms (:func:`rooms`), grouped by resource."""
    by_resource: dict[str, list[Room]] = {}
    for room in rooms(cluster_queue):
        by_resource.setdefault(room.resource, []).append(room)
    return by_resource


def waits_for(need: dict[str, Decimal], cluster_queue: dict[str, Any]) -> list[str]:
    """What the job waits for: each resource it asks more of than the ClusterQueue has free
    now, e.g. ``8 nvidia.com/gpu of 4 free (quota 16, flavor default-flavor)``. Empty when it
    all fits (then it waits for its turn, or for Kueue)."""
    out = []
    by_resource = _rooms_by_resource(cluster_queue)
    for resource, amount in sorted(need.items()):
        if amount <= 0:
            continue
        held = by_resource.get(resource)
        if not held:
            name = cluster_queue.get("metadata", {}).get("name", "?")
            out.append(f"{fmt_amount(resource, amount)} {resource}: {name} has no quota of it")
            continue
        best = max(held, key=lambda r: r.free)
        if best.free < amount:
            asked, free = fmt_amount(resource, amount), fmt_amount(resource, best.free)
            out.append(
                f"{asked} {resource} of {free} free "
                f"(quota {fmt_amount(resource, best.quota)}, flavor {best.flavor})"
            )
    return out


def never_fits(need: dict[str, Decimal], cluster_queue: dict[str, Any]) -> str | None:
    """Why the ClusterQueue can never admit a job asking ``need`` (a resource it does not
    cover, or more than all its flavors' quota and borrowing together); None if it can."""
    name = cluster_queue.get("metadata", {}).get("name", "?")
    by_resource = _rooms_by_resource(cluster_queue)
    for resource, amount in sorted(need.items()):
        if amount <= 0:
            continue
        held = by_resource.get(resource)
        if not held:
            covered = ", ".join(sorted(by_resource)) or "nothing"
            return (
                f"the job asks {fmt_amount(resource, amount)} {resource}, which ClusterQueue "
                f"{name} does not cover (it covers {covered})"
            )
        if any(r.borrow is None for r in held):
            continue  # may borrow without a limit from its cohort: cannot say
        most = sum((r.quota + (r.borrow or 0) for r in held), Decimal(0))
        if amount > most:
            flavors = ", ".join(f"{r.flavor} {fmt_amount(resource, r.quota)}" for r in held)
            return (
                f"the job asks {fmt_amount(resource, amount)} {resource} but ClusterQueue {name} "
                f"holds at most {fmt_amount(resource, most)} (quota by flavor: {flavors})"
            )
    return None


# ----------------------------------------------------------------------------------------
# Preemption and order (pure)


def preempted_by(message: str) -> dict[str, str] | None:
    """The preemptor in Kueue's message: its Workload UID, its job's UID and why."""
    m = _PREEMPTOR.search(message or "")
    return m.groupdict() if m else None


def preemptions(workload: dict[str, Any]) -> int:
    """How many times the Workload was evicted by preemption (``status.schedulingStats``,
    which, unlike the conditions, keeps counting after it is admitted again)."""
    stats = (workload.get("status", {}).get("schedulingStats") or {}).get("evictions") or []
    return sum(int(e.get("count", 0)) for e in stats if e.get("reason") == PREEMPTED)


def ahead_of(workload: dict[str, Any], workloads: list[dict[str, Any]]) -> tuple[int, int]:
    """(ahead, tied): pending Workloads of the same LocalQueue that come before this one in
    Kueue's order: higher priority, or the same priority and created earlier
    (``workload.Ordering``: a Workload preempted within its ClusterQueue keeps its creation
    time, so its place); and those of the same priority created in the same second, whose order
    Kueue does not fix (timestamps have one-second resolution)."""
    queue = workload.get("spec", {}).get("queueName")
    me = _order_key(workload)
    others = [
        _order_key(w)
        for w in workloads
        if w.get("spec", {}).get("queueName") == queue
        and w["metadata"].get("uid") != workload["metadata"].get("uid")
        and state(w) == PENDING
        and w.get("spec", {}).get("active", True) is not False
    ]
    return sum(1 for k in others if k < me), sum(1 for k in others if k == me)


def _order_key(w: dict[str, Any]) -> tuple[int, str]:
    # pkg/workload/workload.go GetQueueOrderTimestamp: the creation time, but for evictions by
    # a PodsReady timeout or an admission check (the eviction's time), which ddpjob's local
    # queues do not configure.
    evicted = conditions(w).get(EVICTED, {})
    at = w["metadata"].get("creationTimestamp", "")
    if evicted.get("status") == "True" and evicted.get("reason") in (
        "PodsReadyTimeout",
        "AdmissionCheck",
    ):
        at = evicted.get("lastTransitionTime") or at
    return (-int(w.get("spec", {}).get("priority") or 0), at)


# ----------------------------------------------------------------------------------------
# The view ``status`` shows


@dataclass
class QueueView:
    """Where a job stands in Kueue, JSON-ready (``status -o json``'s ``queue``)."""

    local_queue: str
    cluster_queue: str | None = None
    state: str = WAITING_FOR_KUEUE
    workload: str | None = None
    priority_class: str | None = None
    priority: int | None = None
    #: Kueue's visibility API, where served: 1-based positions.
    position_in_local_queue: int | None = None
    position_in_cluster_queue: int | None = None
    #: Without it: pending Workloads of the LocalQueue before this one (priority, then time),
    #: and those queued in the same second at the same priority (in no set order).
    ahead: int | None = None
    tied: int | None = None
    waits_for: list[str] = field(default_factory=list)
    #: Kueue's own words, as it writes them: why it does not admit the job (the reason and
    #: message of the QuotaReserved condition, else of Admitted, while False: :func:`verdict`),
    #: or why it evicted it (the Evicted condition's).
    reason: str = ""
    message: str = ""
    admitted_at: str | None = None
    preempted: int = 0
    preempted_by: str | None = None
    preempted_why: str | None = None
    preempted_at: str | None = None
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe(
    job: dict[str, Any],
    workloads: list[dict[str, Any]],
    *,
    local_queue: dict[str, Any] | None = None,
    cluster_queue: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
    pending: list[dict[str, Any]] | None = None,
    local_queue_missing: bool = False,
) -> QueueView | None:
    """The QueueView of ``job`` from the namespace's ``workloads``, its ``local_queue`` and
    ``cluster_queue`` (None: missing or not readable; ``local_queue_missing``: it does not
    exist), the Workload's ``events`` and the visibility API's ``pending`` list (None: not
    served). None for a job without a queue."""
    name = queue_name(job)
    if name is None:
        return None
    view = QueueView(local_queue=name)
    labels = job.get("metadata", {}).get("labels") or {}
    view.priority_class = labels.get(LABEL_PRIORITY_CLASS)
    if local_queue is not None:
        view.cluster_queue = local_queue.get("spec", {}).get("clusterQueue")
    elif local_queue_missing and not job_terminal(job):
        view.problem = (
            f"LocalQueue {job['metadata'].get('namespace', '')}/{name} does not exist: Kueue "
            "never admits the job. Create it, or submit with a queue that exists"
        )
    wl = workload_of(job, workloads)
    view.state = state(wl)
    if wl is None:
        return view
    view.workload = wl["metadata"].get("name")
    spec, conds = wl.get("spec", {}), conditions(wl)
    view.priority = spec.get("priority")
    view.priority_class = (spec.get("priorityClassRef") or {}).get("name") or view.priority_class
    admission = wl.get("status", {}).get("admission") or {}
    view.cluster_queue = admission.get("clusterQueue") or view.cluster_queue
    if view.state == ADMITTED_STATE:
        view.admitted_at = conds[ADMITTED].get("lastTransitionTime")
    if view.state == PENDING:
        view.reason, view.message = verdict(wl) or ("", "")
        if cluster_queue is not None:
            view.waits_for = waits_for(requests(wl), cluster_queue)
        mine = next(
            (p for p in pending or [] if p.get("metadata", {}).get("name") == view.workload), None
        )
        if mine is not None:
            view.position_in_local_queue = _position(mine, "positionInLocalQueue")
            view.position_in_cluster_queue = _position(mine, "positionInClusterQueue")
        else:
            view.ahead, view.tied = ahead_of(wl, workloads)
    elif view.state == EVICTED_STATE:
        view.reason = conds[EVICTED].get("reason") or ""
        view.message = _one_line(conds[EVICTED].get("message"))
    _preemption(view, wl, workloads, events or [])
    return view


def _position(item: dict[str, Any], key: str) -> int | None:
    value = item.get(key)
    return int(value) + 1 if value is not None else None


def _preemption(
    view: QueueView, wl: dict[str, Any], workloads: list[dict[str, Any]], events: list[dict]
) -> None:
    """How often the Workload was preempted, and by what (its Preempted condition while it
    holds, else its newest ``Preempted`` event)."""
    view.preempted = preemptions(wl)
    cond = conditions(wl).get(PREEMPTED, {})
    said = [
        (e.get("lastTimestamp") or e.get("eventTime") or "", e.get("message") or "")
        for e in events
        if e.get("reason") == PREEMPTED
    ]
    message, at = "", None
    if cond.get("status") == "True" and preempted_by(cond.get("message", "")):
        message, at = cond["message"], cond.get("lastTransitionTime")
    elif said:
        at, message = max(said)
    found = preempted_by(message)
    if found is None:
        return
    view.preempted = max(view.preempted, 1)
    view.preempted_at = at
    view.preempted_why = found["why"].strip()
    by = next(
        (
            w
            for w in workloads
            if w["metadata"].get("uid") == found["uid"]
            or (w["metadata"].get("labels") or {}).get(LABEL_JOB_UID) == found["job_uid"]
        ),
        None,
    )
    view.preempted_by = owner_name(by) if by is not None else f"workload UID {found['uid']}"


# ----------------------------------------------------------------------------------------
# One line for people


def summary(view: QueueView) -> str:
    """``queued in user-queue (cluster-queue): pending, 2 ahead; waits for 8 nvidia.com/gpu of
    4 free ...``: the queue line of ``status``, ``wait`` and ``logs -f``."""
    where = view.local_queue + (f" -> {view.cluster_queue}" if view.cluster_queue else "")
    if view.problem:
        return f"queue {where}: {view.problem}"
    if view.state == ADMITTED_STATE:
        text = f"admitted by {view.cluster_queue or view.local_queue}"
        return text + (f" at {view.admitted_at}" if view.admitted_at else "")
    if view.state == FINISHED_STATE:
        return f"finished in {where}"
    if view.state == EVICTED_STATE:
        why = view.message or "evicted"
        if view.preempted_by and is_true_preemption(view):
            why = f"preempted by {view.preempted_by} ({view.preempted_why})"
        return f"evicted from {where}: {why}; its pods stop, then it waits in the queue again"
    if view.state == WAITING_FOR_KUEUE:
        return (
            f"queued in {where}: no Workload yet (Kueue makes one within seconds; if none "
            "comes, Kueue is down or does not manage this API: see `doctor`)"
        )
    text = f"queued in {where}"
    if view.position_in_local_queue is not None:
        text += f", position {view.position_in_local_queue} in {view.local_queue}"
        if view.position_in_cluster_queue is not None:
            text += f" ({view.position_in_cluster_queue} in {view.cluster_queue})"
    elif view.ahead is not None:
        text += f", {view.ahead} ahead of it" if view.ahead or view.tied else ", next in line"
        if view.tied:
            text += f" (and {view.tied} queued in the same second, in no set order)"
    if view.waits_for:
        text += "; waits for " + "; ".join(view.waits_for)
    return text


def verdict_line(view: QueueView) -> str | None:
    """``Kueue says Pending: couldn't assign flavors to pod set master: ...``: why Kueue does
    not admit a pending job, in its own words (``status``'s second queue line), or None."""
    if view.state != PENDING or not (view.reason or view.message):
        return None
    return (
        "Kueue says "
        + ": ".join(x for x in (view.reason, view.message) if x)
        + _gloss(view.reason, view.message)
    )


def _gloss(reason: str, message: str) -> str:
    """What a verdict that never clears by itself means for the user."""
    if reason == "ExceedsMaxQuota" or _NEVER_MESSAGE in message:
        return " (the job asks more than the ClusterQueue can ever hold: lower resources or nodes)"
    if never_admitted(reason, message):
        return " (this does not clear by itself)"
    return ""


def is_true_preemption(view: QueueView) -> bool:
    """The eviction is a preemption (Kueue's message names the preemptor)."""
    return preempted_by(view.message) is not None


def preemption_line(view: QueueView) -> str | None:
    """``preempted 1 time, last by pytorchjob default/high (prioritization in the
    ClusterQueue) at ...``, or None."""
    if not view.preempted:
        return None
    times = "1 time" if view.preempted == 1 else f"{view.preempted} times"
    text = f"preempted {times}"
    if view.preempted_by:
        text += f", last by {view.preempted_by}"
    if view.preempted_why:
        text += f" ({view.preempted_why})"
    if view.preempted_at:
        text += f" at {view.preempted_at}"
    return text
