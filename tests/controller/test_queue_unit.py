"""Where a job stands in Kueue, read from API dicts without a cluster: its Workload's state,
what it waits for, whether its queue can ever admit it, what preempted it, and the doctor's
queue checks. The dicts have the shapes Kueue v0.17 wrote on the local cluster (a pending
Workload, one admitted, one preempted and requeued; ``cluster-queue`` with its reservation)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from controller.errors import NotFound
from controller.jobs.doctor import FAIL, OK, queue_checks
from controller.jobs.read import queue as q

PREEMPTION = (
    "Preempted to accommodate a workload (UID: wl-urgent, JobUID: job-urgent) due to "
    "prioritization in the ClusterQueue; preemptor path: /cluster-queue; preemptee path: "
    "/cluster-queue"
)


def job(name: str = "low", uid: str = "job-low", *, suspend: bool = True, queue="user-queue"):
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "labels": labels},
        "spec": {"runPolicy": {"suspend": suspend}, "pytorchReplicaSpecs": {}},
    }


def cond(ctype: str, status: str, *, reason: str = "", message: str = "", at: str = "") -> dict:
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at or "2026-11-25T23:51:00Z",
    }


def workload(
    job_name: str = "low",
    job_uid: str = "job-low",
    *,
    uid: str = "wl-low",
    priority: int = 100,
    created: str = "2026-11-25T23:50:00Z",
    conditions: list[dict] | None = None,
    gpus: int = 8,
    evictions: int = 0,
    admitted_cq: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": conditions or [],
        "resourceRequests": [
            {"name": "master", "resources": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": gpus}}
        ],
    }
    if evictions:
        status["schedulingStats"] = {
            "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": evictions}]
        }
    if admitted_cq:
        status["admission"] = {"clusterQueue": admitted_cq, "podSetAssignments": []}
    return {
        "metadata": {
            "name": f"pytorchjob-{job_name}-abcde",
            "namespace": "default",
            "uid": uid,
            "creationTimestamp": created,
            "labels": {"kueue.x-k8s.io/job-uid": job_uid},
            "ownerReferences": [
                {"kind": "PyTorchJob", "name": job_name, "uid": job_uid, "controller": True}
            ],
        },
        "spec": {"queueName": "user-queue", "priority": priority, "active": True},
        "status": status,
    }


PENDING = [
    cond(
        "QuotaReserved",
        "False",
        reason="Pending",
        message="couldn't assign flavors to pod set master: insufficient unused quota for "
        "nvidia.com/gpu in flavor default-flavor, 8 more needed",
    )
]
ADMITTED = [
    cond("QuotaReserved", "True", reason="QuotaReserved"),
    cond("Admitted", "True", reason="Admitted", at="2026-11-25T23:52:15Z"),
]
REQUEUED = [
    *PENDING,
    cond("Evicted", "True", reason="Preempted", message=PREEMPTION),
    cond("Admitted", "False", reason="NoReservation"),
    cond("Preempted", "True", reason="InClusterQueue", message=PREEMPTION),
    cond("Requeued", "True", reason="Preempted", at="2026-11-25T23:51:49Z"),
]


def cluster_queue(gpus_reserved: int = 16, *, cohort: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": "default-flavor",
                        "resources": [
                            {"name": "cpu", "nominalQuota": "2"},
                            {"name": "memory", "nominalQuota": "24684100Ki"},
                            {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                        ],
                    }
                ],
            }
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    return {
        "metadata": {"name": "cluster-queue"},
        "spec": spec,
        "status": {
            "flavorsReservation": [
                {
                    "name": "default-flavor",
                    "resources": [
                        {"name": "cpu", "total": "1"},
                        {"name": "memory", "total": "4Gi"},
                        {"name": "nvidia.com/gpu", "total": str(gpus_reserved)},
                    ],
                }
            ]
        },
    }


LOCAL_QUEUE = {"metadata": {"name": "user-queue"}, "spec": {"clusterQueue": "cluster-queue"}}

# --------------------------------------------------------------------------------- the job


def test_a_suspended_job_with_a_queue_is_queued_and_nothing_else_is():
    assert q.queued(job()) == "user-queue"
    assert q.queued(job(suspend=False)) is None  # admitted: Kueue un-suspended it
    assert q.queued(job(queue=None)) is None  # suspended by hand, no queue
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-25T23:59:00Z"
    assert q.queued(deleting) is None
    trainjob = {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}},
        "spec": {"suspend": True},
    }
    assert q.queued(trainjob) == "q"


def test_the_jobs_workload_is_found_by_its_uid_label_the_newest_of_several():
    older = workload(uid="wl-1", created="2026-11-25T23:50:00Z")
    newer = workload(uid="wl-2", created="2026-11-25T23:55:00Z")
    other = workload("high", "job-high", uid="wl-3", created="2026-11-25T23:59:00Z")
    assert q.workload_of(job(), [older, other, newer])["metadata"]["uid"] == "wl-2"
    assert q.workload_of(job(uid="job-none"), [older, other]) is None


# --------------------------------------------------------------------------------- states


@pytest.mark.parametrize(
    ("conditions", "want"),
    [
        (PENDING, q.PENDING),
        (ADMITTED, q.ADMITTED_STATE),
        (REQUEUED, q.PENDING),  # preempted, stopped and requeued: waiting again
        ([*ADMITTED, cond("Evicted", "True", reason="Preempted")], q.EVICTED_STATE),
        ([*ADMITTED, cond("Finished", "True", reason="Succeeded")], q.FINISHED_STATE),
    ],
)
def test_state_of_a_workload(conditions, want):
    assert q.state(workload(conditions=conditions)) == want
    assert q.state(None) == q.WAITING_FOR_KUEUE


def test_requests_are_kueues_sums_or_count_times_the_pod_template():
    assert q.requests(workload(gpus=8)) == {
        "cpu": Decimal(1),
        "memory": Decimal(2 * 1024**3),
        "nvidia.com/gpu": Decimal(8),
    }
    raw = workload()
    del raw["status"]["resourceRequests"]
    raw["spec"]["podSets"] = [
        {
            "name": "worker",
            "count": 3,
            "template": {"spec": {"containers": [{"resources": {"requests": {"cpu": "500m"}}}]}},
        }
    ]
    assert q.requests(raw) == {"cpu": Decimal("1.5")}


# --------------------------------------------------------------------------------- quota


def test_what_a_pending_job_waits_for_is_what_it_asks_beyond_the_free_quota():
    need = {"cpu": Decimal(1), "memory": Decimal(2 * 1024**3), "nvidia.com/gpu": Decimal(8)}
    assert q.waits_for(need, cluster_queue(gpus_reserved=12)) == [
        "8 nvidia.com/gpu of 4 free (quota 16, flavor default-flavor)"
    ]
    assert q.waits_for(need, cluster_queue(gpus_reserved=0)) == []
    assert q.waits_for({"example.com/fpga": Decimal(1)}, cluster_queue()) == [
        "1 example.com/fpga: cluster-queue has no quota of it"
    ]


def test_a_queue_that_can_never_admit_the_job_says_why():
    need = {"cpu": Decimal(1), "nvidia.com/gpu": Decimal(24)}
    problem = q.never_fits(need, cluster_queue())
    assert problem == (
        "the job asks 24 nvidia.com/gpu but ClusterQueue cluster-queue holds at most 16 "
        "(quota by flavor: default-flavor 16)"
    )
    assert q.never_fits({"nvidia.com/gpu": Decimal(16)}, cluster_queue()) is None
    uncovered = q.never_fits({"example.com/fpga": Decimal(1)}, cluster_queue())
    assert uncovered is not None and "does not cover" in uncovered
    # In a cohort without a borrowing limit it may borrow any amount: no verdict.
    assert q.never_fits(need, cluster_queue(cohort="team")) is None


# --------------------------------------------------------------------------------- preemption


def test_a_preempted_job_names_its_preemptor_and_counts_its_preemptions():
    low = workload(conditions=REQUEUED, evictions=1)
    high = workload("urgent", "job-urgent", uid="wl-urgent", priority=1000, conditions=ADMITTED)
    view = q.describe(job(), [low, high], local_queue=LOCAL_QUEUE, cluster_queue=cluster_queue())
    assert view is not None
    assert view.state == q.PENDING and view.cluster_queue == "cluster-queue"
    assert view.preempted == 1
    assert view.preempted_by == "pytorchjob default/urgent"
    assert view.preempted_why == "prioritization in the ClusterQueue"
    assert q.preemption_line(view) == (
        "preempted 1 time, last by pytorchjob default/urgent (prioritization in the "
        "ClusterQueue) at 2026-11-25T23:51:00Z"
    )


def test_after_readmission_the_preemption_is_still_told_from_its_stats_and_events():
    low = workload(conditions=ADMITTED, evictions=2, admitted_cq="cluster-queue")
    event = {"reason": "Preempted", "message": PREEMPTION, "lastTimestamp": "2026-11-25T23:51:48Z"}
    view = q.describe(job(suspend=False), [low], local_queue=LOCAL_QUEUE, events=[event])
    assert view.state == q.ADMITTED_STATE
    assert view.admitted_at == "2026-11-25T23:52:15Z"
    assert view.preempted == 2
    assert view.preempted_by == "workload UID wl-urgent"  # its job is gone from the list
    assert q.summary(view) == "admitted by cluster-queue at 2026-11-25T23:52:15Z"


def test_while_it_is_stopped_the_summary_names_the_preemptor_not_kueues_paths():
    stopping = workload(
        conditions=[
            *ADMITTED,
            cond("Evicted", "True", reason="Preempted", message=PREEMPTION),
            cond("Preempted", "True", reason="InClusterQueue", message=PREEMPTION),
        ],
        admitted_cq="cluster-queue",
    )
    high = workload("urgent", "job-urgent", uid="wl-urgent", priority=1000, conditions=ADMITTED)
    view = q.describe(job(), [stopping, high], local_queue=LOCAL_QUEUE)
    assert view.state == q.EVICTED_STATE
    assert q.summary(view) == (
        "evicted from user-queue -> cluster-queue: preempted by pytorchjob default/urgent "
        "(prioritization in the ClusterQueue); its pods stop, then it waits in the queue again"
    )


def test_preempted_by_parses_kueues_message_only():
    assert q.preempted_by(PREEMPTION) == {
        "uid": "wl-urgent",
        "job_uid": "job-urgent",
        "why": "prioritization in the ClusterQueue",
    }
    assert q.preempted_by("The workload has no reservation") is None


# --------------------------------------------------------------------------------- order


def test_ahead_counts_higher_priority_then_earlier_pending_workloads_of_the_same_queue():
    me = workload(uid="me", priority=100, created="2026-11-25T23:50:00Z", conditions=PENDING)
    others = [
        workload(
            "a", "ja", uid="a", priority=1000, created="2026-11-25T23:59:00Z", conditions=PENDING
        ),
        workload(
            "b", "jb", uid="b", priority=100, created="2026-11-25T23:40:00Z", conditions=PENDING
        ),
        workload(
            "c", "jc", uid="c", priority=100, created="2026-11-25T23:55:00Z", conditions=PENDING
        ),
        workload("d", "jd", uid="d", priority=1000, conditions=ADMITTED),  # admitted: not waiting
    ]
    assert q.ahead_of(me, [me, *others]) == (2, 0)  # a (priority) and b (earlier); not c, d
    # Preempted and requeued, it keeps its place (Kueue orders by creation time).
    requeued = workload(uid="me", priority=100, conditions=REQUEUED)
    assert q.ahead_of(requeued, [requeued, *others]) == (2, 0)
    # Created in the same second at the same priority: Kueue sets no order between them.
    twin = workload("e", "je", uid="e", priority=100, created="2026-11-25T23:50:00Z",
                    conditions=PENDING)  # fmt: skip
    assert q.ahead_of(me, [me, twin, *others]) == (2, 1)
    view = q.describe(job(), [me, twin, *others], local_queue=LOCAL_QUEUE)
    assert q.summary(view).startswith(
        "queued in user-queue -> cluster-queue, 2 ahead of it (and 1 queued in the same second, "
        "in no set order)"
    )


def test_kueues_visibility_api_gives_the_positions_where_served():
    wl = workload(conditions=PENDING)
    pending = [{"metadata": {"name": wl["metadata"]["name"]}, "positionInLocalQueue": 2,
                "positionInClusterQueue": 5}]  # fmt: skip
    view = q.describe(job(), [wl], local_queue=LOCAL_QUEUE, pending=pending)
    assert (view.position_in_local_queue, view.position_in_cluster_queue, view.ahead) == (
        3,
        6,
        None,
    )
    assert q.summary(view).startswith(
        "queued in user-queue -> cluster-queue, position 3 in user-queue (6 in cluster-queue)"
    )


def test_the_summary_of_a_pending_job_says_what_it_waits_for():
    view = q.describe(
        job(),
        [workload(conditions=PENDING)],
        local_queue=LOCAL_QUEUE,
        cluster_queue=cluster_queue(gpus_reserved=16),
    )
    assert q.summary(view) == (
        "queued in user-queue -> cluster-queue, next in line; waits for 8 nvidia.com/gpu of 0 "
        "free (quota 16, flavor default-flavor)"
    )
    assert view.message.startswith("couldn't assign flavors to pod set master")


def test_a_missing_local_queue_is_the_problem_named():
    view = q.describe(job(), [], local_queue=None, local_queue_missing=True)
    assert view.state == q.WAITING_FOR_KUEUE
    assert (
        view.problem is not None and "LocalQueue default/user-queue does not exist" in view.problem
    )
    assert q.summary(view).startswith("queue user-queue: LocalQueue default/user-queue does not")
    # Not readable (RBAC) is not missing; an ended job's queue may be gone since.
    assert q.describe(job(), [], local_queue=None).problem is None
    ended = job()
    ended["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    assert q.describe(ended, [], local_queue_missing=True).problem is None
    assert q.describe(job(queue=None), []) is None


# --------------------------------------------------------------------------------- doctor


class QueueCluster:
    """What doctor's Kueue checks ask: served APIs, the queue objects, dry-run creates."""

    def __init__(self, *, served=True, objects=None, integration=True):
        self.served, self.integration = served, integration
        self.objects = objects or {}

    def job_api_served(self, api):
        return self.served

    def get_object(self, api, name, namespace=None):
        try:
            return self.objects[(api.kind, name)]
        except KeyError:
            raise NotFound(f"get: {api.kind} {name} not found", reason="NotFound") from None

    def list_objects(self, api, namespace=None, selector=None):
        return [o for (kind, _), o in self.objects.items() if kind == api.kind]

    def create_job(self, manifest, dry_run=False):
        out = {**manifest, "spec": {**manifest["spec"]}}
        if self.integration:
            out["spec"]["runPolicy"] = {**out["spec"]["runPolicy"], "suspend": True}
        return out


