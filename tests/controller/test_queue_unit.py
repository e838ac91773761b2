"""Where a job stands in Kueue, read from API dicts without a cluster: its Workload's state,
what it waits for and why in Kueue's words, whether its queue can ever admit it, what preempted
it, whether Kueue manages its kind, and the doctor's queue checks. The dicts have the shapes
Kueue v0.19 wrote on the local cluster (a pending Workload, one admitted, one preempted and
requeued; ``cluster-queue`` with its reservation; the not-admitted conditions with default
feature gates and with ``UnadmittedWorkloadsObservability``). The same on the real Kueue:
tests/e2e/test_queue.py (status and wait), tests/e2e/test_kueue_integration.py (doctor,
submit, status and wait where Kueue ignores the job's kind)."""

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
    """What doctor's Kueue checks ask: served APIs, the queue objects, Kueue's ConfigMap (a
    dict, or the error reading it raises), dry-run creates (suspended by Kueue's webhook when
    ``integration``)."""

    def __init__(self, *, served=True, objects=None, integration=True, config_map=None):
        self.served, self.integration = served, integration
        self.objects = objects or {}
        self.config_map = config_map or NotFound("no ConfigMap", reason="NotFound")
        self.created: list[dict] = []
        self.config_reads = 0

    def get_config_map(self, name, namespace):
        assert (namespace, name) == ("kueue-system", "kueue-manager-config")
        self.config_reads += 1
        if isinstance(self.config_map, Exception):
            raise self.config_map
        return self.config_map

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
        assert dry_run
        self.created.append(manifest)
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
    cluster = QueueCluster(objects=OBJECTS)
    checks = {c.name: c for c in queue_checks(cluster, "default", manifest())}
    kueue = checks["Kueue (PyTorchJob)"]
    assert kueue.status == OK and "Kueue manages PyTorchJobs" in kueue.detail
    assert "its webhook suspended a dry-run PyTorchJob with a queue" in kueue.detail
    # The probe: the job, not suspended, under a name of its own, with the job's queue only.
    (probe,) = cluster.created
    assert probe["metadata"] == {
        "name": "ddpjob-kueue-probe",
        "namespace": "default",
        "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
    }
    assert probe["spec"]["runPolicy"]["suspend"] is False
    assert probe["spec"]["pytorchReplicaSpecs"] == manifest()["spec"]["pytorchReplicaSpecs"]
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
    kueue = checks["Kueue (PyTorchJob)"]
    assert kueue.status == FAIL
    assert kueue.detail.startswith(
        "Kueue does not manage PyTorchJobs on this cluster (kubeflow.org/pytorchjob is not among "
        "its integrations): a job with queue: stays suspended forever, with no Workload. Enable "
        "kubeflow.org/pytorchjob in Kueue's integrations.frameworks (ConfigMap "
        "kueue-system/kueue-manager-config, key controller_manager_config.yaml) and restart "
        "Kueue, or submit without queue: (seen: no ConfigMap"
    )
    assert "its webhook left a dry-run PyTorchJob with a queue unsuspended" in kueue.detail
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


# --------------------------------------------------------------------------------- Kueue's words

WAITING = (
    "couldn't assign flavors to pod set master: insufficient unused quota for nvidia.com/gpu in "
    "flavor default-flavor, 8 more needed"
)
TOO_BIG = (
    "couldn't assign flavors to pod set master: insufficient quota for nvidia.com/gpu in flavor "
    "default-flavor, previously considered podsets requests (0) + current podset request (24) > "
    "maximum capacity (16)"
)
NO_RESERVATION = cond(
    "Admitted", "False", reason="NoReservation", message="The workload has no reservation"
)


