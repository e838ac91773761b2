"""`status` reads one snapshot of the job: each object it shows (the job, its pods, the
namespace's events, its Kueue Workloads, its LocalQueue, rank 0's log) is asked of the API
server once, counted where the client makes the requests (`--debug` lists each path with how
often it was asked, as tests/e2e/test_wait.py counts `wait`'s)."""

from __future__ import annotations

import json

import pytest

from localkube.addons import kueue
from localkube.handle import temporary_namespace, wait_until
from tests.e2e.helpers import (
    apply_objects,
    ddpjob,
    debug_reads,
    debug_requests,
    local_queue,
    paced_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def namespace(cluster):
    """A namespace with LocalQueue ``user-queue`` feeding the quick start's ClusterQueue."""
    kueue.require()
    with temporary_namespace(cluster, "reads") as name:
        apply_objects(cluster, local_queue("user-queue", name, kueue.CLUSTER_QUEUE))
        yield name


def _status_json(cluster, name: str, namespace: str) -> dict:
    r = ddpjob(cluster, "status", name, "-n", namespace, "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_status_reads_each_object_once(real_node, namespace, tmp_path):
    cluster, name, ns = real_node, "reads", namespace
    # Two pods (a Master and a Worker) through Kueue, training long enough to be read running.
    spec = paced_spec(
        cluster, tmp_path, name, ns, max_steps=3000, step_s=0.1, log_every=5, every_steps=20,
        queue="user-queue",
    )  # fmt: skip
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stderr

    def readers_have_read() -> dict | None:
        st = _status_json(cluster, name, ns)
        g = st["goodput"] or {}
        ready = (
            st["condition"] == "Running"
            and (st["progress"] or {}).get("step", 0) >= 20
            and st["checkpoint"] is not None
            and (g.get("sources") or {}).get("trainer")
            and (st["queue"] or {}).get("state") == "admitted"
        )
        return st if ready else None

    wait_until("the job running past its first checkpoint", readers_have_read, 300, 2)

    r = ddpjob(cluster, "status", name, "-n", ns, "--debug")
    assert r.returncode == 0, r.stdout + r.stderr
    # What each reader shows came from the one snapshot.
    out = r.stdout
    assert f"PyTorchJob {ns}/{name}: Running" in out, out
    for shown in ("queue: ", "progress: ", "checkpoint: ", "goodput: "):
        assert any(line.startswith(shown) for line in out.splitlines()), (shown, out)
    reads = debug_reads(r.stderr)
    total, _, relists = debug_requests(r.stderr)
    print(f"status made {total} requests: {reads}")
    assert sum(reads.values()) == total and relists == 0, r.stderr
    assert {path: n for (_, path), n in reads.items() if n != 1} == {}, r.stderr
    core, jobs = f"/api/v1/namespaces/{ns}", f"/apis/kubeflow.org/v1/namespaces/{ns}"
    kueue_ns = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}"
    assert set(reads) == {
        ("get", f"{jobs}/pytorchjobs/{name}"),
        # The name is looked up in the other API too (a NAME may be either).
        ("get", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}"),
        ("get", f"{core}/pods"),
        ("get", f"{core}/events"),
        ("get", f"{kueue_ns}/workloads"),
        ("get", f"{kueue_ns}/localqueues/user-queue"),
        ("log", f"{core}/pods/{name}-master-0/log"),
    }, r.stderr
