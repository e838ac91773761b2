"""TrainJobs (Kubeflow Trainer v2.3 + JobSet v0.12, their real controllers and webhooks) driven by
the CLI, as a user would: submit, status, list, events, wait, logs, delete, doctor.

Two groups:

- API-level tests need the Trainer and JobSet controllers only (pods need not run): the webhooks
  accept what ``submit`` creates, a suspended TrainJob has no pods until resumed, a job whose
  JobSet cannot be built is explained from its events, a missing runtime is refused clearly.
- Run-level tests need pods that run container ``node``: the real kubelet node (branch ``node``).
  On a cluster without it they are skipped with that reason (kwok pods never run a container).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from localkube.handle import wait_until
from tests.e2e.helpers import REPO, Background, ddpjob, get_json, write_spec

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAINJOB_EXAMPLE = REPO / "examples" / "trainjob.yaml"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def _trainjob_spec(tmp_path, name: str, namespace: str, **fields):
    return write_spec(tmp_path, name, namespace, api="trainjob", **fields)


def _pods(cluster, name: str, namespace: str) -> list[dict]:
    return get_json(cluster, "pods", "-n", namespace, "-l", f"{JOBSET_NAME}={name}")["items"]


def _real_node(cluster) -> bool:
    nodes = get_json(cluster, "nodes")["items"]
    return any(
        n["metadata"].get("labels", {}).get("type") != "kwok"
        and not n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node")
        for n in nodes
    )


@pytest.fixture
def real_node(cluster):
    if not _real_node(cluster):
        pytest.skip(
            "needs pods that run container `node`: the real kubelet node (branch node) is not "
            "in this cluster; kwok nodes only simulate pods"
        )


# ---------------------------------------------------------------------------------------------
# API level: the real controllers and webhooks, no running pods needed


def test_doctor_reports_both_apis(cluster):
    r = ddpjob(cluster, "doctor")
    lines = r.stdout.splitlines()
    assert any(
        x.startswith("[  ok] PyTorchJob CRD: pytorchjobs.kubeflow.org served") for x in lines
    )
    assert any(
        x.startswith("[  ok] TrainJob CRD: trainjobs.trainer.kubeflow.org served") for x in lines
    ), r.stdout
    assert any(x.startswith("[  ok] JobSet CRD:") for x in lines), r.stdout
    assert any(x.startswith("[  ok] Trainer controller:") for x in lines), r.stdout
    assert r.returncode == 0, r.stdout + r.stderr


def test_submit_status_list_events_delete_a_suspended_trainjob(cluster, namespace, tmp_path):
    spec = _trainjob_spec(tmp_path, "tj-susp", namespace, suspend=True)
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"submitted trainjob {namespace}/tj-susp" in r.stdout
    assert "preflight: ok" in r.stderr, r.stderr
    job = get_json(cluster, "trainjob", "tj-susp", "-n", namespace)
    # The webhook kept what render wrote and stamped our runtime patch.
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == "ddpjob/spec" and patch.get("time")

    wait_until(
        "Suspended condition",
        lambda: (
            ddpjob(cluster, "status", "tj-susp", "-n", namespace, "-o", "json").stdout.find(
                '"condition": "Suspended"'
            )
            >= 0
        ),
        timeout=60,
    )
    time.sleep(2)
    assert _pods(cluster, "tj-susp", namespace) == []  # suspended: no pods at all
    st = json.loads(ddpjob(cluster, "status", "tj-susp", "-n", namespace, "-o", "json").stdout)
    assert (st["kind"], st["api"], st["pending"]) == ("TrainJob", "trainjob", [])

    ls = ddpjob(cluster, "list", "-n", namespace)
    row = next(x.split() for x in ls.stdout.splitlines() if x.startswith("tj-susp"))
    assert row[1:4] == ["TrainJob", "Suspended", "2"], ls.stdout

    cluster.kubectl(
        "patch", "trainjob", "tj-susp", "-n", namespace, "--type", "merge",
        "-p", '{"spec":{"suspend":false}}',
    )  # fmt: skip
    wait_until("pods once resumed", lambda: len(_pods(cluster, "tj-susp", namespace)) == 2, 60)
    st = json.loads(ddpjob(cluster, "status", "tj-susp", "-n", namespace, "-o", "json").stdout)
    assert st["condition"] in ("Created", "Running"), st
    assert sorted(r["replica"] for r in st["replicas"]) == ["node-0", "node-1"]

    ev = ddpjob(cluster, "events", "tj-susp", "-n", namespace)
    assert ev.returncode == 0 and "tj-susp" in ev.stdout, ev.stdout + ev.stderr

    d = ddpjob(cluster, "delete", "tj-susp", "-n", namespace, "--wait", timeout=150)
    assert d.returncode == 0, d.stdout + d.stderr
    assert f"deleted trainjob {namespace}/tj-susp and its pods" in d.stdout
    assert _pods(cluster, "tj-susp", namespace) == []


def test_a_runtime_that_does_not_exist_is_refused_clearly(cluster, namespace, tmp_path):
    spec = _trainjob_spec(tmp_path, "tj-nort", namespace, runtime="no-such-runtime")
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "preflight runtime failed: ClusterTrainingRuntime no-such-runtime does not exist" in (
        r.stderr
    )
    r = ddpjob(cluster, "submit", str(spec), "--no-preflight")
    assert r.returncode == 2, r.stdout + r.stderr  # the Trainer's webhook refused: bad input
    assert "specified clusterTrainingRuntime must be created before" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_trainjob_whose_jobset_cannot_be_built_is_explained_from_its_events(
    cluster, namespace, tmp_path
):
    # A name the TrainJob accepts (<= 63) but JobSet's webhook refuses for its pod names: the
    # spec refuses it, so the manifest goes in with kubectl, as another tool might send it.
    from controller.render.trainjob import render_trainjob
    from controller.spec import validate_spec

    name = "tj-" + "x" * 52
    manifest = render_trainjob(
        validate_spec({"name": "tj", "namespace": namespace, "image": "i", "api": "trainjob"})
    )
    manifest["metadata"]["name"] = name
    cluster.kubectl("create", "-f", "-", input_text=json.dumps(manifest))

    def explained():
        st = ddpjob(cluster, "status", name, "-n", namespace, "-o", "json")
        return st.returncode == 0 and "TrainJobResourcesCreationFailed" in st.stdout

    wait_until("status names the failed JobSet", explained, timeout=60)
    st = json.loads(ddpjob(cluster, "status", name, "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Pending"
    assert [p["pod"] for p in st["pending"]] == [f"{name}-node-0-0"]
    assert "no pod: TrainJobResourcesCreationFailed" in st["pending"][0]["reason"]
    assert "too long" in st["pending"][0]["reason"], st
    ev = ddpjob(cluster, "events", name, "-n", namespace)
    assert "TrainJobResourcesCreationFailed" in ev.stdout


def test_a_name_in_both_apis_needs_api(cluster, namespace, tmp_path):
    for api in ("pytorchjob", "trainjob"):
        spec = write_spec(tmp_path, "twin", namespace, suspend=True, api=api)
        r = ddpjob(cluster, "submit", str(spec), "--no-preflight")
        assert r.returncode == 0, r.stdout + r.stderr
    r = ddpjob(cluster, "status", "twin", "-n", namespace)
    assert r.returncode == 2
    assert f"error: status: {namespace}/twin is both a PyTorchJob and a TrainJob" in r.stderr
    assert "--api pytorchjob or --api trainjob" in r.stderr
    r = ddpjob(cluster, "status", "twin", "-n", namespace, "--api", "trainjob")
    assert r.returncode == 0 and r.stdout.startswith(f"TrainJob {namespace}/twin:"), r.stdout
    ls = ddpjob(cluster, "list", "-n", namespace)
    assert [x.split()[1] for x in ls.stdout.splitlines()[1:]] == ["PyTorchJob", "TrainJob"]


def test_helm_install_of_a_trainjob_is_admitted(cluster, namespace):
    values = REPO / "charts" / "ddpjob" / "ci" / "trainjob-values.yaml"
    data = yaml.safe_load(values.read_text())
    out = cluster.helm(
        "template", "rel", str(REPO / "charts" / "ddpjob"), "-f", str(values),
        "--set", f"namespace={namespace}", "--set", "suspend=true",
    )  # fmt: skip
    proc = cluster.kubectl("create", "-f", "-", input_text=out.stdout)
    assert f"trainjob.trainer.kubeflow.org/{data['name']} created" in proc.stdout


# ---------------------------------------------------------------------------------------------
# Run level: pods that run (the real node)


def test_quickstart_as_a_trainjob_succeeds(cluster, namespace, tmp_path, real_node):
    spec = _trainjob_spec(tmp_path, "tj-quick", namespace, max_steps=30)
    r = ddpjob(cluster, "submit", str(spec), "--wait", "--follow", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"job {namespace}/tj-quick Succeeded" in r.stdout
    train = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"event": "train"')]
    assert train and train[-1]["world_size"] == 2, train[-1:]  # both nodes in one group
    st = json.loads(ddpjob(cluster, "status", "tj-quick", "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Succeeded"


def test_a_failing_trainjob_is_explained(cluster, namespace, tmp_path, real_node):
    spec = _trainjob_spec(
        tmp_path, "tj-fail", namespace, trainer={"task": "tests.e2e.failing_task:FailingTask"}
    )
    r = ddpjob(cluster, "submit", str(spec), "--wait", timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    # The Job restarts the container in place until its backoffLimit, then deletes the pod:
    # the report comes from what wait recorded.
    assert f"job {namespace}/tj-fail Failed: replica node-" in r.stderr, r.stderr
    assert "exit code 1" in r.stderr and "last " in r.stderr and "log lines" in r.stderr


@pytest.mark.parametrize(("how", "code"), [("preempt", 143), ("lost-peer", 138), ("kill-9", 137)])
def test_a_trainjob_recovers(cluster, namespace, tmp_path, real_node, how, code):
    """Rank 1 dies (deleted: SIGTERM; SIGUSR1 = a lost peer; SIGKILL); the Job restarts or
    re-creates it, every node rejoins rank 0's rendezvous, the run resumes and succeeds."""
    name = f"tj-{how}"
    spec = _trainjob_spec(tmp_path, name, namespace, max_steps=200, every_steps=20)
    follow = Background(cluster, tmp_path, name, "submit", str(spec), "--follow")

    def rank1():
        pods = [p for p in _pods(cluster, name, namespace)
                if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "1"
                and p["status"].get("phase") == "Running"]  # fmt: skip
        return pods[0] if pods else None

    wait_until("rank 1 running", lambda: rank1() is not None, timeout=240)
    time.sleep(15)  # past a checkpoint
    pod = rank1()
    if how == "preempt":
        cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--wait=false")
    else:  # from the host: a container's PID 1 ignores SIGKILL sent from inside it
        pid = cluster.pod_pid(namespace, pod)
        assert pid, f"no process for {pod['metadata']['name']}"
        os.kill(pid, signal.SIGUSR1 if how == "lost-peer" else signal.SIGKILL)
    rc, out, err = follow.result(timeout=600)
    assert rc == 0, err[-3000:]
    assert f"job {namespace}/{name} Succeeded" in out
    assert '{"event": "resume"' in out, "the run did not resume from its checkpoint"
