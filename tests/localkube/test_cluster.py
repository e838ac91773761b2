"""The local cluster runs real PyTorchJobs: operator, scheduler, GC, the kubelet, kubectl logs.

Every pod runs on the real node, in containers of this checkout's trainer image under the name
the examples use (``builds.images.published_ref()``): a PyTorchJob written as the Kubeflow docs
write one, with no placement, lands there; the kwok nodes are GPU capacity only, and a pod bound to
one is never started.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time

import pytest

from localkube.builds import images
from localkube.controlplane import bootstrap
from localkube.handle import temporary_namespace, wait_until
from localkube.node import kubelet

pytestmark = pytest.mark.cluster


def _wait(what: str, probe, timeout: float = 90, interval: float = 0.5):
    return wait_until(what, probe, timeout, interval)


@pytest.fixture
def namespace(real_node):
    """A fresh namespace (PodSecurity 'baseline' enforced) removed after the test."""
    with temporary_namespace(real_node, "t") as name:
        yield name


def _job_yaml(
    name: str,
    ns: str,
    master_cmd: str,
    worker_cmd: str | None = None,
    restart: str = "Never",
    gpus: int | None = None,
    volume: dict | None = None,
) -> str:
    """A PyTorchJob as the Kubeflow docs write one: replicas, a restart policy, a container
    ``pytorch`` with an image and a command; no node selector, no tolerations. ``volume``: one
    pod volume mounted at /state (the image's user, uid 1000, owns it through fsGroup)."""
    resources = ""
    if gpus is not None:
        resources = f"""
              resources:
                limits:
                  nvidia.com/gpu: {gpus}"""
    mounts = pod_volumes = ""
    if volume is not None:
        mounts = """
              volumeMounts:
                - {name: state, mountPath: /state}"""
        pod_volumes = f"""
          securityContext: {{fsGroup: 1000}}
          volumes:
            - {json.dumps({"name": "state", **volume})}"""

    def replica(kind: str, cmd: str) -> str:
        return f"""
    {kind}:
      replicas: 1
      restartPolicy: {restart}
      template:
        spec:
          terminationGracePeriodSeconds: 5{pod_volumes}
          containers:
            - name: pytorch
              image: {images.published_ref()}
              command: ["python3", "-c", {json.dumps(cmd)}]{resources}{mounts}"""

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


def _job_condition(cluster, ns: str, name: str, kind: str) -> bool:
    job = cluster.get_json("pytorchjob", name, "-n", ns)
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in job.get("status", {}).get("conditions", [])
    )


def _pods(cluster, ns: str, job: str) -> list[dict]:
    return cluster.get_json("pods", "-n", ns, "-l", f"training.kubeflow.org/job-name={job}")[
        "items"
    ]


# What each replica saw: the operator's variables, and what cluster DNS says MASTER_ADDR is
# (retried: the master's Service gets its address once the master pod runs).
PRINT_ENV = textwrap.dedent("""
    import json, os, socket, time
    def resolve(name):
        for _ in range(240):
            try:
                return socket.gethostbyname(name)
            except OSError:
                time.sleep(1)
        raise SystemExit(f"{name} did not resolve in 240 tries")
    ip = resolve(os.environ["MASTER_ADDR"])
    keys = ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE', 'HOSTNAME')
    print(json.dumps({**{k: os.environ.get(k) for k in keys}, 'resolved': ip}), flush=True)
    # A finished pod leaves its Service, so neither may end before the other is done with its
    # name. The worker resolved the master's above and then waits for the master to connect to
    # it by name; the master ends only after that connection. (A fixed linger raced: the
    # master's first lookup of the worker, made before the worker's record existed, is cached
    # as a miss by the DNS server for longer than the worker stayed.)
    me = os.environ['HOSTNAME']
    if me.endswith('-master-0'):
        worker = me[: -len('master-0')] + 'worker-0'
        deadline = time.monotonic() + 240
        while True:
            try:
                socket.create_connection((resolve(worker), 12345), timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    else:
        with socket.create_server(("", 12345)) as server:
            server.settimeout(240)
            server.accept()[0].close()
""")


