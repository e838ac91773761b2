"""Kueue in the local cluster, against the running process: its objects as upstream's release
installs them (webhooks and CRD conversions served at 127.0.0.1), the quick start's queues with
the node's quota, its own mount namespace, and what it leaves alone."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from controller import kubeflow
from localkube.addons import kueue
from localkube.handle import temporary_namespace, wait_until
from localkube.node import kubelet

pytestmark = pytest.mark.cluster


@pytest.fixture
def namespace(cluster):
    kueue.require()
    with temporary_namespace(cluster, "kq") as name:
        yield name


def _state(cluster) -> dict:
    return json.loads((cluster.control_plane.state_dir / "state.json").read_text())


def test_crds_webhooks_and_conversions_are_served_by_the_kueue_process(cluster):
    kueue.require()
    port = _state(cluster)["ports"]["kueue-webhook"]
    names = kueue.crd_names(_state_manifests(cluster))
    crds = cluster.get_json("crd", *names)["items"]
    assert {c["metadata"]["name"] for c in crds} == set(names)
    for crd in crds:
        established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert established["Established"] == "True", crd["metadata"]["name"]
        conversion = crd["spec"].get("conversion") or {}
        if conversion.get("strategy") == "Webhook":
            url = conversion["webhook"]["clientConfig"]["url"]
            assert url == f"https://127.0.0.1:{port}/convert"
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        hooks = cluster.get_json(kind, f"kueue-{kind.removesuffix('webhookconfiguration')}"
                     "-webhook-configuration")["webhooks"]  # fmt: skip
        assert hooks and all(
            h["clientConfig"]["url"].startswith(f"https://127.0.0.1:{port}/") for h in hooks
        )
    # A v1beta1 read goes through the conversion webhook (the storage version is v1beta2).
    old = cluster.get_json("localqueues.v1beta1.kueue.x-k8s.io", "user-queue", "-n", "default")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"]["clusterQueue"] == kueue.CLUSTER_QUEUE


def _state_manifests(cluster) -> Path:
    return Path(_state(cluster)["tools"]) / "manifests"


def test_the_quick_start_queues_hold_the_real_nodes_cpu_and_memory_and_the_kwok_gpus(cluster):
    kueue.require()
    cq = cluster.get_json("clusterqueue", kueue.CLUSTER_QUEUE)
    (group,) = cq["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    quota = {r["name"]: str(r["nominalQuota"]) for r in flavor["resources"]}
    allocatable = cluster.get_json("node", kubelet.NODE_NAME)["status"]["allocatable"]
    assert flavor["name"] == kueue.FLAVOR
    assert quota == {
        "cpu": allocatable["cpu"],
        "memory": allocatable["memory"],
        "nvidia.com/gpu": str(kueue.kwok_gpus()),
    }
    active = {c["type"]: c["status"] for c in cq["status"]["conditions"]}
    assert active["Active"] == "True"
    lq = cluster.get_json("localqueue", kueue.LOCAL_QUEUE, "-n", kueue.LOCAL_QUEUE_NAMESPACE)
    assert lq["spec"]["clusterQueue"] == kueue.CLUSTER_QUEUE
    assert {c["type"]: c["status"] for c in lq["status"]["conditions"]}["Active"] == "True"
    cluster.get_json("resourceflavor", kueue.FLAVOR)
    # Not installed: the visibility API (its APIService needs a Service; DIFFERENCES).
    services = cluster.kubectl("get", "apiservices", "-o", "name").stdout
    assert "visibility.kueue.x-k8s.io" not in services


def test_kueue_runs_in_its_own_mount_namespace_with_the_clusters_metrics_certificate(cluster):
    """Its metrics certificate is at the fixed path it reads, in its mount namespace only: the
    machine's /etc/kueue/metrics/certs stays an empty mount point, and the endpoint serves the
    cluster CA's certificate."""
    kueue.require()
    pid = _state(cluster)["processes"]["kueue"]["pid"]
    inside = f"/proc/{pid}/root{kueue.METRICS_CERT_PATH}/tls.crt"
    ours = cluster.control_plane.state_dir / "kueue" / "metrics-certs" / "tls.crt"
    with open(inside, "rb") as f:
        assert f.read() == ours.read_bytes()
    assert list(kueue.METRICS_CERT_PATH.iterdir()) == []
    host_ns = subprocess.run(["readlink", "/proc/self/ns/mnt"], capture_output=True, text=True)
    kueue_ns = subprocess.run(["readlink", f"/proc/{pid}/ns/mnt"], capture_output=True, text=True)
    assert host_ns.stdout.strip() != kueue_ns.stdout.strip()
    ctx = ssl.create_default_context(cafile=str(cluster.control_plane.state_dir / "pki" / "ca.crt"))
    port = _state(cluster)["ports"]["kueue-metrics"]
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.getpeercert()  # verified against the cluster CA


def test_a_job_without_a_queue_is_left_alone_and_one_with_a_queue_gets_a_workload(
    cluster, namespace
):
    """manageJobsWithoutQueueName: false. A PyTorchJob without the label runs untouched (no
    Workload, not suspended); with it, Kueue suspends it on create and makes its Workload."""

    def job(name: str, labels: dict) -> str:
        template = {
            "spec": {
                "containers": [
                    {
                        "name": kubeflow.CONTAINER,
                        "image": "busybox",
                        "command": ["true"],
                        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    }
                ]
            }
        }
        return json.dumps(
            {
                "apiVersion": kubeflow.PYTORCHJOB.api_version,
                "kind": kubeflow.PYTORCHJOB.kind,
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "runPolicy": {"suspend": False},
                    "pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": template}},
                },
            }
        )

    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-",
        input_text=json.dumps(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "q"},
                "spec": {"clusterQueue": kueue.CLUSTER_QUEUE},
            }
        ),
    )  # fmt: skip
    cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=job("free", {}))
    queued = {kubeflow.LABEL_QUEUE: "q"}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input_text=job("queued", queued))
    got = cluster.get_json("pytorchjob", "queued", "-n", namespace)
    # Kueue's webhook suspended it on create (our renderer does it too; this job did not).
    uid = got["metadata"]["uid"]

    def workload():
        items = cluster.get_json("workloads", "-n", namespace)["items"]
        return [w for w in items if w["metadata"]["labels"].get(kubeflow.LABEL_JOB_UID) == uid]

    (wl,) = wait_until("the queued job's Workload", workload, 30)
    assert wl["spec"]["queueName"] == "q"
    free = cluster.get_json("pytorchjob", "free", "-n", namespace)
    assert free["spec"]["runPolicy"]["suspend"] is False
    items = cluster.get_json("workloads", "-n", namespace)["items"]
    owners = {o["name"] for w in items for o in w["metadata"].get("ownerReferences", [])}
    assert owners == {"queued"}