@pytest.mark.parametrize(
    ("conditions", "want"),
    [
        # Default feature gates: one reason, the flavor assigner's message says which case.
        ([cond("QuotaReserved", "False", reason="Pending", message=WAITING)], ("Pending", WAITING)),
        ([cond("QuotaReserved", "False", reason="Pending", message=TOO_BIG)], ("Pending", TOO_BIG)),
        # UnadmittedWorkloadsObservability: the reason says it, Admitted says NoReservation.
        (
            [
                cond("QuotaReserved", "False", reason="WaitingForQuota", message=WAITING),
                NO_RESERVATION,
            ],
            ("WaitingForQuota", WAITING),
        ),
        (
            [
                cond("QuotaReserved", "False", reason="ExceedsMaxQuota", message=TOO_BIG),
                NO_RESERVATION,
            ],
            ("ExceedsMaxQuota", TOO_BIG),
        ),
        (
            [
                cond(
                    "QuotaReserved",
                    "False",
                    reason="Misconfigured",
                    message="LocalQueue nosuch doesn't exist",
                ),
                NO_RESERVATION,
            ],
            ("Misconfigured", "LocalQueue nosuch doesn't exist"),
        ),
        # Quota reserved, admission checks not ready: Admitted's words.
        (
            [
                cond("QuotaReserved", "True", reason="QuotaReserved"),
                cond(
                    "Admitted",
                    "False",
                    reason="UnsatisfiedAdmissionChecks",
                    message="The workload has not all checks ready",
                ),
            ],
            ("UnsatisfiedAdmissionChecks", "The workload has not all checks ready"),
        ),
        # Gated: Admitted=False alone before the scheduler looked.
        ([NO_RESERVATION], ("NoReservation", "The workload has no reservation")),
        ([], None),  # Kueue has not looked at it yet
        (ADMITTED, None),
    ],
    ids=[
        "pending",
        "pending-too-big",
        "waiting",
        "exceeds",
        "misconfigured",
        "checks",
        "no-reservation",
        "none",
        "admitted",
    ],
)
def test_kueues_verdict_is_its_quota_reserved_else_admitted_condition(conditions, want):
    assert q.verdict(workload(conditions=conditions)) == want


def test_status_says_kueues_reason_beside_the_queue_and_what_it_means():
    view = q.describe(
        job(),
        [workload(conditions=PENDING)],
        local_queue=LOCAL_QUEUE,
        cluster_queue=cluster_queue(gpus_reserved=16),
    )
    assert (view.reason, view.message) == ("Pending", PENDING[0]["message"])
    assert q.summary(view).endswith(
        "waits for 8 nvidia.com/gpu of 0 free (quota 16, flavor default-flavor)"
    )
    assert q.verdict_line(view) == "Kueue says Pending: " + WAITING
    for reason in ("Pending", "ExceedsMaxQuota"):
        too_big = [cond("QuotaReserved", "False", reason=reason, message=TOO_BIG)]
        view = q.describe(job(), [workload(conditions=too_big, gpus=24)], local_queue=LOCAL_QUEUE)
        assert q.verdict_line(view) == (
            f"Kueue says {reason}: {TOO_BIG} (the job asks more than the ClusterQueue can ever "
            "hold: lower resources or nodes)"
        )
        assert view.as_dict()["reason"] == reason
    misconfigured = [
        cond(
            "QuotaReserved",
            "False",
            reason="Misconfigured",
            message="LocalQueue nosuch doesn't exist",
        )
    ]
    view = q.describe(job(), [workload(conditions=misconfigured)])
    assert q.verdict_line(view) == (
        "Kueue says Misconfigured: LocalQueue nosuch doesn't exist (this does not clear by itself)"
    )
    # Admitted, or not looked at yet: nothing of Kueue's to quote.
    assert q.verdict_line(q.describe(job(), [workload(conditions=ADMITTED)])) is None
    assert q.verdict_line(q.describe(job(), [workload()])) is None


def test_kueues_events_are_told_apart_by_the_workloads_name():
    def ev(name, reason="Pending", type_="Warning", kind="Workload", **times):
        return {"type": type_, "reason": reason, "message": f"{reason} of {name}",
                "involvedObject": {"kind": kind, "name": name}, **times}  # fmt: skip

    mine, other = "pytorchjob-low-0a1b2", "pytorchjob-low-high-0a1b2"
    assert q.workload_event("PyTorchJob", "low", ev(mine))
    assert not q.workload_event("PyTorchJob", "low", ev(other))  # job low-high's
    assert not q.workload_event("TrainJob", "low", ev(mine))
    assert not q.workload_event("PyTorchJob", "low", ev(mine, kind="Pod"))
    # The newest by when it was last seen: a repeated event's series counts, not its first time.
    first = ev(mine, "Pending", eventTime="2026-11-25T23:50:00.000001Z",
               series={"lastObservedTime": "2026-11-25T23:55:00.000000Z", "count": 3})  # fmt: skip
    second = ev(mine, "WaitingForQuota", eventTime="2026-11-25T23:52:00.000000Z")
    assert q.said_last("PyTorchJob", "low", [second, first, ev(other)]) == (
        "Pending",
        f"Pending of {mine}",
    )
    admitted = ev(mine, "QuotaReserved", "Normal", lastTimestamp="2026-11-25T23:56:00Z")
    assert q.said_last("PyTorchJob", "low", [first, second, admitted]) is None
    assert q.said_last("PyTorchJob", "low", [ev(other)]) is None


