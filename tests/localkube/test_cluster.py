"""The local control plane runs real PyTorchJobs: operator, scheduler, GC, agent, kubectl logs."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time

import pytest

from localkube.handle import temporary_namespace, wait_until

pytestmark = pytest.mark.cluster


def _wait(what: str, probe, timeout: float = 90, interval: float = 0.5):
    return wait_until(what, probe, timeout, interval)


@pytest.fixture
def namespace(cluster):
    """A fresh namespace (PodSecurity 'baseline' enforced) removed after the test."""
    with temporary_namespace(cluster, "t") as name:
        yield name


def _job_yaml(
    name: str,
    ns: str,
    master_cmd: str,
    worker_cmd: str | None = None,
    restart: str = "Never",
    gpus: int | None = None,
) -> str:
    resources = ""
    if gpus is not None:
        resources = f"""
              resources:
                limits:
                  nvidia.com/gpu: {gpus}"""

    def replica(kind: str, cmd: str) -> str:
        return f"""
    {kind}:
      replicas: 1
      restartPolicy: {restart}
      template:
        spec:
          terminationGracePeriodSeconds: 5
          containers:
            - name: pytorch
              image: ddpjob-trainer:test
              command: ["python", "-c", {json.dumps(cmd)}]{resources}"""

    specs = replica("Master", master_cmd)
    if worker_cmd is not None:
        specs += replica("Worker", worker_cmd)
    return f"""apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: {name}
  namespace: {ns}
spec:
  pytorchReplicaSpecs:{specs}
"""


def _get(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def _job_condition(cluster, ns: str, name: str, kind: str) -> bool:
    job = _get(cluster, "pytorchjob", name, "-n", ns)
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in job.get("status", {}).get("conditions", [])
    )


def _pods(cluster, ns: str, job: str) -> list[dict]:
    return _get(cluster, "pods", "-n", ns, "-l", f"training.kubeflow.org/job-name={job}")["items"]


def _pid_of(pod: dict) -> int | None:
    for st in pod.get("status", {}).get("containerStatuses", []):
        if st["name"] == "pytorch" and st.get("containerID", "").startswith("ddpjob://"):
            return int(st["containerID"].split("://")[1])
    return None


PRINT_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE', 'HOSTNAME')}))"
)


def test_pytorchjob_runs_through_operator_and_agent(cluster, namespace):
    """A Master + 1 Worker job: operator makes pods/services with env; logs; Succeeded."""
    cluster.kubectl(
        "apply", "-f", "-", input_text=_job_yaml("envjob", namespace, PRINT_ENV, PRINT_ENV)
    )
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "envjob", "Succeeded"))

    services = {s["metadata"]["name"] for s in _get(cluster, "svc", "-n", namespace)["items"]}
    assert {"envjob-master-0", "envjob-worker-0"} <= services

    pods = {p["metadata"]["name"]: p for p in _pods(cluster, namespace, "envjob")}
    assert set(pods) == {"envjob-master-0", "envjob-worker-0"}
    spec_env = {
        name: {e["name"]: e.get("value") for e in p["spec"]["containers"][0].get("env", [])}
        for name, p in pods.items()
    }
    assert spec_env["envjob-master-0"]["MASTER_ADDR"] == "envjob-master-0"
    assert spec_env["envjob-master-0"]["RANK"] == "0"
    assert spec_env["envjob-worker-0"]["RANK"] == "1"
    assert spec_env["envjob-worker-0"]["WORLD_SIZE"] == "2"
    assert "MASTER_PORT" in spec_env["envjob-master-0"]

    # kubectl logs through apiserver -> kwok's kubelet API -> the agent's log file.
    printed = {}
    for name in pods:
        _wait(
            f"{name} terminated",
            lambda n=name: (
                _get(cluster, "pod", n, "-n", namespace)["status"].get("phase") == "Succeeded"
            ),
        )
        out = subprocess.run(
            [str(cluster.kubectl_path), "logs", name, "-n", namespace, "-c", "pytorch"],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        printed[name] = json.loads(out.strip().splitlines()[-1])
    master, worker = printed["envjob-master-0"], printed["envjob-worker-0"]
    assert master["MASTER_ADDR"] == worker["MASTER_ADDR"] == "127.0.0.1"
    assert master["MASTER_PORT"] == worker["MASTER_PORT"] != "23456"
    assert (master["RANK"], worker["RANK"]) == ("0", "1")
    assert master["WORLD_SIZE"] == worker["WORLD_SIZE"] == "2"

    pod = _get(cluster, "pod", "envjob-master-0", "-n", namespace)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")


def test_gpu_request_beyond_node_capacity_stays_pending(cluster, namespace):
    """16 GPUs per pod fit no node (8 each): Pending with the scheduler's event."""
    cluster.kubectl(
        "apply", "-f", "-", input_text=_job_yaml("toobig", namespace, "print('never')", gpus=16)
    )

    def event() -> str | None:
        events = _get(
            cluster,
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=toobig-master-0",
        )["items"]
        for ev in events:
            if ev["reason"] == "FailedScheduling":
                return ev["message"]
        return None

    message = _wait("FailedScheduling event", event, 60)
    assert "Insufficient nvidia.com/gpu" in message
    pod = _get(cluster, "pod", "toobig-master-0", "-n", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_gpu_request_within_capacity_is_scheduled(cluster, namespace):
    """8 GPUs per pod fit one kwok node each."""
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml("fits", namespace, "print('ok')", "print('ok')", gpus=8),
    )
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "fits", "Succeeded"))
    nodes = {p["spec"]["nodeName"] for p in _pods(cluster, namespace, "fits")}
    assert nodes == {"kwok-node-0", "kwok-node-1"}