def manifest(gpus: int = 8, *, queue: str = "user-queue", priority: str | None = None) -> dict:
    labels = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    template = {
        "spec": {
            "containers": [
                {"name": "pytorch", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": gpus}}}
            ]
        }
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "default", "labels": labels},
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}},
        },
    }


OBJECTS = {
    ("LocalQueue", "user-queue"): LOCAL_QUEUE,
    ("ClusterQueue", "cluster-queue"): cluster_queue(),
    ("WorkloadPriorityClass", "low"): {"metadata": {"name": "low"}, "value": 100},
}


def test_doctor_checks_kueue_the_queue_what_feeds_it_and_that_it_can_admit_the_job():
    checks = {c.name: c for c in queue_checks(QueueCluster(objects=OBJECTS), "default", manifest())}
    assert checks["Kueue"].status == OK and "suspends PyTorchJobs" in checks["Kueue"].detail
    assert (
        checks["queue"].detail == "LocalQueue default/user-queue feeds ClusterQueue cluster-queue"
    )
    assert checks["queue admits"].status == OK


def test_doctor_fails_a_queue_that_can_never_admit_the_job_and_forces_through():
    checks = {
        c.name: c for c in queue_checks(QueueCluster(objects=OBJECTS), "default", manifest(24))
    }
    assert checks["queue admits"].status == FAIL
    assert "asks 24 nvidia.com/gpu but ClusterQueue cluster-queue holds at most 16" in (
        checks["queue admits"].detail
    )


def test_doctor_fails_without_kueue_or_its_integration():
    (check,) = queue_checks(QueueCluster(served=False), "default", manifest())
    assert check.status == FAIL and "has no Kueue" in check.detail
    checks = {
        c.name: c
        for c in queue_checks(
            QueueCluster(objects=OBJECTS, integration=False), "default", manifest()
        )
    }
    assert (
        checks["Kueue"].status == FAIL and "does not manage PyTorchJobs" in checks["Kueue"].detail
    )
    assert queue_checks(QueueCluster(), "default", {**manifest(), "metadata": {"labels": {}}}) == []


def test_a_queue_or_priority_class_that_does_not_exist_is_bad_input():
    checks = {
        c.name: c
        for c in queue_checks(
            QueueCluster(objects=OBJECTS), "default", manifest(queue="user-queu", priority="hihg")
        )
    }
    assert checks["queue"].status == FAIL
    assert checks["queue"].detail.startswith(
        "queue: no LocalQueue user-queu in namespace default (got user-queue)"
    )
    assert checks["priority class"].status == FAIL
    assert "no WorkloadPriorityClass hihg (got low)" in checks["priority class"].detail
