"""One `status` asks the cluster for each object once, whoever reads it (the view, the queue,
goodput, the checkpoint): counted at the Cluster's methods, on an in-memory stand-in for a
running 2-pod PyTorchJob in a Kueue queue. tests/e2e/test_status_reads.py counts the same on
the real cluster, at the HTTP requests."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

from controller.errors import NotFound
from controller.jobs.status import job_status
from controller.kubeflow import LABEL_JOB_NAME, LABEL_QUEUE, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE
from trainer.contract import format_event

NS, NAME = "ml", "j"
NOW = datetime.now(timezone.utc)


def stamped(seconds_ago: float, line: str) -> str:
    at = NOW - timedelta(seconds=seconds_ago)
    return f"{at.strftime('%Y-%m-%dT%H:%M:%S')}.000000000Z {line}"


def pod(rtype: str) -> dict[str, Any]:
    labels = {LABEL_JOB_NAME: NAME, LABEL_REPLICA_TYPE: rtype, LABEL_REPLICA_INDEX: "0"}
    running = {"name": "pytorch", "state": {"running": {}}, "restartCount": 0, "ready": True}
    return {
        "metadata": {"name": f"{NAME}-{rtype}-0", "namespace": NS, "uid": rtype, "labels": labels},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Running", "containerStatuses": [running]},
    }


class CountingCluster:
    """What the cluster holds for ``status``, and every read of it, by the object read."""

    server = "https://x"

    def __init__(self) -> None:
        self.reads: Counter[tuple[str, ...]] = Counter()
        self.job = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {
                "name": NAME,
                "namespace": NS,
                "uid": "job-uid",
                "creationTimestamp": (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "labels": {LABEL_QUEUE: "user-queue"},
            },
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 1}}},
            "status": {"conditions": [{"type": "Running", "status": "True"}]},
        }
        self.pods = [pod("master"), pod("worker")]
        self.log = [
            stamped(60, format_event("checkpoint", step=20, path="/ckpt/step_20")),
            stamped(30, format_event("train", step=30, max_steps=100, loss=0.5, steps_per_s=2.0)),
            stamped(30, format_event("goodput", at=NOW.timestamp(), runs=[])),
        ]

    def get_job(self, name, namespace, api=None):
        self.reads[("job", api.plural, name)] += 1
        if api.plural != "pytorchjobs":
            raise NotFound(f"get: {api.kind} {namespace}/{name} not found", reason="NotFound")
        return self.job

    def list_pods(self, namespace, selector):
        self.reads[("pods", namespace)] += 1
        wanted = dict(term.split("=", 1) for term in selector.split(","))
        return [p for p in self.pods if wanted.items() <= p["metadata"]["labels"].items()]

    def list_events(self, namespace, field_selector=None):
        self.reads[("events", namespace)] += 1
        return []

    def list_objects(self, api, namespace=None, selector=None):
        self.reads[(api.plural, namespace or "")] += 1
        if api.kind != "Workload":
            return []
        owner = {"kind": "PyTorchJob", "name": NAME, "uid": "job-uid", "controller": True}
        admitted = [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
        ]
        return [
            {
                "metadata": {
                    "name": f"pytorchjob-{NAME}-abcde",
                    "namespace": NS,
                    "uid": "wl",
                    "labels": {"kueue.x-k8s.io/job-uid": "job-uid"},
                    "ownerReferences": [owner],
                },
                "spec": {"queueName": "user-queue", "priority": 0, "active": True},
                "status": {
                    "conditions": admitted,
                    "admission": {"clusterQueue": "cluster-queue", "podSetAssignments": []},
                },
            }
        ]

    def get_object(self, api, name, namespace=None):
        self.reads[(api.plural, name)] += 1
        return {"metadata": {"name": name}, "spec": {"clusterQueue": "cluster-queue"}}

    def pending_workloads(self, namespace, local_queue):
        self.reads[("pending", local_queue)] += 1
        return None

    def read_log(self, pod, namespace, *, container, tail_lines=None, previous=False, **_):
        self.reads[("log", pod, "previous" if previous else "current")] += 1
        return "\n".join(self.log[-tail_lines:] if tail_lines else self.log) + "\n"


def test_one_status_reads_each_object_once():
    cluster = CountingCluster()
    st = job_status(cluster, NAME, NS)
    # Every reader had what it needed: progress, checkpoint, queue, goodput, the replicas.
    assert st["progress"]["step"] == 30 and st["checkpoint"]["step"] == 20
    assert st["queue"]["state"] == "admitted" and st["queue"]["cluster_queue"] == "cluster-queue"
    assert st["goodput"]["wall_s"] > 0 and st["rank0_pod"] == f"{NAME}-master-0"
    assert [r["pod"] for r in st["replicas"]] == [f"{NAME}-master-0", f"{NAME}-worker-0"]
    assert {what: n for what, n in cluster.reads.items() if n != 1} == {}, cluster.reads
    assert set(cluster.reads) == {
        ("job", "pytorchjobs", NAME),
        ("job", "trainjobs", NAME),  # a NAME may be either API's
        ("pods", NS),
        ("events", NS),
        ("workloads", NS),
        ("localqueues", "user-queue"),
        # The tail has the goodput event: the run before is not read for one.
        ("log", f"{NAME}-master-0", "current"),
    }