def test_deleting_job_removes_pods_and_kills_processes(cluster, namespace, tmp_path):
    """Garbage collection deletes the pods; the agent SIGTERMs their processes."""
    marker = tmp_path / "sigterm"
    cmd = textwrap.dedent(f"""
        import signal, sys, time, pathlib
        def bye(*_):
            pathlib.Path({str(marker)!r}).write_text('terminated')
            sys.exit(143)
        signal.signal(signal.SIGTERM, bye)
        print('sleeping', flush=True)
        time.sleep(600)
    """)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml("sleeper", namespace, cmd, "import time; time.sleep(600)"),
    )

    def running_pids() -> list[int] | None:
        pods = _pods(cluster, namespace, "sleeper")
        pids = [_pid_of(p) for p in pods if p["status"].get("phase") == "Running"]
        return pids if len(pids) == 2 and all(pids) else None

    pids = _wait("both pods Running", running_pids)
    for pid in pids:
        os.kill(pid, 0)  # alive
    cluster.kubectl("delete", "pytorchjob", "sleeper", "-n", namespace, "--wait=false")
    _wait("pods garbage-collected", lambda: not _pods(cluster, namespace, "sleeper"), 60)

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    _wait("processes gone", lambda: all(gone(p) for p in pids), 30)
    assert marker.read_text() == "terminated"


def test_exit_code_143_is_retried_and_succeeds(cluster, namespace, tmp_path):
    """restartPolicy ExitCode: 143 (SIGTERM) is retryable; the operator recreates the pod."""
    marker = tmp_path / "attempted"
    cmd = textwrap.dedent(f"""
        import pathlib, sys
        m = pathlib.Path({str(marker)!r})
        if not m.exists():
            m.write_text('1')
            print('first attempt: exiting 143', flush=True)
            sys.exit(143)
        print('second attempt: ok', flush=True)
    """)
    cluster.kubectl(
        "apply", "-f", "-", input_text=_job_yaml("retry", namespace, cmd, restart="ExitCode")
    )
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "retry", "Succeeded"), 120)
    pod = _get(cluster, "pod", "retry-master-0", "-n", namespace)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0
    logs = cluster.kubectl("logs", "retry-master-0", "-n", namespace).stdout
    assert "second attempt: ok" in logs
    previous = cluster.kubectl("logs", "retry-master-0", "-n", namespace, "--previous").stdout
    assert "first attempt: exiting 143" in previous


