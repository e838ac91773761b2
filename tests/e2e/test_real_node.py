"""PyTorchJobs of this checkout's trainer image on the local cluster's real node (kubelet +
containerd + CoreDNS), driven as a user would: `helm install` and the CLI, then kubectl.

What each test holds, and what would make it fail:

- helm install of the built image in a ``restricted`` namespace: NOTES.txt prints the commands
  that follow the job; the real operator creates both pods and PodSecurity admits them (the
  worker's init container is the restricted template the local operator runs with); they are
  containers of the image running as uid 1000 (asked from inside), labelled by helm,
  ``MASTER_ADDR`` is the master's DNS name and resolves to its pod IP, WORLD_SIZE and
  PET_NNODES are 2, the init container ran, the job Succeeds.
- ``submit examples/quickstart.yaml --wait --follow`` with the built image, then ``kubectl logs``,
  ``exec`` and ``describe`` on its worker pod.
- A memory limit too small: ``submit --wait`` and ``status`` say OOMKilled and what it means.
- ``shm_size`` is the size of the container's /dev/shm; ``nproc_per_node: 2`` runs torchrun
  inside the container.
- A ``secret_env`` entry of a real Secret reaches the trainer's environment through the kubelet,
  and its value is in nothing ddpjob prints.

Recovery on the node (a deleted pod, kill -9 in a container, checkpoints on a PersistentVolume
written by uid 1000) is in test_recovery.py.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
import yaml

from localkube.builds import images
from localkube.handle import temporary_namespace, wait_until
from localkube.node import kubelet
from tests.e2e.helpers import (
    QUICKSTART,
    Background,
    ddpjob,
    events,
    paced,
    where_things_stand,
    write_spec,
)
from tools import podman
from trainer.contract import parse_event, split_rank

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def rns(real_node):
    """A fresh namespace enforcing the `restricted` Pod Security profile."""
    with temporary_namespace(real_node, "real", level="restricted") as name:
        yield name


def checkpoints_in_tmp(spec: Path) -> Path:
    """The spec with its checkpoints in the pod's own /tmp (no volume needed)."""
    data = yaml.safe_load(spec.read_text())
    data["trainer"]["checkpoint"]["dir"] = "/tmp/ckpt"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def pod(cluster, namespace: str, name: str) -> dict:
    return cluster.get_json("pod", name, "-n", namespace)


def exec_in(cluster, namespace: str, pod_name: str, script: str) -> str:
    """``kubectl exec POD -c pytorch -- sh -c SCRIPT`` (through the API server to the kubelet),
    once the container runs; its stdout."""

    def running() -> bool:
        got = cluster.get_json("pod", pod_name, "-n", namespace, missing_ok=True)
        if got is None:
            return False
        statuses = got.get("status", {}).get("containerStatuses") or []
        return any(s["name"] == "pytorch" and s.get("state", {}).get("running") for s in statuses)

    wait_until(f"{pod_name} running", running, 240, 0.3)
    out = cluster.kubectl(
        "exec", pod_name, "-n", namespace, "-c", "pytorch", "--", "sh", "-c", script
    )
    return out.stdout


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process of this machine."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    return parent


