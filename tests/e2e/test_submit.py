"""submit / wait / status / logs on the local cluster: the real apiserver, the real Kubeflow
training operator, the real trainer in containers of this checkout's image on the real node
(gloo on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localkube.handle import wait_until
from tests.e2e.helpers import (
    QUICKSTART,
    ddpjob,
    plugin_on_claim,
    write_spec,
)
from trainer.contract import is_event, parse_event

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.whole_node
def test_quickstart_submit_wait_follow_succeeds(real_node, namespace, tmp_path):
    # The example as written (its image name included: the cluster holds this checkout's image
    # under it), only shorter.
    cluster = real_node
    r = ddpjob(
        cluster,
        "submit",
        str(QUICKSTART),
        "-n",
        namespace,
        "--wait",
        "--follow",
        "--set",
        "trainer.max_steps=30",
        "--set",
        "trainer.log_every=5",
        "--set",
        "trainer.eval_every=0",
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert f"submitted pytorchjob {namespace}/quickstart" in r.stdout
    assert (
        f"kubectl get pods -l training.kubeflow.org/job-name=quickstart -n {namespace}" in r.stdout
    )
    assert "preflight: ok" in r.stderr
    train = [parse_event(x) for x in r.stdout.splitlines() if is_event(x, "train")]
    steps = [e["step"] for e in train]
    assert steps == sorted(steps) and {10, 20} <= set(steps) and steps[-1] <= 30
    assert all(e["max_steps"] == 30 for e in train)
    assert '{"event": "done"' in r.stdout
    assert f"job {namespace}/quickstart Succeeded" in r.stdout

    st = ddpjob(cluster, "status", "quickstart", "-n", namespace, "-o", "json")
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["condition"] == "Succeeded"
    # The job succeeds when the master does; a worker still exiting then is removed by
    # cleanPodPolicy: Running, so only the master's row is certain.
    master = status["replicas"][0]
    assert (master["replica"], master["phase"], master["exit_code"]) == ("master-0", "Succeeded", 0)
    assert status["progress"]["step"] == 30

    listing = ddpjob(cluster, "list", "-n", namespace, "-l", "app.kubernetes.io/name=ddpjob")
    assert listing.returncode == 0
    assert any(
        line.split()[:5] == ["quickstart", "PyTorchJob", "Succeeded", "-", "2"]  # no queue
        for line in listing.stdout.splitlines()
    )

    again = ddpjob(cluster, "submit", str(QUICKSTART), "-n", namespace)
    assert again.returncode == 1
    assert "already exists" in again.stderr and "--replace" in again.stderr
    assert "Traceback" not in again.stderr

    events = ddpjob(cluster, "events", "quickstart", "-n", namespace)
    assert events.returncode == 0 and "SuccessfulCreatePod" in events.stdout

    png = tmp_path / "curves.png"
    plot = ddpjob(cluster, "plot", "quickstart", "-n", namespace, "-o", str(png))
    assert plot.returncode == 0, plot.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"

    gone = ddpjob(cluster, "delete", "quickstart", "-n", namespace, "--wait")
    assert gone.returncode == 0, gone.stderr
    assert cluster.get_json("pods", "-n", namespace)["items"] == []


def test_a_task_that_raises_fails_with_replica_exit_code_and_last_lines(
    real_node, namespace, tmp_path
):
    cluster = real_node
    env = plugin_on_claim(cluster, namespace, Path(__file__).with_name("failing_task.py"))
    spec = write_spec(
        cluster,
        tmp_path,
        "boom",
        namespace,
        max_steps=200,
        env=env,
        trainer={
            "task": "failing_task:build",
            "task_args": {"fail_at_call": 6, "image_size": 16},
        },
    )
    # --follow: rank 0's traceback streams by, then the explanation.
    r = ddpjob(cluster, "submit", str(spec), "--wait", "--follow")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "RuntimeError: injected failure at call 6 on rank 0" in r.stdout
    failed = (
        f"error: job {namespace}/boom Failed: replica master-0 (pod boom-master-0) "
        "exit code 1 (Error"
    )
    assert failed in r.stderr, r.stderr

    # `wait` of the failed job, as `submit --wait` ends: the replica, its exit code and its last
    # lines, the traceback among them, and no traceback of our own.
    w = ddpjob(cluster, "wait", "boom", "-n", namespace, "--timeout", "30")
    assert w.returncode == 1, w.stdout + w.stderr
    assert "Traceback" not in w.stderr.split("last ")[0]  # our own error has no traceback
    assert failed in w.stderr, w.stderr
    assert "RuntimeError: injected failure at call 6 on rank 0" in w.stderr
    assert "last " in w.stderr and "log lines of master-0:" in w.stderr


def test_a_job_no_node_can_fit_is_refused_and_with_force_says_why_it_waits(
    real_node, namespace, tmp_path
):
    cluster = real_node
    spec = write_spec(
        cluster,
        tmp_path,
        "huge",
        namespace,
        resources={"gpus": 16, "cpu": "1", "memory": "1Gi"},
    )
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 1
    assert "a Master pod asks nvidia.com/gpu: 16 but the largest node has 8 allocatable" in r.stderr
    assert "--force" in r.stderr and "Traceback" not in r.stderr
    assert cluster.get_json("pytorchjobs", "-n", namespace)["items"] == []

    r = ddpjob(cluster, "submit", str(spec), "--force")
    assert r.returncode == 0, r.stderr
    assert "submitted pytorchjob" in r.stdout

    def pending() -> dict | None:
        st = json.loads(ddpjob(cluster, "status", "huge", "-n", namespace, "-o", "json").stdout)
        reasons = [p["reason"] for p in st["pending"]]
        return st if reasons and all("Insufficient nvidia.com/gpu" in x for x in reasons) else None

    st = wait_until("status to say Insufficient nvidia.com/gpu", pending, 60, 1)
    assert st["condition"] in ("Created", "Pending", "Running")
    text = ddpjob(cluster, "status", "huge", "-n", namespace)
    nodes = len(cluster.get_json("nodes")["items"])
    assert f"pending: huge-master-0: Unschedulable: 0/{nodes} nodes are available" in text.stdout

    logs = ddpjob(cluster, "logs", "huge", "-n", namespace)
    assert logs.returncode == 0
    assert "huge-master-0 is pending: Unschedulable" in logs.stderr
    assert "Insufficient nvidia.com/gpu" in logs.stderr

    follow = ddpjob(cluster, "logs", "huge", "-n", namespace, "-f", "--timeout", "4")
    assert follow.returncode == 1
    assert "Insufficient nvidia.com/gpu" in follow.stderr


def test_doctor_on_the_local_control_plane(cluster, namespace):
    r = ddpjob(cluster, "doctor", "-n", namespace)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[  ok] cluster reachable: https://127.0.0.1:")
    assert "[  ok] PyTorchJob CRD: pytorchjobs.kubeflow.org served" in r.stdout
    assert "[  ok] RBAC (PyTorchJob): every verb the CLI uses is allowed" in r.stdout
    assert "[  ok] RBAC (TrainJob): every verb the CLI uses is allowed" in r.stdout
    assert "[  ok] training operator: its admission webhook answered" in r.stdout


def test_doctor_names_missing_rbac_for_a_service_account_without_roles(
    cluster, namespace, tmp_path
):
    import yaml

    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token = cluster.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "nobody", "user": {"token": token}}],
        "contexts": [
            {
                "name": "nobody",
                "context": {
                    "cluster": admin["clusters"][0]["name"],
                    "user": "nobody",
                    "namespace": namespace,
                },
            }
        ],
        "current-context": "nobody",
    }
    path = tmp_path / "nobody.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    r = ddpjob(cluster, "doctor", "--kubeconfig", str(path))
    assert r.returncode == 1, r.stdout
    assert (
        f"[FAIL] RBAC (PyTorchJob): in namespace {namespace} the current user may not: "
        "create pytorchjobs "
        "(for submit)" in r.stdout
    )
    assert "get pods/log (for logs, status progress)" in r.stdout

    r = ddpjob(cluster, "submit", str(QUICKSTART), "--kubeconfig", str(path), "-n", namespace)
    assert r.returncode == 1
    assert "preflight RBAC (PyTorchJob) failed" in r.stderr and "Traceback" not in r.stderr