# --------------------------------------------------------------------------------- integrations

V019 = """apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
integrations:
  frameworks:
  - "batch/job"
  - "kubeflow.org/mpijob"
  - "trainer.kubeflow.org/trainjob"
"""


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (V019, ["batch/job", "kubeflow.org/mpijob", "trainer.kubeflow.org/trainjob"]),
        ("integrations:\n  frameworks: []\n", ["batch/job"]),  # empty: Kueue's default
        ("integrations: {}\n", ["batch/job"]),
        ("apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n", ["batch/job"]),
        ("integrations:\n  frameworks: batch/job\n", None),  # not a list: cannot tell
        ("- not a mapping\n", None),
        ("a: [unclosed\n", None),
        ("", None),
        (None, None),
    ],
    ids=["v0.19", "empty-list", "empty-section", "absent", "not-a-list", "list", "not-yaml",
         "empty", "missing"],
)  # fmt: skip
def test_the_frameworks_of_kueues_configuration(text, want):
    assert q.integrations(text) == want


def config_map(text: str) -> dict:
    return {
        "metadata": {"name": "kueue-manager-config"},
        "data": {"controller_manager_config.yaml": text},
    }


def test_kueue_that_ignores_the_kind_is_caught_from_its_configmap_and_its_webhook():
    from controller.errors import Forbidden
    from controller.jobs.doctor import WARN

    def kueue(cluster):
        (check,) = [
            c for c in queue_checks(cluster, "default", manifest()) if c.name.startswith("Kueue")
        ]
        return check

    # The ConfigMap of upstream's v0.19 configuration: PyTorchJob not listed; the webhook agrees.
    check = kueue(QueueCluster(objects=OBJECTS, integration=False, config_map=config_map(V019)))
    assert check.status == FAIL and check.detail.startswith("Kueue does not manage PyTorchJobs")
    assert (
        "(seen: ConfigMap kueue-system/kueue-manager-config lists batch/job, "
        "kubeflow.org/mpijob, trainer.kubeflow.org/trainjob; its webhook left" in check.detail
    )
    # RBAC refuses the ConfigMap: the webhook alone tells.
    refused = Forbidden("get: forbidden", reason="Forbidden")
    check = kueue(QueueCluster(objects=OBJECTS, integration=False, config_map=refused))
    assert (
        check.status == FAIL
        and "may not read ConfigMap kueue-system/kueue-manager-config" in check.detail
    )
    check = kueue(QueueCluster(objects=OBJECTS, config_map=refused))
    assert check.status == OK
    # Listed, but the running Kueue ignores it: it was not restarted since.
    listed = config_map(V019.replace('"batch/job"', '"kubeflow.org/pytorchjob"'))
    check = kueue(QueueCluster(objects=OBJECTS, integration=False, config_map=listed))
    assert check.status == FAIL
    assert (
        "Its ConfigMap lists kubeflow.org/pytorchjob already: Kueue reads it only at start, "
        "restart it" in check.detail
    )
    # Managed now, but not listed: the next restart stops it.
    check = kueue(QueueCluster(objects=OBJECTS, config_map=config_map(V019)))
    assert check.status == WARN and "after its next restart it will not" in check.detail


