"""The local cluster's real node: kubelet + containerd + CNI bridge + CoreDNS on this machine.

Pods here are real containers from imported images (the busybox init image: small and fast),
under the `restricted` Pod Security profile, on the one real node, where every pod lands (the
kwok nodes' taint keeps pods that do not ask for GPUs off them). One test stops the node
(kill -9 of the kubelet and containerd, then `python -m localkube down`) and checks what the
machine looks like afterwards; it brings the cluster back for whatever runs next.

The trainer image training across two pods of a rendered PyTorchJob here, MASTER_ADDR its
master's name resolved by CoreDNS: tests/e2e/test_real_node.py (helm install in a restricted
namespace) and the e2e tests after it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from localkube.addons import s3
from localkube.controlplane import bootstrap
from localkube.handle import temporary_namespace, wait_until
from localkube.node import host, images, kubelet
from localkube.procs import proc_start_time

pytestmark = pytest.mark.cluster

RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.fixture
def ns(real_node):
    """A fresh namespace enforcing the `restricted` Pod Security profile."""
    with temporary_namespace(real_node, "node", level="restricted") as name:
        yield name


def pod_spec(name: str, ns: str, script: str, **extra) -> dict:
    """A restricted pod on the real node running ``sh -c script`` in the init (busybox) image.

    ``extra`` keys go into the container (``resources``, ``env``, ``volumeMounts``, ``ports``)
    or, for ``volumes``, ``terminationGracePeriodSeconds`` and ``restartPolicy``, the pod."""
    pod_keys = ("volumes", "terminationGracePeriodSeconds", "restartPolicy")
    container = {
        "name": "main",
        "image": images.images()["init"],
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "securityContext": RESTRICTED_CONTAINER,
        **{k: v for k, v in extra.items() if k not in pod_keys},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
            "automountServiceAccountToken": False,
            "containers": [container],
            **{k: v for k, v in extra.items() if k in pod_keys},
        },
    }


def create(cluster, obj: dict) -> None:
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(obj))


def pod(cluster, ns: str, name: str) -> dict:
    return cluster.get_json("pod", name, "-n", ns)


def wait_phase(cluster, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60) -> dict:
    def probe():
        p = pod(cluster, ns, name)
        return p if p["status"].get("phase") in phases else None

    return wait_until(f"pod {name} in {phases}", probe, timeout, 0.2)


def wait_running(cluster, ns: str, name: str) -> dict:
    return wait_phase(cluster, ns, name, ("Running",))


def logs(cluster, ns: str, name: str) -> str:
    return cluster.kubectl("logs", name, "-n", ns).stdout


def wait_log(cluster, ns: str, name: str, needle: str) -> str:
    """The pod's log once it contains ``needle``."""

    def probe():
        text = logs(cluster, ns, name)
        return text if needle in text else None

    return wait_until(f"{needle!r} in the log of {name}", probe, 30, 0.2)


def terminated(p: dict) -> dict:
    return p["status"]["containerStatuses"][0]["state"]["terminated"]


# ------------------------------------------------------------------------------------ the node


