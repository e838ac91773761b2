"""A node that failed a job twice is left behind by the job's next pods, with the real scheduler
on the local cluster.

A PyTorchJob of one pod of two processes on the real node, its pods running as k8s/rbac.yaml's
`ddpjob-trainer`; rank 1's data set (tests/e2e/hangtask.py, the job's workdir) hangs in every
run, so the job restarts itself twice, each time recording the stuck rank's node on the job. At
the second, rank 0 patches the job's pod template with a preferred node anti-affinity, and the
pod the operator creates next is placed elsewhere: on healthy capacity, a kwok node this test
adds (it runs nothing; tainted for this job alone, and cordoned until the second hang is named,
so that the first two runs have the real node only). The affinity is asserted on the pod the
scheduler placed; `status` lists the node the job avoids, and why.

The record's and the patch's rules on their own: tests/trainer/test_bad_nodes.py; a lost rank
named with its node by rank 0: tests/trainer/test_restart.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from localkube.controlplane import bootstrap
from localkube.node import kubelet
from tests.e2e import hangtask
from tests.e2e.helpers import (
    Background,
    ddpjob,
    project,
    s3_checkpoints,
    trainer_account,
    write_spec,
)
from trainer.contract import read_node_faults
from trainer.health.nodes import avoid_affinity

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RESTART_AFTER_S = 10
CAUSE = f"stuck: rank 1 in hangtask.py:_stuck_here on node {kubelet.NODE_NAME}"
TAINT_KEY = "ddpjob.io/heal-test"


def _healthy_node(namespace: str) -> dict:
    """A kwok node with CPU capacity that only this test's job tolerates, cordoned."""
    node = bootstrap.kwok_node(f"healthy-{namespace}"[:63])
    node["spec"] = {
        "taints": [{"key": TAINT_KEY, "value": namespace, "effect": "NoSchedule"}],
        "unschedulable": True,
    }
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    node["status"] = {"capacity": capacity, "allocatable": capacity}
    node["metadata"]["labels"] = {
        k: v for k, v in node["metadata"]["labels"].items() if not k.startswith("nvidia.com/")
    } | {"kubernetes.io/hostname": node["metadata"]["name"]}
    return node


def _wait_for(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def test_a_node_that_failed_the_job_twice_is_avoided_by_its_next_pod(
    real_node, namespace, tmp_path
):
    cluster, name = real_node, "leaves"
    healthy = _healthy_node(namespace)
    node_name = healthy["metadata"]["name"]
    trainer = {
        "task": "hangtask:build",
        "task_args": {"image_size": 16, "hang_rank": 1, "hang_at": 3 * 16 + 1, "hang_s": 1200},
        "batch_size": 16, "timeout_s": 1800,
        "watchdog": {"stuck_after_s": 3, "restart_after_s": RESTART_AFTER_S},
    }  # fmt: skip
    fields = s3_checkpoints(cluster, namespace, name, {"trainer": trainer}, every_steps=2)
    fields["volumes"] = []  # no claim: its local volume would hold the pod on the real node
    spec = write_spec(
        cluster, tmp_path, name, namespace, nodes=1, nproc_per_node=2, max_steps=40,
        workdir=project(tmp_path, Path(hangtask.__file__)),
        service_account=trainer_account(cluster, namespace),
        tolerations=[{"key": TAINT_KEY, "operator": "Equal", "value": namespace,
                      "effect": "NoSchedule"}],
        **fields,
    )  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(healthy))
    pod = f"{name}-master-0"
    wait = None
    try:
        r = ddpjob(cluster, "submit", str(spec))
        assert r.returncode == 0, r.stdout + r.stderr
        wait = Background(cluster, tmp_path, "wait", "wait", name, "-n", namespace)

        def faults() -> list[dict]:
            return read_node_faults(cluster.get_json("pytorchjob", name, "-n", namespace))[0]

        # The first run hangs and restarts: one fault on the real node, recorded on the job.
        _wait_for("the first fault", lambda: len(faults()) == 1, 300)
        # The second run hangs: once it is named, the healthy capacity comes (before the
        # restart, RESTART_AFTER_S later, which records the second fault).
        _wait_for(
            "the second run's verdict",
            lambda: sum('"culprit": 1' in x for x in cluster.pod_log_lines(namespace, pod)) >= 2,
            300,
        )
        cluster.kubectl("uncordon", node_name)
        assert len(faults()) == 1, "the second restart came before the healthy node did"

        def placed() -> dict | None:
            # Between the restart's deletion of the pod and the operator's next one, none is.
            p = cluster.get_json("pod", pod, "-n", namespace, missing_ok=True)
            return p if p is not None and p["spec"].get("nodeName") == node_name else None

        moved = _wait_for("the next pod on the healthy node", placed, RESTART_AFTER_S + 120)
        job = cluster.get_json("pytorchjob", name, "-n", namespace)
        recorded, avoided = read_node_faults(job)
        assert [(f["node"], f["rank"], f["cause"]) for f in recorded] == [
            (kubelet.NODE_NAME, 1, CAUSE)
        ] * 2
        assert avoided == [kubelet.NODE_NAME]
        assert moved["spec"]["affinity"] == avoid_affinity([kubelet.NODE_NAME])
        template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        assert template["affinity"] == avoid_affinity([kubelet.NODE_NAME])
        assert not moved["status"].get("containerStatuses")  # kwok starts nothing

        status = ddpjob(cluster, "status", name, "-n", namespace)
        assert status.returncode == 0, status.stderr
        assert (
            f"avoids node {kubelet.NODE_NAME}: 2 fault(s) of this job there ({CAUSE}; {CAUSE})"
            in status.stdout
        ), status.stdout
        st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
        assert st["nodes"]["avoided"] == [kubelet.NODE_NAME]
    finally:
        if wait is not None:
            wait.stop()
        ddpjob(cluster, "delete", name, "-n", namespace, "--wait", timeout=150)
        cluster.kubectl("delete", "node", node_name, "--wait=false", check=False)