def test_exit_code_1_fails_the_job(cluster, namespace):
    """restartPolicy ExitCode: exit 1 is permanent; the job fails and the code is on the pod."""
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml(
            "broken", namespace, "import sys; print('boom'); sys.exit(1)", restart="ExitCode"
        ),
    )
    _wait("job Failed", lambda: _job_condition(cluster, namespace, "broken", "Failed"), 120)
    pod = _get(cluster, "pod", "broken-master-0", "-n", namespace)
    assert pod["status"]["phase"] == "Failed"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (1, "Error")


def test_sigkill_reports_137(cluster, namespace):
    """A process killed with SIGKILL reports exitCode 137 (128 + 9)."""
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml(
            "killed", namespace, "import time; print('up', flush=True); time.sleep(600)"
        ),
    )

    def pid() -> int | None:
        pods = _pods(cluster, namespace, "killed")
        return _pid_of(pods[0]) if pods and pods[0]["status"].get("phase") == "Running" else None

    os.kill(_wait("pod Running", pid), 9)
    _wait(
        "pod Failed",
        lambda: (
            _get(cluster, "pod", "killed-master-0", "-n", namespace)["status"].get("phase")
            == "Failed"
        ),
    )
    pod = _get(cluster, "pod", "killed-master-0", "-n", namespace)
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_pod_security_admission_is_enforced(cluster, namespace):
    """PodSecurity admission rejects a privileged pod in a 'baseline' namespace."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "priv", "namespace": namespace},
        "spec": {
            "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]
        },
    }
    proc = cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod), check=False)
    assert proc.returncode != 0
    assert "violates PodSecurity" in proc.stderr


def test_rbac_is_enforced(cluster):
    """RBAC is on: an unprivileged identity cannot list pods."""
    proc = cluster.kubectl("auth", "can-i", "list", "pods", "--as", "someone", check=False)
    assert proc.stdout.strip() == "no"


def test_operator_webhook_validates(cluster, namespace):
    """The operator's validating webhook rejects a PyTorchJob without a 'pytorch' container."""
    bad = _job_yaml("badname", namespace, "print(1)").replace("name: pytorch", "name: other")
    proc = cluster.kubectl("apply", "-f", "-", input_text=bad, check=False)
    assert proc.returncode != 0
    assert "pytorch" in proc.stderr


def test_on_failure_restarts_in_place_with_restart_count(cluster, namespace, tmp_path):
    """restartPolicy OnFailure: the agent restarts the container in place (restartCount 1),
    and `kubectl logs --previous` shows the failed run."""
    marker = tmp_path / "ran"
    cmd = textwrap.dedent(f"""
        import pathlib, sys
        m = pathlib.Path({str(marker)!r})
        if not m.exists():
            m.write_text('1')
            print('run 1 fails', flush=True)
            sys.exit(3)
        print('run 2 ok', flush=True)
    """)
    cluster.kubectl(
        "apply", "-f", "-", input_text=_job_yaml("inplace", namespace, cmd, restart="OnFailure")
    )
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "inplace", "Succeeded"), 120)
    pod = _get(cluster, "pod", "inplace-master-0", "-n", namespace)
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["state"]["terminated"]["exitCode"] == 0
    assert "run 2 ok" in cluster.kubectl("logs", "inplace-master-0", "-n", namespace).stdout
    previous = cluster.kubectl("logs", "inplace-master-0", "-n", namespace, "-p").stdout
    assert "run 1 fails" in previous


def test_logs_follow_streams_and_ends_when_the_container_exits(cluster, namespace):
    """`kubectl logs -f` streams lines as they come and returns once the process exits."""
    cmd = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(1)"
    cluster.kubectl("apply", "-f", "-", input_text=_job_yaml("follow", namespace, cmd))

    def running() -> bool:
        pods = _pods(cluster, namespace, "follow")
        return bool(pods) and pods[0]["status"].get("phase") == "Running"

    _wait("pod Running", running, 60, 0.1)
    start = time.monotonic()
    out = subprocess.run(
        [str(cluster.kubectl_path), "logs", "-f", "follow-master-0", "-n", namespace],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert [line for line in out.splitlines() if line.startswith("tick")] == [
        f"tick {i}" for i in range(4)
    ]
    assert time.monotonic() - start < 30