def test_doctor_without_a_job_says_which_kinds_kueue_manages():
    from controller.jobs.doctor import WARN
    from controller.jobs.read.apis import PYTORCHJOB_KIND

    cluster = QueueCluster(objects=OBJECTS, integration=False, config_map=config_map(V019))
    checks = {c.name: c for c in queue_checks(cluster, "default", None, [PYTORCHJOB_KIND])}
    # Only specs with a queue need it: a warning, not a failure.
    assert checks["Kueue (PyTorchJob)"].status == WARN
    assert checks["Kueue (PyTorchJob)"].detail.startswith("Kueue does not manage PyTorchJobs")
    (probe,) = cluster.created
    assert probe["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] == 1


def test_doctor_reads_kueues_configuration_once_for_every_kind():
    from controller.jobs.read.apis import PYTORCHJOB_KIND, TRAINJOB_KIND

    cluster = QueueCluster(objects=OBJECTS, integration=False, config_map=config_map(V019))
    kinds = [PYTORCHJOB_KIND, TRAINJOB_KIND]
    checks = {c.name: c for c in queue_checks(cluster, "default", None, kinds)}
    assert cluster.config_reads == 1
    assert [p["kind"] for p in cluster.created] == ["PyTorchJob", "TrainJob"]  # a dry run each
    # Both verdicts read the one Configuration: it lists TrainJobs, not PyTorchJobs.
    for kind in ("PyTorchJob", "TrainJob"):
        assert "ConfigMap kueue-system/kueue-manager-config lists batch/job" in (
            checks[f"Kueue ({kind})"].detail
        ), checks


class StatusCluster(QueueCluster):
    """What ``read_queue`` asks beyond doctor: the namespace's Workloads, the visibility API."""

    def __init__(self, workloads=(), **kw):
        super().__init__(**kw)
        self.workloads = list(workloads)

    def list_objects(self, api, namespace=None, selector=None):
        if api.kind == "Workload":
            return self.workloads
        return super().list_objects(api, namespace, selector)

    def pending_workloads(self, namespace, local_queue):
        return None


def test_status_of_a_held_job_without_a_workload_says_kueue_ignores_its_kind():
    from controller.jobs.queue import read_queue
    from controller.jobs.snapshot import Snapshot

    view = read_queue(Snapshot(StatusCluster(objects=OBJECTS, integration=False), job()))
    assert view.problem is not None and view.problem.startswith("Kueue does not manage PyTorchJobs")
    assert q.summary(view).startswith("queue user-queue -> cluster-queue: Kueue does not manage")
    # Kueue manages it: a Workload is on its way, as before.
    cluster = StatusCluster(objects=OBJECTS)
    view = read_queue(Snapshot(cluster, job()))
    assert view.problem is None and view.state == q.WAITING_FOR_KUEUE
    # A Workload there: no probe at all.
    cluster = StatusCluster([workload(conditions=PENDING)], objects=OBJECTS, integration=False)
    view = read_queue(Snapshot(cluster, job()))
    assert cluster.created == [] and (view.state, view.reason) == (q.PENDING, "Pending")


def test_wait_says_by_what_a_job_was_admitted_also_when_kueue_was_first():
    """QueueNotes (``wait``, ``--follow``): seen queued, then started, it says where the job
    waited and by what it was admitted; first seen already started (Kueue unsuspends the job
    before its operator's status says so), it still says by what. A job first seen further on
    gets no queue line, nor does a job without a queue."""
    from controller.jobs.queue import QueueNotes

    admitted = [workload(conditions=ADMITTED, admitted_cq="cluster-queue")]
    said = "admitted by cluster-queue at 2026-11-25T23:52:15Z"
    cluster = StatusCluster([workload(conditions=PENDING)], objects=OBJECTS)
    notes = QueueNotes(cluster)
    assert notes.see(job()).startswith("queued in user-queue -> cluster-queue")
    cluster.workloads = admitted
    assert notes.see(job(suspend=False)) == said
    assert notes.see(job(suspend=False)) is None  # nothing new

    assert QueueNotes(StatusCluster(admitted, objects=OBJECTS)).see(job(suspend=False)) == said
    finished = [
        workload(
            conditions=[*ADMITTED, cond("Finished", "True", reason="Succeeded")],
            admitted_cq="cluster-queue",
        )
    ]
    assert QueueNotes(StatusCluster(finished, objects=OBJECTS)).see(job(suspend=False)) is None
    no_queue = QueueNotes(StatusCluster(admitted, objects=OBJECTS))
    assert no_queue.see(job(suspend=False, queue=None)) is None