def test_real_node_is_ready_beside_the_kwok_nodes(real_node):
    """One kubelet node (containerd, node IP = bridge gateway, no taint: every pod runs here) and
    the kwok nodes (GPU capacity, tainted as managed clusters taint GPU nodes)."""
    nodes = {n["metadata"]["name"]: n for n in real_node.get_json("nodes")["items"]}
    assert {kubelet.NODE_NAME, "kwok-node-0", "kwok-node-1"} <= set(nodes)
    for name in (kubelet.NODE_NAME, "kwok-node-0", "kwok-node-1"):
        ready = [c for c in nodes[name]["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", name
    real = nodes[kubelet.NODE_NAME]
    info = real["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.33.13"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6")
    addresses = {a["type"]: a["address"] for a in real["status"]["addresses"]}
    assert addresses["InternalIP"] == host.GATEWAY
    # The gateway's MAC is set, not the lowest of the pods' veths (test_bridge_mac.py says why).
    link = Path("/sys/class/net", host.BRIDGE)
    assert (link / "address").read_text().strip() == host.BRIDGE_MAC
    assert (link / "addr_assign_type").read_text().strip() == "3"  # NET_ADDR_SET
    assert not real["spec"].get("taints"), real["spec"]
    assert "nvidia.com/gpu" not in real["status"]["capacity"]
    for name in ("kwok-node-0", "kwok-node-1"):
        assert nodes[name]["spec"]["taints"] == [bootstrap.KWOK_TAINT]
        assert nodes[name]["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_restricted_pod_runs_in_a_container_with_logs_and_exec(real_node, ns):
    """uid 1000, no capabilities, seccomp filter, its own pid namespace; logs and exec go
    through the API server to the kubelet."""
    script = (
        "id; grep -E '^(CapEff|Seccomp|NoNewPrivs):' /proc/self/status; "
        "echo pid1=$(cat /proc/1/comm); echo ready; exec sleep 3600"
    )
    t0 = time.monotonic()
    create(real_node, pod_spec("who", ns, script))
    p = wait_running(real_node, ns, "who")
    print(f"pod create -> Running: {time.monotonic() - t0:.2f}s", file=sys.stderr)
    assert p["spec"]["nodeName"] == kubelet.NODE_NAME
    assert p["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert p["status"]["podIP"].startswith("10.244.0.")
    out = wait_log(real_node, ns, "who", "ready")
    assert re.search(r"^uid=1000\b.*gid=1000\b", out, re.M), out
    assert re.search(r"^CapEff:\s+0+$", out, re.M), out
    assert re.search(r"^Seccomp:\s+2$", out, re.M), out  # 2 = filter (RuntimeDefault)
    assert re.search(r"^NoNewPrivs:\s+1$", out, re.M), out
    assert "pid1=sh" in out  # PID 1 is the container's own command, not the host's init

    exec_out = real_node.kubectl("exec", "who", "-n", ns, "--", "id", "-u").stdout
    assert exec_out.strip() == "1000"
    echoed = real_node.kubectl("exec", "-i", "who", "-n", ns, "--", "cat", input_text="via stdin\n")
    assert echoed.stdout == "via stdin\n"


def _http_server(name: str, ns: str, body: str) -> dict:
    """busybox httpd serving ``body`` on port 8080 from an emptyDir."""
    script = (
        f"echo {body} > /www/index.html && echo serving && exec busybox httpd -f -p 8080 -h /www"
    )
    return pod_spec(
        name,
        ns,
        script,
        ports=[{"containerPort": 8080, "name": "http"}],
        volumeMounts=[{"name": "www", "mountPath": "/www"}],
        volumes=[{"name": "www", "emptyDir": {}}],
    )


def test_port_forward_reaches_a_port_in_the_pod(real_node, ns):
    create(real_node, _http_server("web", ns, "hello-from-pod"))
    wait_running(real_node, ns, "web")
    wait_log(real_node, ns, "web", "serving")
    proc = subprocess.Popen(
        [str(real_node.kubectl_path), "port-forward", "-n", ns, "pod/web", ":8080"],
        env=real_node.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # Forwarding from 127.0.0.1:PORT -> 8080
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        with urllib.request.urlopen(f"http://127.0.0.1:{match[1]}/", timeout=10) as resp:
            assert resp.read().decode().strip() == "hello-from-pod"
    finally:
        proc.terminate()
        proc.wait(10)


def test_pod_to_pod_tcp_and_headless_service_dns(real_node, ns):
    """A client pod fetches from a server pod by IP, and resolves a headless Service's name
    (short and fully qualified) to the server's pod IP through CoreDNS."""
    create(real_node, _http_server("server", ns, "over-the-bridge"))
    server_ip = wait_running(real_node, ns, "server")["status"]["podIP"]
    wait_log(real_node, ns, "server", "serving")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "backend", "namespace": ns},
        "spec": {"clusterIP": "None", "selector": {"app": "server"}, "ports": [{"port": 8080}]},
    }
    create(real_node, service)
    fqdn = f"backend.{ns}.svc.cluster.local"
    script = (
        f"busybox wget -qO- http://{server_ip}:8080/; "
        "for i in $(seq 30); do nslookup backend >/dev/null && break; sleep 1; done; "
        f"nslookup backend; nslookup {fqdn}; cat /etc/resolv.conf"
    )
    create(real_node, pod_spec("client", ns, script))
    p = wait_phase(real_node, ns, "client", ("Succeeded", "Failed"), 90)
    out = logs(real_node, ns, "client")
    assert p["status"]["phase"] == "Succeeded", out
    assert "over-the-bridge" in out
    assert f"nameserver {host.GATEWAY}" in out
    answers = re.findall(r"Name:\s+(\S+)\s+Address:\s+(\S+)", out)
    assert (fqdn, server_ip) in answers, out
    assert answers.count((fqdn, server_ip)) == 2, out  # short name (search path) and FQDN


def test_pytorchjob_master_name_resolves_through_the_operators_service(real_node, ns):
    """A Master + 1 Worker PyTorchJob on the real node: the operator's init container (the
    local init image) waits for `<job>-master-0`, the worker resolves it to the master pod's
    IP through the operator's headless Service, both exit 0 and the job Succeeds."""
    job = f"dns{uuid.uuid4().hex[:4]}"

    def replica(script: str) -> dict:
        spec = pod_spec("unused", ns, script)["spec"]
        container = spec["containers"][0]
        container["name"] = "pytorch"
        container["imagePullPolicy"] = "IfNotPresent"
        del spec["restartPolicy"]
        return {"replicas": 1, "restartPolicy": "Never", "template": {"spec": spec}}

    lookup = (
        "for i in $(seq 150); do nslookup {0} && ok=1 && break; sleep 1; done; "
        '[ -n "$ok" ] || exit 1; '
    )
    worker = f"{job}-worker-0"
    # A finished pod leaves its Service's endpoints, so neither may end while the other still
    # needs its name. The worker, once it has resolved the master, waits for the master to
    # connect to it by name; the master ends after that connection (a fixed linger races: the
    # master's early misses for the worker's name can outlast the worker).
    connect = (
        f"for i in $(seq 150); do echo hi | busybox nc -w 2 {worker} 12345 && ok=1 && break; "
        'sleep 1; done; [ -n "$ok" ] || exit 1'
    )
    listen = "busybox timeout 200 busybox nc -l -p 12345 >/dev/null"
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": job, "namespace": ns},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": replica(lookup.format(worker) + connect),
                "Worker": replica(lookup.format("$MASTER_ADDR") + listen),
            }
        },
    }
    create(real_node, manifest)

    def condition(kind: str) -> bool:
        status = real_node.get_json("pytorchjob", job, "-n", ns).get("status", {})
        return any(
            c["type"] == kind and c["status"] == "True" for c in status.get("conditions", [])
        )

    wait_until("job Succeeded", lambda: condition("Succeeded") or condition("Failed"), 240)
    assert condition("Succeeded"), {
        name: logs(real_node, ns, name)[-2000:] for name in (f"{job}-master-0", worker)
    }
    master = pod(real_node, ns, f"{job}-master-0")
    worker_pod = wait_phase(real_node, ns, worker, ("Succeeded", "Failed"))
    assert worker_pod["status"]["phase"] == "Succeeded"
    init = worker_pod["spec"]["initContainers"][0]
    assert (init["name"], init["image"]) == ("init-pytorch", images.images()["init"])
    assert worker_pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    out = logs(real_node, ns, worker)
    assert re.search(
        rf"Name:\s+{job}-master-0\.{ns}\.svc\.cluster\.local\s+Address:\s+"
        rf"{re.escape(master['status']['podIP'])}\b",
        out,
    ), out


# ------------------------------------------------------------------------------------ limits


def test_memory_limit_too_small_is_oomkilled(real_node, ns):
    """A 96 MiB buffer under a 32 MiB limit: the kernel kills it, the container ends 137.
    (cgroup v1 kills the largest process, so the hog is PID 1 here: a shell whose child is
    killed goes on and reports its own exit code, with reason OOMKilled all the same.)"""
    script = "echo start; exec dd if=/dev/zero of=/dev/null bs=96M count=1"
    limits = {"limits": {"memory": "32Mi"}, "requests": {"memory": "32Mi"}}
    create(real_node, pod_spec("hog", ns, script, resources=limits))
    p = wait_phase(real_node, ns, "hog", ("Succeeded", "Failed"))
    state = terminated(p)
    assert (state["exitCode"], state["reason"]) == (137, "OOMKilled"), state
    assert logs(real_node, ns, "hog").strip() == "start"


def test_delete_sends_term_to_pid_1_within_the_grace_period(real_node, ns):
    """`kubectl delete pod` of a TERM-trapping container: exit 143 long before the 30 s grace
    period ends (a SIGKILL at its end would be 137)."""
    script = "trap 'echo got TERM; exit 143' TERM; echo ready; while true; do sleep 0.2; done"
    create(real_node, pod_spec("trap", ns, script, terminationGracePeriodSeconds=30))
    wait_running(real_node, ns, "trap")
    wait_log(real_node, ns, "trap", "ready")
    from kubernetes import watch

    api = real_node.core_api()
    w = watch.Watch()
    t0 = time.monotonic()
    real_node.kubectl("delete", "pod", "trap", "-n", ns, "--wait=false")
    final = None
    for event in w.stream(
        api.list_namespaced_pod, ns, field_selector="metadata.name=trap", timeout_seconds=60
    ):
        statuses = event["object"].status.container_statuses or []
        if statuses and statuses[0].state.terminated:
            final = statuses[0].state.terminated
            break
    w.stop()
    elapsed = time.monotonic() - t0
    assert final is not None
    assert final.exit_code == 143, final
    assert elapsed < 15, elapsed


def test_memory_emptydir_at_dev_shm_has_its_size_limit(real_node, ns):
    script = "df -k /dev/shm | tail -1; grep ' /dev/shm ' /proc/mounts"
    create(
        real_node,
        pod_spec(
            "shm",
            ns,
            script,
            volumeMounts=[{"name": "shm", "mountPath": "/dev/shm"}],
            volumes=[{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "96Mi"}}],
        ),
    )
    p = wait_phase(real_node, ns, "shm", ("Succeeded", "Failed"))
    out = logs(real_node, ns, "shm")
    assert p["status"]["phase"] == "Succeeded", out
    size_kib = int(out.splitlines()[0].split()[1])
    assert size_kib == 96 * 1024, out
    assert " tmpfs " in out


