"""TrainJobs (Kubeflow Trainer v2.3 + JobSet v0.12, their real controllers and webhooks) driven by
the CLI, as a user would: submit, status, list, events, wait, logs, delete, doctor.

Two groups:

- API-level tests need the Trainer and JobSet controllers only (pods need not run): the webhooks
  accept what ``submit`` creates, a suspended TrainJob has no pods until resumed, a job whose
  JobSet cannot be built is explained from its events, a missing runtime is refused clearly.
- Run-level tests run the pods for real on the cluster's node (kubelet + containerd), with this
  checkout's trainer image and checkpoints on a ``local`` PersistentVolume of that node. On a
  cluster without the node (``DDPJOB_NODE=off``) they fail with one line saying so.

What a TrainJob's recovery cannot match of a PyTorchJob's, and each test pins: Trainer v2.3's
runtimePatches cannot set restartPolicy, backoffLimit or podFailurePolicy, so retries are the
torch-distributed runtime Job's: ``restartPolicy: OnFailure`` (every non-zero exit, 1 and 2
included, restarts the container in place, in the same pod) and ``backoffLimit: 6`` (container
restarts and failed pods of the whole job together). A PyTorchJob under ``ExitCode`` retries
only 130/137/138/143 and re-creates the pod under the same name; a TrainJob's deleted pod comes
back under a new name (``<job>-node-0-<index>-<random>``), and when the Job gives up it deletes
the pods it was restarting, so a failure is explained from what ``wait`` recorded meanwhile
(the failing job runs on a copy of torch-distributed whose backoffLimit is 1, so that it gives
up after one round of restarts instead of six).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from controller import kubeflow
from controller.jobs.read.queue import conditions
from localkube.handle import wait_until
from tests.e2e.helpers import (
    REPO,
    Background,
    ExitCodes,
    apply_objects,
    assert_same_lines,
    ddpjob,
    events,
    last_step,
    paced,
    plugin_on_claim,
    s3_checkpoints,
    s3_url,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRAINJOB_EXAMPLE = REPO / "examples" / "trainjob.yaml"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"


def _trainjob_spec(cluster, tmp_path, name: str, namespace: str, **fields):
    """write_spec's job as a TrainJob: this checkout's image, checkpoints on the claim ``ckpt``
    (so a restarted or re-created pod resumes), half a CPU per node."""
    return write_spec(cluster, tmp_path, name, namespace, api="trainjob", **fields)


def _pods(cluster, name: str, namespace: str) -> list[dict]:
    return cluster.get_json("pods", "-n", namespace, "-l", f"{JOBSET_NAME}={name}")["items"]


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
    spec = _trainjob_spec(cluster, tmp_path, "tj-susp", namespace, suspend=True)
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"submitted trainjob {namespace}/tj-susp" in r.stdout
    assert "preflight: ok" in r.stderr, r.stderr
    job = cluster.get_json("trainjob", "tj-susp", "-n", namespace)
    # The webhook kept what render wrote and stamped our runtime patch. (Kueue's TrainJob
    # webhook appends an empty one of its own, manager kueue.x-k8s.io/manager, to every TrainJob,
    # queued or not.)
    patches = {p["manager"]: p for p in job["spec"]["runtimePatches"]}
    assert set(patches) <= {"ddpjob/spec", "kueue.x-k8s.io/manager"}, patches
    assert patches["ddpjob/spec"].get("time")

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
    assert row[1:5] == ["TrainJob", "Suspended", "-", "2"], ls.stdout  # suspended, no queue

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
    spec = _trainjob_spec(cluster, tmp_path, "tj-nort", namespace, runtime="no-such-runtime")
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "preflight runtime failed: ClusterTrainingRuntime no-such-runtime does not exist" in (
        r.stderr
    )
    r = ddpjob(cluster, "submit", str(spec), "--no-preflight")
    assert r.returncode == 2, r.stdout + r.stderr  # the Trainer's webhook refused: bad input
    # The Trainer webhook's own words, which its versions change: the runtime, named.
    assert "denied the request" in r.stderr and "no-such-runtime" in r.stderr, r.stderr
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
        spec = write_spec(cluster, tmp_path, "twin", namespace, suspend=True, api=api)
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
# Run level: pods that run, on the real node


def _rank_pods(cluster, name: str, namespace: str, rank: int) -> list[dict]:
    return [
        p
        for p in _pods(cluster, name, namespace)
        if p["metadata"]["labels"].get(kubeflow.LABEL_JOB_COMPLETION_INDEX) == str(rank)
    ]


def _running(cluster, name: str, namespace: str, rank: int) -> dict | None:
    """The pod of ``rank`` once its trainer container runs."""
    for pod in _rank_pods(cluster, name, namespace, rank):
        statuses = pod.get("status", {}).get("containerStatuses") or []
        if statuses and statuses[0].get("state", {}).get("running"):
            return pod
    return None


def test_quickstart_as_a_trainjob_resumed_succeeds(cluster, namespace, tmp_path, real_node):
    """Submitted suspended, it runs nothing, and `wait` and `logs -f`, started then, ride
    through its resumption. Two pods on the real node train one model (world size 2 = nodes),
    and `logs -f` shows rank 0's events: every line rank 0's container printed, once."""
    from localkube.node.kubelet import NODE_NAME

    spec = _trainjob_spec(cluster, tmp_path, "tj-quick", namespace, max_steps=40, suspend=True)
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    follow = Background(cluster, tmp_path, "follow", "logs", "tj-quick", "-n", namespace, "-f")
    wait = Background(
        cluster, tmp_path, "wait", "wait", "tj-quick", "-n", namespace, "--timeout", "500"
    )

    def suspended() -> dict:
        return conditions(cluster.get_json("trainjob", "tj-quick", "-n", namespace)).get(
            "Suspended", {}
        )

    wait_until("the Suspended condition", lambda: suspended().get("status"))
    assert suspended()["status"] == "True"
    assert _pods(cluster, "tj-quick", namespace) == []  # suspended: nothing runs
    cluster.kubectl(
        "patch", "trainjob", "tj-quick", "-n", namespace, "--type", "merge",
        "-p", '{"spec":{"suspend":false}}',
    )  # fmt: skip
    wrc, wout, werr = wait.result(timeout=520)
    rc, out, err = follow.result(timeout=120)
    assert wrc == 0, wout + werr
    assert f"job {namespace}/tj-quick Succeeded" in wout
    assert rc == 0, err[-3000:]
    resumed = suspended()
    assert (resumed["status"], resumed["reason"]) == ("False", "Resumed")
    (start,) = events(out, "start")
    assert start["world_size"] == 2  # both nodes in one process group
    train = events(out, "train")
    assert [e["step"] for e in train] == list(range(5, 41, 5))
    assert all(e["loss"] == e["loss"] for e in train)  # real numbers: it trained
    (done,) = events(out, "done")
    assert (done["reason"], done["step"]) == ("completed", 40)

    (pod0,) = _rank_pods(cluster, "tj-quick", namespace, 0)
    assert_same_lines(out, cluster.pod_log_lines(namespace, pod0["metadata"]["name"]), "rank 0")
    for pod in _pods(cluster, "tj-quick", namespace):
        assert pod["spec"]["nodeName"] == NODE_NAME and pod["status"]["phase"] == "Succeeded"
        env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
        assert not env & {"MASTER_ADDR", "RANK", "WORLD_SIZE"}  # Trainer v2's five PET_* only
    st = json.loads(ddpjob(cluster, "status", "tj-quick", "-n", namespace, "-o", "json").stdout)
    assert st["condition"] == "Succeeded" and st["progress"]["step"] == 40

    # Rank 0 posted its progress into the TrainJob itself (Trainer's progress API, KEP-2779),
    # and `status` and `list` show it.
    # What rank 0 said of its posts, if anything (a failed post is logged as 'progress: ...').
    said = [line for line in out.splitlines() if "progress:" in line]
    status = cluster.get_json("trainjob", "tj-quick", "-n", namespace)["status"]
    assert "trainerStatus" in status, (status, said)
    reported = status["trainerStatus"]
    assert (reported["progressPercentage"], reported["estimatedRemainingSeconds"]) == (100, 0), (
        reported,
        said,
    )
    metrics = {m["name"]: m["value"] for m in reported["metrics"]}
    assert metrics["step"] == "40" and float(metrics["loss"]) == pytest.approx(done["loss"], 1e-5)
    assert float(metrics["samples_per_s"]) > 0
    assert st["reported_progress"] == reported
    text = ddpjob(cluster, "status", "tj-quick", "-n", namespace).stdout
    assert "reported in the TrainJob: 100%  ETA 0s  step 40  loss " in text
    listed = ddpjob(cluster, "list", "-n", namespace).stdout.splitlines()
    assert listed[0].split() == ["NAME", "KIND", "STATUS", "QUEUE", "NODES", "PROGRESS", "AGE"]
    assert listed[1].split()[:6] == ["tj-quick", "TrainJob", "Succeeded", "-", "2", "100%"]


#: torch-distributed with ``backoffLimit: 1``: a job whose every run fails gives up after one
#: round of in-place restarts instead of Kubernetes' default six.
FAIL_FAST_RUNTIME = "ddpjob-test-torch-fail-fast"


@pytest.fixture
def fail_fast_runtime(cluster):
    """A copy of torch-distributed under :data:`FAIL_FAST_RUNTIME`, its Job's backoffLimit 1;
    deleted after the test."""
    runtime = cluster.get_json("clustertrainingruntime", kubeflow.DEFAULT_RUNTIME)
    runtime["metadata"] = {"name": FAIL_FAST_RUNTIME, "labels": runtime["metadata"]["labels"]}
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    node["template"]["spec"]["backoffLimit"] = 1
    apply_objects(cluster, runtime)
    yield FAIL_FAST_RUNTIME
    cluster.kubectl("delete", "clustertrainingruntime", FAIL_FAST_RUNTIME, "--ignore-not-found")


def test_a_failing_trainjob_is_explained(
    cluster, namespace, tmp_path, real_node, fail_fast_runtime
):
    """Rank 0 raises at its 6th step. The runtime's Job restarts the containers in place
    (OnFailure: exit 1 too) up to its backoffLimit (1: a copy of torch-distributed), then fails
    and deletes the pods; the report still names rank 0's pod, its exit code and reason, and its
    last lines."""
    env = plugin_on_claim(cluster, namespace, REPO / "tests" / "e2e" / "failing_task.py")
    spec = _trainjob_spec(
        cluster,
        tmp_path,
        "tj-fail",
        namespace,
        max_steps=200,
        env=env,  # the task plug-in, from the volume
        trainer={"task": "failing_task:build", "task_args": {"fail_at_call": 6, "image_size": 16}},
        runtime=fail_fast_runtime,
    )
    r = ddpjob(cluster, "submit", str(spec), "--wait", timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr.split("last ")[0]  # our own error has no traceback
    assert f"error: job {namespace}/tj-fail Failed: replica node-0 (pod tj-fail-node-0-0-" in (
        r.stderr
    )
    assert "exit code 1 (Error, the program raised or exited 1)" in r.stderr, r.stderr
    assert "log lines of node-0:" in r.stderr
    assert "RuntimeError: injected failure at call 6 on rank 0" in r.stderr
    # The report outlived the pods: the Job deleted them when it gave up.
    job = cluster.get_json("job", "tj-fail-node-0", "-n", namespace)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    wait_until("the failed pods deleted", lambda: _pods(cluster, "tj-fail", namespace) == [], 60)
    w = ddpjob(cluster, "wait", "tj-fail", "-n", namespace, "--timeout", "30")
    assert w.returncode == 1 and f"job {namespace}/tj-fail Failed" in w.stderr, w.stderr


# How each fault is made, which rank it hits, and the exit codes the two ranks' containers then
# end their first run with (the faulted rank's first). A deleted pod's trainer checkpoints and
# exits 143 and tells its peer to stop too (the stop flag rides in every step's all-reduce);
# a rank killed -9 exits 137 and its peer, whose next collective fails, 138 (a lost peer).
FAULTS = {
    "preempt": ("delete pod", 1, (143, 143)),
    "lost-peer": ("kill -9", 0, (137, 138)),
    "kill-9": ("kill -9", 1, (137, 138)),
}


@pytest.mark.parametrize("how", list(FAULTS))
def test_a_trainjob_recovers(cluster, namespace, tmp_path, real_node, how):
    """A rank dies mid-run; its container is restarted in place (kill -9) or its pod replaced
    (deleted), its peer's container restarts after losing it, every node resumes from the
    checkpoint (on the PersistentVolume; a deleted pod's job, on the S3 server), the job
    Succeeds, and `logs -f` of rank 0 equals what rank 0's container printed across its runs: no
    line lost, none twice."""
    fault, rank, codes = FAULTS[how]
    name = f"tj-{how}"
    # Paced: at least 13 s of training left when the fault comes at step 30.
    fields = paced(cluster, namespace, 0.1)
    if fault == "delete pod":  # checkpoints on the local S3 server, none on the volume
        fields = s3_checkpoints(cluster, namespace, name, fields)
    spec = _trainjob_spec(
        cluster, tmp_path, name, namespace, max_steps=160, every_steps=10, **fields
    )
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 0, r.stdout + r.stderr
    exits = ExitCodes(cluster, namespace, f"{JOBSET_NAME}={name}")
    follow = Background(cluster, tmp_path, f"{name}-logs", "logs", name, "-n", namespace, "-f")
    wait = Background(cluster, tmp_path, f"{name}-wait", "wait", name, "-n", namespace)
    try:
        wait_until(
            "training past step 30",
            lambda: last_step(follow.out_path.read_text()) >= 30,
            300,
            0.5,
        )
        rank0_before = _running(cluster, name, namespace, 0)
        victim = _running(cluster, name, namespace, rank)
        assert rank0_before is not None and victim is not None
        if fault == "delete pod":
            victim_name = victim["metadata"]["name"]
            cluster.kubectl("delete", "pod", victim_name, "-n", namespace, "--wait=false")
        else:  # from the host: a container's PID 1 ignores SIGKILL sent from inside it
            pid = cluster.pod_pid(namespace, victim)
            assert pid, f"no host pid for {victim['metadata']['name']}"
            os.kill(pid, signal.SIGKILL)
        rc_w, out_w, err_w = wait.result(timeout=600)
        rc_f, out_f, err_f = follow.result(timeout=120)
    finally:
        follow.stop()
        wait.stop()
        runs = exits.stop()
    assert rc_w == 0, out_w + err_w
    assert rc_f == 0, err_f[-3000:]

    # Each rank's first run ended with the expected code and its next run with 0; a killed
    # container was restarted in place (same pod), a deleted pod replaced under a new name.
    peer = 1 - rank
    by_rank = {r: [(pod, code) for pod, index, code in runs if index == str(r)] for r in (0, 1)}
    assert [code for _, code in by_rank[peer]] == [codes[1], 0], runs
    # A container killed in place restarts within seconds, and may meet the master's previous
    # store while that one is still going: it then waits for the master's next one
    # (trainer.distributed._wait_while_the_store_holds_a_formed_group), so the container itself
    # runs exactly twice.
    victim_codes = [code for _, code in by_rank[rank]]
    assert victim_codes == [codes[0], 0], runs
    (peer_pod,) = _rank_pods(cluster, name, namespace, peer)
    assert peer_pod["status"]["containerStatuses"][0]["restartCount"] == 1
    (victim_now,) = _rank_pods(cluster, name, namespace, rank)
    if fault == "delete pod":
        assert victim_now["metadata"]["name"] != victim_name
        assert by_rank[rank][0][0] == victim_name and by_rank[rank][1][0] != victim_name
    else:
        assert victim_now["metadata"]["uid"] == victim["metadata"]["uid"]
        restarts = victim_now["status"]["containerStatuses"][0]["restartCount"]
        assert restarts == len(victim_codes) - 1, runs

    # Rank 0 resumed from a checkpoint of its first run and finished.
    starts = events(out_f, "start")
    assert len(starts) == 2, err_f[-2000:]
    (resumed,) = events(out_f, "resume")
    first_run = out_f[: out_f.index('{"event": "resume"')]
    saved = [e["step"] for e in events(first_run, "checkpoint")]
    # The newest checkpoint of the first run, announced or not: a save is durable once renamed,
    # and its event comes after the barrier that follows it, which fails when the peer is
    # already gone (a preempted run's own last save is announced: it is the stop's).
    assert resumed["step"] >= max(saved) >= 10, (resumed, saved)
    if fault == "delete pod":  # the stop's own checkpoint, uploaded before exit 143
        (stopped,) = events(first_run, "done")
        assert stopped["reason"] == "preempted"
        assert resumed["step"] == max(saved) == stopped["step"], (resumed, saved)
        assert resumed["path"] == f"{s3_url(namespace, name)}/step_{resumed['step']:08d}"
        second_run = out_f[len(first_run) :]
        assert all(e["step"] > resumed["step"] for e in events(second_run, "train"))
    assert [d["reason"] for d in events(out_f, "done")][-1] == "completed"
    assert last_step(out_f) == 160
    (pod0,) = _rank_pods(cluster, name, namespace, 0)
    assert pod0["metadata"]["uid"] == rank0_before["metadata"]["uid"]  # restarted in place
    assert_same_lines(out_f, cluster.pod_log_lines(namespace, pod0["metadata"]["name"]), "rank 0")