def _children(pid: int) -> list[int]:
    return [c for c, p in _parents().items() if p == pid]


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` on this machine (a container's, from outside it)."""
    parent = _parents()
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        children = [c for c, p in parent.items() if p == current]
        out += children
        todo += children
    return out


def init_container_ran(p: dict) -> bool:
    (init,) = p["status"]["initContainerStatuses"]
    term = init.get("state", {}).get("terminated") or {}
    return init["name"] == "init-pytorch" and term.get("exitCode") == 0


def test_helm_install_of_the_built_image_in_a_restricted_namespace(real_node, rns, tmp_path):
    # Paced (0.05 s a step): still running while the exec below resolves names and imports torch.
    spec = write_spec(
        real_node, tmp_path, "helmjob", rns, max_steps=300, clean_pod_policy="None",
        **paced(real_node, rns, 0.05),
    )  # fmt: skip
    values = ddpjob(real_node, "render", str(spec), "--values")
    assert values.returncode == 0, values.stderr
    (tmp_path / "values.yaml").write_text(values.stdout)
    install = real_node.helm(
        "install", "helmjob", str(Path(__file__).resolve().parents[2] / "charts" / "ddpjob"),
        "-n", rns, "-f", str(tmp_path / "values.yaml"),
    )  # fmt: skip
    try:
        # NOTES.txt printed the exact commands to follow the job.
        notes = install.stdout
        assert f"kubectl -n {rns} get pods -l training.kubeflow.org/job-name=helmjob" in notes
        assert f"python -m controller logs helmjob -n {rns} -f" in notes
        inside = exec_in(
            real_node,
            rns,
            "helmjob-worker-0",
            'id -u; id -g; echo "$MASTER_ADDR"; '
            # The master's name resolves once its pod runs (its Service then has an address).
            'for i in $(seq 120); do getent hosts "$MASTER_ADDR" && break; sleep 1; done; '
            "python3 -c 'import torch; print(torch.__version__)'",
        ).split("\n")
        uid, gid, master_addr, resolved, torch_version = inside[:5]
        assert (uid, gid) == ("1000", "1000"), inside
        assert master_addr == "helmjob-master-0", inside  # the name, not a rewritten address
        master_ip = pod(real_node, rns, "helmjob-master-0")["status"]["podIP"]
        assert resolved.split()[0] == master_ip, (resolved, master_ip)
        assert torch_version.startswith("2."), inside
        w = ddpjob(real_node, "wait", "helmjob", "-n", rns, "--timeout", "400", timeout=420)
        assert w.returncode == 0, w.stdout + w.stderr
        assert f"job {rns}/helmjob Succeeded" in w.stdout
        worker = pod(real_node, rns, "helmjob-worker-0")
        master = pod(real_node, rns, "helmjob-master-0")
        built_id = podman.inspect(real_node.trainer_image())["Id"]
        for p in (worker, master):
            assert p["spec"]["nodeName"] == kubelet.NODE_NAME
            (status,) = p["status"]["containerStatuses"]
            # containerd reports the image by its first name (the node holds this checkout's
            # image under two, see node.images.import_trainer_image): the ID says which image ran.
            assert p["spec"]["containers"][0]["image"] == images.published_ref()
            assert status["imageID"].endswith(built_id), (status, built_id)
            assert p["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert init_container_ran(worker), worker["status"]
        # Both created by the real operator, in a namespace whose PodSecurity refuses upstream's
        # init container (k8s/operator/init-container-restricted.yaml is what admits the worker).
        created = real_node.get_json(
            "events", "-n", rns, "--field-selector",
            "involvedObject.name=helmjob,reason=SuccessfulCreatePod",
        )["items"]  # fmt: skip
        assert {e["message"] for e in created} == {
            "Created pod: helmjob-master-0", "Created pod: helmjob-worker-0",
        }  # fmt: skip
        assert master["metadata"]["labels"]["app.kubernetes.io/instance"] == "helmjob"
        assert master["spec"]["securityContext"]["runAsUser"] == 1000
        env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
        assert (env["WORLD_SIZE"], env["PET_NNODES"]) == ("2", "2"), env
        log = real_node.kubectl("logs", "helmjob-master-0", "-n", rns, "-c", "pytorch").stdout
        (start,) = events(log, "start")
        assert start["world_size"] == 2
        (done,) = events(log, "done")
        assert (done["reason"], done["step"]) == ("completed", 300)
    finally:
        real_node.helm("uninstall", "helmjob", "-n", rns, "--wait", check=False)


QUICK_STEPS = 400


def test_quickstart_submit_wait_follow_then_kubectl_logs_exec_describe(real_node, rns, tmp_path):
    image = real_node.trainer_image()
    sets = {
        "namespace": rns,
        "image": image,
        "resources": {"cpu": "250m", "memory": "1536Mi"},
        "clean_pod_policy": "None",
        # Enough steps that the exec below finds the worker still running: the node does not
        # throttle a pod to its CPU limit, so on an idle machine the quickstart is quick.
        "trainer.max_steps": QUICK_STEPS,
        "trainer.eval_every": 0,
        "trainer.checkpoint.dir": "/tmp/ckpt",
    }
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={json.dumps(v)}")]
    run = Background(
        real_node, tmp_path, "submit", "submit", str(QUICKSTART), "--wait", "--follow", *args
    )
    try:
        inside = exec_in(
            real_node, rns, "quickstart-worker-0", "id -u; cat /proc/1/cmdline | tr '\\0' ' '"
        )
        code, out, err = run.result(timeout=500)
    finally:
        run.stop()
    uid, cmdline = inside.split("\n")[:2]
    assert uid == "1000", inside
    assert cmdline.split()[:3] == ["python", "-m", "trainer"], cmdline  # the rendered command
    assert code == 0, out[-2000:] + err[-3000:]
    assert f"submitted pytorchjob {rns}/quickstart" in out
    assert [e["step"] for e in events(out, "train")][-1] == QUICK_STEPS
    assert f"job {rns}/quickstart Succeeded" in out

    logs = real_node.kubectl("logs", "quickstart-worker-0", "-n", rns, "-c", "pytorch")
    assert logs.returncode == 0, logs.stderr
    master_logs = real_node.kubectl("logs", "quickstart-master-0", "-n", rns).stdout
    assert events(master_logs, "done")[-1]["step"] == QUICK_STEPS
    # The rank-0 events `--follow` printed are the master container's, in order, once each.
    followed = [x for x in out.splitlines() if parse_event(x) is not None]
    assert followed and followed == [x for x in master_logs.splitlines() if parse_event(x)]
    describe = real_node.kubectl("describe", "pod", "quickstart-worker-0", "-n", rns).stdout
    assert re.search(rf"^Node:\s+{kubelet.NODE_NAME}/", describe, re.M), describe
    assert re.search(rf"^\s+Image:\s+{re.escape(image)}$", describe, re.M), describe
    assert "init-pytorch:" in describe and re.search(r"Reason:\s+Completed", describe)
    assert "Started container pytorch" in describe  # the kubelet's own events


def test_a_memory_limit_too_small_is_explained_as_oomkilled(real_node, rns, tmp_path):
    """128 MiB cannot hold the trainer (importing torch alone takes more): the kernel kills it.
    With no retries (restart_policy Never) `submit --wait` fails at once and says what happened
    and what to do."""
    spec = write_spec(
        real_node,
        tmp_path,
        "oom",
        rns,
        nodes=1,
        restart_policy="Never",
        resources={"cpu": "500m", "memory": "128Mi"},
        shm_size="64Mi",
        volumes=[],
    )
    checkpoints_in_tmp(spec)
    r = ddpjob(real_node, "submit", str(spec), "--wait", timeout=400)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "replica master-0 (pod oom-master-0" in r.stderr, r.stderr
    assert "OOMKilled" in r.stderr and "went over its memory limit (128Mi)" in r.stderr, r.stderr
    assert "raise resources.memory" in r.stderr
    assert "Traceback" not in r.stderr.split("last ")[0]
    st = json.loads(ddpjob(real_node, "status", "oom", "-n", rns, "-o", "json").stdout)
    (master,) = st["replicas"]
    assert master["reason"] == "OOMKilled", master
    assert "went over its memory limit (128Mi)" in master["meaning"], master
    text = ddpjob(real_node, "status", "oom", "-n", rns).stdout
    assert "OOMKilled" in text and "went over its memory limit" in text, text


def test_shm_size_is_dev_shm_and_nproc_per_node_2_runs_torchrun_in_the_container(
    real_node, rns, tmp_path
):
    spec = write_spec(
        real_node,
        tmp_path,
        "shm",
        rns,
        nodes=1,
        nproc_per_node=2,
        shm_size="192Mi",
        resources={"cpu": "1", "memory": "3Gi"},
        max_steps=300,
        clean_pod_policy="None",
        **paced(real_node, rns, 0.05),  # still running while the checks below look inside
    )
    r = ddpjob(real_node, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    size_kb = int(exec_in(real_node, rns, "shm-master-0", "df -k /dev/shm | tail -1").split()[1])
    assert size_kb == 192 * 1024, size_kb
    # From this machine: the processes of the container, under its PID 1 (the trainer, which
    # re-launches itself under torchrun for 2 processes per node).
    pid1 = real_node.pod_pid(rns, pod(real_node, rns, "shm-master-0"))
    assert pid1, "no host pid for shm-master-0"

    def torchrun_and_two_workers() -> list[str] | None:
        tree = {pid: _cmdline(pid) for pid in [pid1, *_descendants(pid1)]}
        runs = [p for p, c in tree.items() if "torch.distributed.run" in c or "torchrun" in c]
        workers = [c for p in runs for c in map(_cmdline, _children(p)) if "trainer" in c]
        return workers if len(runs) == 1 and len(workers) == 2 else None

    wait_until("torchrun and two trainer workers", torchrun_and_two_workers, 60, 0.5)
    w = ddpjob(real_node, "wait", "shm", "-n", rns, "--timeout", "400", timeout=420)
    assert w.returncode == 0, w.stdout + w.stderr
    log = real_node.kubectl("logs", "shm-master-0", "-n", rns, "-c", "pytorch").stdout
    (start,) = events(log, "start")
    assert start["world_size"] == 2  # one node, two processes
    # The two processes share the container's streams: each line reaches the log whole, after
    # the rank of the process that printed it.
    lines = log.splitlines()
    assert all(split_rank(x)[0] == 0 for x in lines if parse_event(x)), log[-3000:]
    assert any(x.startswith("[rank 1] joined: rank 1 of 2 (local rank 1)") for x in lines), log
    glued = [x for x in lines if re.search(r".\[rank \d+\] ", x)]
    assert glued == [], glued[:3]


def test_a_secret_env_reaches_the_trainer_and_is_printed_nowhere(real_node, rns, tmp_path):
    value = f"s3cr3t-{uuid.uuid4().hex}"
    real_node.kubectl(
        "create", "secret", "generic", "api", "-n", rns, f"--from-literal=token={value}"
    )
    spec = write_spec(
        real_node,
        tmp_path,
        "sec",
        rns,
        nodes=1,
        max_steps=400,  # still running for the exec below (no claim here to pace it from)
        volumes=[],
        secret_env={"API_TOKEN": {"secret": "api", "key": "token"}},
        clean_pod_policy="None",
    )
    checkpoints_in_tmp(spec)
    printed = [ddpjob(real_node, "render", str(spec)), ddpjob(real_node, "validate", str(spec))]
    run = Background(real_node, tmp_path, "sec", "submit", str(spec), "--wait", "--follow")
    try:
        # Compared inside the container, so the test prints the value nowhere either.
        same = exec_in(
            real_node,
            rns,
            "sec-master-0",
            f'[ "$API_TOKEN" = "{value}" ] && echo same || echo differs',
        )
        try:
            code, out, err = run.result(timeout=400)
        except AssertionError as e:
            # ci17 (cold): rank 0 said completed at 400/400, then `submit --wait --follow` heard
            # nothing more for 400 s, the machine idle. Whether the container had ended is what
            # tells a trainer that did not exit from a job status that did not come.
            raise AssertionError(f"{e}\n{where_things_stand(real_node, rns)}") from None
    finally:
        run.stop()
    assert same.strip() == "same"
    assert code == 0, err[-3000:]
    for args in (
        ("status", "sec"),
        ("status", "sec", "-o", "json"),
        ("logs", "sec"),
        ("events", "sec"),
        ("list",),
    ):
        printed.append(ddpjob(real_node, *args, "-n", rns))
    for proc in printed:
        assert proc.returncode == 0, (proc.args, proc.stderr)
        assert value not in proc.stdout + proc.stderr, proc.args
    assert value not in out + err
    manifest = real_node.get_json("pytorchjob", "sec", "-n", rns)
    assert value not in json.dumps(manifest)
    env = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    ref = next(e for e in env["env"] if e["name"] == "API_TOKEN")
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "api", "key": "token"}