def test_secret_reference_reaches_the_container_env(real_node, ns):
    token = uuid.uuid4().hex
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds", "namespace": ns},
        "stringData": {"token": token},
    }
    create(real_node, secret)
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}]
    create(real_node, pod_spec("env", ns, "echo token=$TOKEN", env=env))
    p = wait_phase(real_node, ns, "env", ("Succeeded", "Failed"))
    assert p["status"]["phase"] == "Succeeded"
    assert logs(real_node, ns, "env").strip() == f"token={token}"


def test_a_pod_reaches_the_api_server_where_the_kubelet_says_it_is(real_node, ns):
    """In-cluster configuration, as on any cluster: ``KUBERNETES_SERVICE_HOST``/``PORT`` (the
    ``kubernetes`` Service's address, mapped by the node's one DNAT rule, as kube-proxy would),
    the certificate checked against the mounted CA, the pod's own token: the API server knows
    the pod's service account (a 403 for what it may not do, not a 401)."""
    script = textwrap.dedent("""
        import json, os, ssl, urllib.error, urllib.request
        sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        url = f"https://{host}:{port}/api/v1/namespaces/{open(sa + 'namespace').read()}/pods"
        token = open(sa + "token").read()
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        context = ssl.create_default_context(cafile=sa + "ca.crt")
        try:
            urllib.request.urlopen(request, context=context)
        except urllib.error.HTTPError as e:
            print(e.code, json.loads(e.read())["message"])
    """)
    spec = pod_spec("api", ns, "", command=["python", "-c", script])
    spec["spec"]["containers"][0]["image"] = real_node.trainer_image()
    spec["spec"]["automountServiceAccountToken"] = True
    create(real_node, spec)
    p = wait_phase(real_node, ns, "api", ("Succeeded", "Failed"), timeout=120)
    out = logs(real_node, ns, "api").strip()
    assert p["status"]["phase"] == "Succeeded", out
    assert out == (
        f'403 pods is forbidden: User "system:serviceaccount:{ns}:default" cannot list resource '
        f'"pods" in API group "" in the namespace "{ns}"'
    )
    env = {e["name"] for e in p["spec"]["containers"][0].get("env") or []}
    assert "KUBERNETES_SERVICE_HOST" not in env  # the kubelet's, not the pod's own