def test_a_kubeflow_docs_pytorchjob_runs_in_the_image_with_a_dns_master_addr(real_node, namespace):
    """A Master + 1 Worker job with no placement: the operator makes pods, Services and env; the
    pods run on the real node in the image; MASTER_ADDR is the master's name, which cluster DNS
    resolves to the master pod's IP; logs; Succeeded."""
    cluster = real_node
    cluster.kubectl(
        "apply", "-f", "-", input_text=_job_yaml("envjob", namespace, PRINT_ENV, PRINT_ENV)
    )
    # Two pods that each wait for the other: minutes on a loaded node, not seconds.
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "envjob", "Succeeded"), 300)

    services = {s["metadata"]["name"] for s in cluster.get_json("svc", "-n", namespace)["items"]}
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

    # kubectl logs through apiserver -> the kubelet -> containerd's log file.
    printed = {}
    for name in pods:
        _wait(
            f"{name} terminated",
            lambda n=name: (
                cluster.get_json("pod", n, "-n", namespace)["status"].get("phase") == "Succeeded"
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
    assert master["MASTER_ADDR"] == worker["MASTER_ADDR"] == "envjob-master-0"  # not rewritten
    assert master["MASTER_PORT"] == worker["MASTER_PORT"] == "23456"  # the operator's port
    assert (master["RANK"], worker["RANK"]) == ("0", "1")
    assert master["WORLD_SIZE"] == worker["WORLD_SIZE"] == "2"
    master_ip = pods["envjob-master-0"]["status"]["podIP"]
    assert master_ip and worker["resolved"] == master["resolved"] == master_ip

    for name in pods:
        pod = cluster.get_json("pod", name, "-n", namespace)
        assert pod["spec"]["nodeName"] == kubelet.NODE_NAME
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"].endswith(images.published_ref()) and status["imageID"]
        term = status["state"]["terminated"]
        assert (term["exitCode"], term["reason"]) == (0, "Completed")


def test_gpu_request_beyond_node_capacity_stays_pending(real_node, namespace):
    """16 GPUs per pod fit no node (8 each): Pending with the scheduler's event."""
    cluster = real_node
    cluster.kubectl(
        "apply", "-f", "-", input_text=_job_yaml("toobig", namespace, "print('never')", gpus=16)
    )

    def event() -> str | None:
        events = cluster.get_json(
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
    pod = cluster.get_json("pod", "toobig-master-0", "-n", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_gpu_pods_are_bound_to_the_kwok_nodes_and_never_started(real_node, namespace):
    """8 GPUs per pod fit one kwok node each: the API server's ExtendedResourceToleration gave
    them the GPU nodes' toleration (nothing else can land there), the scheduler binds them,
    and nothing starts them: no container status, still Pending seconds later."""
    cluster = real_node
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml("fits", namespace, "print('ok')", "print('ok')", gpus=8),
    )

    def bound() -> list[dict] | None:
        pods = _pods(cluster, namespace, "fits")
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = _wait("both pods bound", bound, 60)
    assert {p["spec"]["nodeName"] for p in pods} == set(bootstrap.KWOK_NODES)
    for p in pods:
        tolerations = p["spec"].get("tolerations") or []
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
            tolerations
        ), tolerations
    time.sleep(5)
    for p in _pods(cluster, namespace, "fits"):
        assert p["status"].get("phase") == "Pending", p["status"]
        assert not p["status"].get("containerStatuses"), p["status"]
    assert not _job_condition(cluster, namespace, "fits", "Succeeded")
    # No kubelet confirms a delete there: kwok's pod-delete stage does, or the pod (and its
    # namespace) would stay Terminating for good.
    cluster.kubectl("delete", "pytorchjob", "fits", "-n", namespace)
    _wait("the kwok-bound pods gone", lambda: _pods(cluster, namespace, "fits") == [], 60)


def test_a_cpu_pod_never_lands_on_a_kwok_node(real_node, namespace):
    """The kwok nodes' taint keeps a pod that does not tolerate it off them: pinned to one by
    name (nodeSelector), it stays unschedulable and says why."""
    cluster = real_node
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": bootstrap.KWOK_NODES[0]},
            "containers": [{"name": "c", "image": images.published_ref()}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(manifest))

    def unschedulable() -> str | None:
        conditions = cluster.get_json("pod", "pinned", "-n", namespace)["status"].get("conditions")
        scheduled = next((c for c in conditions or [] if c["type"] == "PodScheduled"), {})
        return scheduled.get("message") if scheduled.get("reason") == "Unschedulable" else None

    message = _wait("the pod Unschedulable", unschedulable, 60)
    assert "untolerated taint" in message and "nvidia.com/gpu" in message, message


def test_deleting_job_removes_pods_and_terminates_their_containers(real_node, namespace):
    """Garbage collection deletes the pods; the kubelet SIGTERMs their containers."""
    cluster = real_node
    cmd = textwrap.dedent("""
        import signal, sys, time
        def bye(*_):
            print('terminated', flush=True)
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
        pids = [cluster.pod_pid(namespace, p) for p in pods]
        return pids if len(pids) == 2 and all(pids) else None

    def master_sleeping() -> bool:
        return "sleeping" in cluster.pod_log_lines(namespace, "sleeper-master-0")

    pids = _wait("both containers running", running_pids)
    _wait("the master's handler installed", master_sleeping, 60)
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
    assert cluster.pod_log_lines(namespace, "sleeper-master-0")[-1] == "terminated"


def test_exit_code_143_is_retried_and_succeeds(real_node, namespace):
    """restartPolicy ExitCode: 143 (SIGTERM) is retryable; the operator recreates the pod (the
    attempt is remembered on a PersistentVolume the new pod mounts again)."""
    cluster = real_node
    cluster.local_volume(namespace, "state")
    cmd = textwrap.dedent("""
        import pathlib, sys
        m = pathlib.Path('/state/attempted')
        if not m.exists():
            m.write_text('1')
            print('first attempt: exiting 143', flush=True)
            sys.exit(143)
        print('second attempt: ok', flush=True)
    """)
    volume = {"persistentVolumeClaim": {"claimName": "state"}}
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml("retry", namespace, cmd, restart="ExitCode", volume=volume),
    )
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "retry", "Succeeded"), 120)
    pod = cluster.get_json("pod", "retry-master-0", "-n", namespace)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0
    logs = cluster.kubectl("logs", "retry-master-0", "-n", namespace).stdout
    assert "second attempt: ok" in logs
    # The first pod is gone (re-created under the same name); its run is in the node's logs.
    runs = cluster.pod_log_lines(namespace, "retry-master-0")
    assert runs == ["first attempt: exiting 143", "second attempt: ok"], runs


def test_exit_code_1_fails_the_job(real_node, namespace):
    """restartPolicy ExitCode: exit 1 is permanent; the job fails and the code is on the pod."""
    cluster = real_node
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml(
            "broken", namespace, "import sys; print('boom'); sys.exit(1)", restart="ExitCode"
        ),
    )
    _wait("job Failed", lambda: _job_condition(cluster, namespace, "broken", "Failed"), 120)
    pod = cluster.get_json("pod", "broken-master-0", "-n", namespace)
    assert pod["status"]["phase"] == "Failed"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (1, "Error")


def test_sigkill_reports_137(real_node, namespace):
    """A container whose process is killed with SIGKILL reports exitCode 137 (128 + 9)."""
    cluster = real_node
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
        return cluster.pod_pid(namespace, pods[0]) if pods else None

    os.kill(_wait("pod Running", pid), 9)
    _wait(
        "pod Failed",
        lambda: (
            cluster.get_json("pod", "killed-master-0", "-n", namespace)["status"].get("phase")
            == "Failed"
        ),
    )
    pod = cluster.get_json("pod", "killed-master-0", "-n", namespace)
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_pod_security_admission_is_enforced(real_node, namespace):
    """PodSecurity admission rejects a privileged pod in a 'baseline' namespace."""
    cluster = real_node
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


def test_get_json_reads_what_kubectl_get_prints(cluster, namespace):
    """``Cluster.get_json`` (the API client, for the forms tests poll with) answers as
    ``kubectl get -o json`` does: an object, a list by label, nothing for what does not exist."""
    from localkube.procs import LocalkubeError

    for name in ("a", "b"):
        config_map = {"metadata": {"name": name, "labels": {"get-json": name}}, "data": {"k": name}}
        cluster.core_api().create_namespaced_config_map(namespace, config_map)

    def kubectl(*args: str):
        return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)

    for args in (
        ("configmap", "a", "-n", namespace),
        ("configmaps", "-n", namespace, "-l", "get-json=b"),
        ("configmaps", "-n", namespace, "--field-selector", "metadata.name=a"),
        ("sa", "default", "-n", namespace),
    ):
        assert cluster.get_json(*args) == kubectl(*args), args
    labelled = cluster.get_json("cm", "-n", namespace, "-l", "get-json")["items"]
    assert [(c["kind"], c["metadata"]["name"]) for c in labelled] == [
        ("ConfigMap", "a"), ("ConfigMap", "b"),
    ]  # fmt: skip
    nodes = cluster.get_json("nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(
        n["metadata"]["name"] for n in kubectl("nodes")["items"]
    ) and {(n["apiVersion"], n["kind"]) for n in nodes} == {("v1", "Node")}
    assert cluster.get_json("pod", "none", "-n", namespace, missing_ok=True) is None
    with pytest.raises(LocalkubeError, match="NotFound"):
        cluster.get_json("pod", "none", "-n", namespace)


def test_operator_webhook_validates(real_node, namespace):
    """The operator's validating webhook rejects a PyTorchJob without a 'pytorch' container."""
    cluster = real_node
    bad = _job_yaml("badname", namespace, "print(1)").replace("name: pytorch", "name: other")
    proc = cluster.kubectl("apply", "-f", "-", input_text=bad, check=False)
    assert proc.returncode != 0
    assert "pytorch" in proc.stderr


def test_on_failure_restarts_in_place_with_restart_count(real_node, namespace):
    """restartPolicy OnFailure: the kubelet restarts the container in place (restartCount 1; the
    pod's emptyDir outlives the run), and `kubectl logs --previous` shows the failed run.

    Read while the second run is alive: once the pod is done, the kubelet removes the dead
    container, and its lastState and previous log go with it."""
    cluster = real_node
    cmd = textwrap.dedent("""
        import pathlib, sys, time
        m = pathlib.Path('/state/ran')
        if not m.exists():
            m.write_text('1')
            print('run 1 fails', flush=True)
            sys.exit(3)
        print('run 2 waits', flush=True)
        while not pathlib.Path('/state/go').exists():
            time.sleep(0.2)
        print('run 2 ok', flush=True)
    """)
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input_text=_job_yaml(
            "inplace", namespace, cmd, restart="OnFailure", volume={"emptyDir": {}}
        ),
    )

    def second_run() -> dict | None:
        pods = _pods(cluster, namespace, "inplace")
        status = ((pods[0].get("status", {}).get("containerStatuses") if pods else None) or [{}])[0]
        return status if status.get("restartCount") and "running" in status["state"] else None

    status = _wait("the second run", second_run, 120)
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3
    previous = cluster.kubectl("logs", "inplace-master-0", "-n", namespace, "-p").stdout
    assert "run 1 fails" in previous and "run 2" not in previous
    cluster.kubectl(
        "exec", "inplace-master-0", "-n", namespace, "--",
        "python", "-c", "open('/state/go', 'w')",
    )  # fmt: skip
    _wait("job Succeeded", lambda: _job_condition(cluster, namespace, "inplace", "Succeeded"), 120)
    pod = cluster.get_json("pod", "inplace-master-0", "-n", namespace)
    status = pod["status"]["containerStatuses"][0]
    assert (status["restartCount"], status["state"]["terminated"]["exitCode"]) == (1, 0)
    assert "run 2 ok" in cluster.kubectl("logs", "inplace-master-0", "-n", namespace).stdout


def test_logs_follow_streams_and_ends_when_the_container_exits(real_node, namespace):
    """`kubectl logs -f` streams lines as they come and returns once the process exits."""
    cluster = real_node
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