def _netns_mounts() -> list[tuple[str, int, int]]:
    """(mount point, mount id, parent id) of /run/netns and what is mounted in it."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_id, parent, _, _, point = line.split()[:5]
        if point == host.NETNS_DIR or point.startswith(f"{host.NETNS_DIR}/"):
            found.append((point, int(mount_id), int(parent)))
    return found


def test_a_podman_container_beside_the_node_leaves_every_pod_removable(real_node, ns):
    """podman binds /run/netns onto itself when it is not a mount point yet, over the pods'
    network namespaces mounted before: containerd could then never remove one, and its pod
    would stay Terminating. The node shares the folder before its first pod, so a container
    podman starts now (with a network, as `controller run --local` does) hides nothing."""
    from tools.podman import podman_env

    create(real_node, pod_spec("before", ns, "sleep 3600", terminationGracePeriodSeconds=0))
    wait_running(real_node, ns, "before")
    ran = subprocess.run(
        ["podman", "run", "--rm", "--network", "bridge", images.images()["init"], "true"],
        env=podman_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    mounts = _netns_mounts()
    top = [m for m in mounts if m[0] == host.NETNS_DIR]
    assert len(top) == 1, mounts  # one bind of the folder, the node's
    pods = [m for m in mounts if m[0].startswith(f"{host.NETNS_DIR}/cni-")]
    assert pods and all(parent == top[0][1] for _, _, parent in pods), mounts
    real_node.kubectl("delete", "pod", "before", "-n", ns, "--wait=false")

    def gone() -> bool:
        listed = real_node.get_json("pods", "-n", ns, "--field-selector", "metadata.name=before")
        return not listed["items"]

    wait_until("the pod to be removed", gone, 60, 0.5)


# ------------------------------------------------------------------------------------ teardown


def _restart(cluster, owner: str) -> None:
    """Bring the cluster back (same owner) for the tests after these."""
    cluster.control_plane.up(owner=owner, lease=True)
    wait_until("node Ready", lambda: kubelet.node_ready(cluster), 60)


def _container_pids(cluster, ns: str, name: str) -> list[int]:
    """Host pids in the pod's container cgroup (memory hierarchy)."""
    p = pod(cluster, ns, name)
    uid = p["metadata"]["uid"]
    cid = p["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    base = "/sys/fs/cgroup/memory/kubepods"
    found = []
    for root, _dirs, files in os.walk(base):
        if root.endswith(cid) and f"pod{uid}" in root and "cgroup.procs" in files:
            with open(os.path.join(root, "cgroup.procs")) as f:
                found += [int(x) for x in f.read().split()]
    return found


@pytest.mark.disruptive
def test_a_killed_node_is_cleaned_up_and_down_restores_the_machine(real_node, ns):
    """kill -9 of the kubelet and containerd leaves a pod running (its shim survives);
    `python -m localkube down` then removes it through a temporary containerd and leaves no
    bridge, veth, KUBE-*/CNI chains, /kubepods cgroups, pod mounts or log entries; the sysctls
    the kubelet changed are back to what they were before the node first started; the S3 server
    and its data gone. (An `up` after such a crash stops what the state recorded the same way,
    ``ControlPlane._stop``, before it starts afresh; a graceful stop of a live node differs
    only in that the kubelet and containerd get a SIGTERM first.)"""
    rec = host.read_record()
    assert rec is not None, "no record of the machine before the node"
    state = real_node.control_plane.read_state()
    owner, s3_proc = state["owner"], state["processes"]["s3"]
    s3_data = s3.data_dir(real_node.control_plane.state_dir)
    assert (s3_data / "root" / s3.BUCKET).is_dir()
    before = rec["before"]
    create(
        real_node,
        pod_spec(
            "lingering",
            ns,
            "exec sleep 3600",
            volumeMounts=[{"name": "shm", "mountPath": "/dev/shm"}],
            volumes=[{"name": "shm", "emptyDir": {"medium": "Memory"}}],
        ),
    )
    wait_running(real_node, ns, "lingering")
    pids = wait_until("container pids", lambda: _container_pids(real_node, ns, "lingering"))
    shims = {p: proc_start_time(p) for p in host.node_processes()["containerd-shim"]}
    assert shims
    during = host.snapshot()
    # What the node changed is visible now (so the checks below can fail).
    assert host.BRIDGE in during["links"]
    assert during["kubepods"]
    assert "KUBE-FIREWALL" in during["chains"]["iptables"]["filter"]
    assert any(m.startswith(str(host.KUBELET_ROOT)) for m in during["mounts"])
    assert during["sysctls"]["vm.overcommit_memory"] == "1"
    for name in ("kubelet", "containerd"):
        os.kill(state["processes"][name]["pid"], signal.SIGKILL)
    time.sleep(0.5)
    assert all(proc_start_time(p) for p in pids)  # the pod outlived its node

    down = subprocess.run(
        [sys.executable, "-m", "localkube", "down"],
        cwd=real_node.control_plane.repo,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    try:
        assert down.returncode == 0, down.stderr
        assert not [p for p in pids if proc_start_time(p)], "the orphaned container still runs"
        assert not [p for p, start in shims.items() if proc_start_time(p) == start], "old shims"
        after = host.snapshot()
        assert after["sysctls"] == before["sysctls"]
        new_links = set(after["links"]) - set(before["links"])
        assert not new_links - _links_of_other_bridges(), new_links
        for cmd in host.IPTABLES:
            for table in host.TABLES:
                new = set(after["chains"][cmd][table]) - set(before["chains"][cmd][table])
                # (podman's NETAVARK chains come and go with the image builds beside us)
                assert not {c for c in new if c.startswith(("KUBE-", "CNI-"))}, (cmd, table, new)
        assert after["kubepods"] == []
        ours = (
            str(host.KUBELET_ROOT),
            str(host.RUN_DIR),
            str(host.CONTAINERD_ROOT),
            "/run/netns/cni-",
        )
        assert not [m for m in after["mounts"] if m.startswith(ours)]
        assert set(after["mounts"]) - set(before["mounts"]) <= {
            m for m in after["mounts"] if m.startswith(("/var/lib/containers", "/run/netns/netns-"))
        }
        # /run/netns and /var/lib/cni are podman's too (its CNI networks' IP leases, made by the
        # container tests running beside this one): there, only our namespaces and our network's
        # leases and results are ours.
        podmans = ("/run/netns", "/var/lib/cni")
        paths = {p: e for p, e in after["paths"].items() if p not in podmans}
        assert paths == {p: e for p, e in before["paths"].items() if p not in podmans}
        cni = Path("/var/lib/cni")
        left = [str(p) for p in cni.rglob(f"{host.CNI_NETWORK}*")] if cni.is_dir() else []
        assert not left, left
        assert not [n for n in after["entries"]["/run/netns"] if n.startswith("cni-")]
        assert after["entries"]["/var/log/pods"] == before["entries"]["/var/log/pods"]
        assert after["entries"]["/var/log/containers"] == before["entries"]["/var/log/containers"]
        assert not host.RUN_DIR.exists()
        # The same, asked of the tools directly.
        assert subprocess.run(["ip", "link", "show", host.BRIDGE], capture_output=True).returncode
        saved = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
        assert "KUBE-" not in saved and f'\\"{host.CNI_NETWORK}\\"' not in saved
        assert not any(p for p in _ps_node_processes())
        assert proc_start_time(s3_proc["pid"]) != s3_proc["start"]
        assert not s3_data.exists()
        s3.preflight(real_node.control_plane.repo)  # its port is free again
    finally:
        _restart(real_node, owner)


def _links_of_other_bridges() -> set[str]:
    """Links that belong to bridges other than ours (podman's, from image builds meanwhile)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        master = re.search(r" master (\S+)", line)
        if (master and master[1] != host.BRIDGE) or name.startswith("podman"):
            found.add(name)
    return found


def _ps_node_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    marks = (
        str(host.CONTAINERD_SOCKET),
        f"--root-dir={host.KUBELET_ROOT}",
        str(host.COREDNS_CONFIG),
    )
    return [line for line in out.splitlines() if any(m in line for m in marks)]


def test_the_trainer_image_named_by_many_callers_at_once_is_named_once(real_node):
    """make test's cluster workers each name the node's trainer image as the examples do, at
    once; ``ctr images tag --force`` deletes and creates the name, so a caller whose create
    comes second meets "already exists": ``tag`` takes the name as done when it already points
    at the image."""
    import threading

    from localkube.node import image_import

    ref = real_node.trainer_image()
    name = f"localhost/ddpjob-tag-race:{uuid.uuid4().hex[:8]}"
    address = str(host.CONTAINERD_SOCKET)
    ctr = image_import._Ctr(address, "k8s.io")
    errors: list[BaseException] = []

    def name_it() -> None:
        try:
            image_import.tag(address, ref, name)
        except Exception as e:  # every failure is the test's finding
            errors.append(e)

    threads = [threading.Thread(target=name_it) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        held = ctr.images()
        assert held[name] == held[ref]
    finally:
        ctr.ok("images", "rm", name)
