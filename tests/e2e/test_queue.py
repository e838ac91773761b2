"""Jobs through Kueue (v0.19, its real controller and webhooks) on the local cluster, as a user
on a shared cluster meets them: submit to a queue, see where the job stands, wait through the
queue, and be preempted by a job of higher priority, then resume exactly.

Each test gets a namespace with a LocalQueue. The first feeds the quick start's
``cluster-queue``; the others feed a ClusterQueue of their own whose quota is one CPU, so what
is admitted, what waits and what is preempted does not depend on other tests sharing the
cluster (Kueue counts only the jobs of its queue; the node's CPUs are shared, so a job may be
admitted and still wait for the node a while).

The preemption test runs both APIs. A low-priority job trains with checkpoints on the local
cluster's S3 server (no checkpoint volume); a high-priority job arrives; Kueue evicts the low
one (its pods get the kubelet's SIGTERM: the trainer checkpoints and exits 143), runs the high
one, then admits the low one again, which resumes from the checkpoint it wrote on SIGTERM:
every step from 1 to max_steps is trained once, none lost, none repeated, read from rank 0's
events.
"""

from __future__ import annotations

import json

import pytest

from controller import kubeflow
from controller.jobs.read.goodput import PARTS
from localkube.addons import kueue
from localkube.handle import temporary_namespace, wait_until
from tests.e2e.helpers import (
    KUEUE_V1BETA2,
    Background,
    ExitCodes,
    apply_objects,
    assert_same_lines,
    ddpjob,
    events,
    last_step,
    local_queue,
    paced,
    s3_checkpoints,
    s3_url,
    write_spec,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOW, HIGH = "ddpjob-e2e-low", "ddpjob-e2e-high"  # WorkloadPriorityClasses (cluster-scoped)


def _cluster_queue(name: str, cpu: str) -> dict:
    """A ClusterQueue of ``cpu`` CPUs (and 8Gi) in the quick start's flavor, preempting lower
    priorities within itself, for the test's namespace only."""
    return {
        "apiVersion": KUEUE_V1BETA2,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": kueue.FLAVOR,
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": "8Gi"},
                            ],
                        }
                    ],
                }
            ],
            "preemption": {"withinClusterQueue": "LowerPriority"},
        },
    }


@pytest.fixture
def namespace(cluster):
    kueue.require()
    with temporary_namespace(cluster, "queue") as name:
        yield name
        # The namespace's jobs go with it; TrainJobs are not in temporary_namespace's list.
        cluster.kubectl("delete", "trainjobs", "--all", "-n", name, "--wait=false", check=False)


@pytest.fixture
def own_queue(cluster, namespace):
    """LocalQueue ``user-queue`` in the namespace, feeding a ClusterQueue of one CPU named
    after the namespace; the WorkloadPriorityClasses LOW (100) and HIGH (1000)."""
    apply_objects(
        cluster,
        {"apiVersion": KUEUE_V1BETA2, "kind": "WorkloadPriorityClass", "metadata": {"name": LOW},
         "value": 100},
        {"apiVersion": KUEUE_V1BETA2, "kind": "WorkloadPriorityClass", "metadata": {"name": HIGH},
         "value": 1000},
        _cluster_queue(namespace, "1"),
        local_queue("user-queue", namespace, namespace),
    )  # fmt: skip
    yield namespace
    cluster.kubectl("delete", "clusterqueue", namespace, "--wait=false", check=False)


def _spec(cluster, tmp_path, name, namespace, **fields):
    """write_spec's small job with 2 pods of half a CPU (one CPU of quota: the queues' size) in
    the queue."""
    fields.setdefault("resources", {"cpu": "500m", "memory": "1536Mi"})
    return write_spec(cluster, tmp_path, name, namespace, queue="user-queue", **fields)


def _status(cluster, name: str, namespace: str, *flags: str) -> dict:
    r = ddpjob(cluster, "status", name, "-n", namespace, "-o", "json", *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---------------------------------------------------------------------------------------------


def test_a_job_submitted_to_user_queue_is_queued_admitted_and_succeeds(
    cluster, namespace, tmp_path
):
    """The quick start's queue: LocalQueue user-queue feeding cluster-queue. The job is created
    suspended, Kueue admits it (``submit --wait`` says by which ClusterQueue; whether it also
    saw it queued first depends on how fast Kueue was) and it succeeds; status and list name
    the queue. (A TrainJob through a queue, admitted, preempted and admitted again: the
    preemption test's ``[trainjob]``.)"""
    apply_objects(cluster, local_queue("user-queue", namespace, kueue.CLUSTER_QUEUE))
    spec = _spec(cluster, tmp_path, "queued", namespace, max_steps=20)
    r = ddpjob(cluster, "submit", str(spec), "--wait", "--timeout", "400", timeout=420)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "job queued: admitted by cluster-queue at " in r.stderr, r.stderr
    assert f"job {namespace}/queued Succeeded" in r.stdout
    (workload,) = cluster.get_json("workloads", "-n", namespace)["items"]
    assert workload["spec"]["queueName"] == "user-queue"
    assert workload["status"]["admission"]["clusterQueue"] == kueue.CLUSTER_QUEUE
    manifest = cluster.get_json("pytorchjob", "queued", "-n", namespace)
    assert manifest["metadata"]["labels"][kubeflow.LABEL_QUEUE] == "user-queue"
    st = _status(cluster, "queued", namespace)
    assert st["queue"]["local_queue"] == "user-queue"
    assert st["queue"]["cluster_queue"] == kueue.CLUSTER_QUEUE
    assert st["queue"]["state"] in ("admitted", "finished")
    listed = ddpjob(cluster, "list", "-n", namespace)
    (row,) = [line.split() for line in listed.stdout.splitlines() if line.startswith("queued ")]
    assert row[2:4] == ["Succeeded", "user-queue"], listed.stdout


def test_a_queued_job_says_what_it_waits_for_and_wait_waits_through_the_queue(
    cluster, own_queue, tmp_path
):
    """The first job takes the queue's one CPU; the second waits: status names its queue, its
    ClusterQueue and what it waits for (1 cpu of 0 free), list shows it Queued, and ``wait``
    says it is queued, waits (a suspended job is not failed), and follows it to Succeeded once
    the first ends and Kueue admits it."""
    ns = own_queue
    first = _spec(cluster, tmp_path, "first", ns, max_steps=40)
    assert ddpjob(cluster, "submit", str(first)).returncode == 0
    wait_until(
        "first admitted",
        lambda: (_status(cluster, "first", ns)["queue"] or {}).get("state") == "admitted",
        60,
    )
    second = _spec(cluster, tmp_path, "second", ns, max_steps=20)
    r = ddpjob(cluster, "submit", str(second))
    assert r.returncode == 0, r.stderr
    waiter = Background(cluster, tmp_path, "wait-second", "wait", "second", "-n", ns)
    try:
        st = wait_until(
            "second pending with its reason",
            lambda: (s := _status(cluster, "second", ns))["queue"]["waits_for"] and s,
            60,
        )
        q = st["queue"]
        assert (q["local_queue"], q["cluster_queue"], q["state"]) == ("user-queue", ns, "pending")
        assert q["waits_for"] == [f"1 cpu of 0 free (quota 1, flavor {kueue.FLAVOR})"]
        assert "insufficient unused quota for cpu" in q["message"]
        assert q["reason"] == "Pending"  # Kueue's, with its default feature gates
        assert q["ahead"] == 0
        text = ddpjob(cluster, "status", "second", "-n", ns).stdout
        assert f"queue: queued in user-queue -> {ns}, next in line; waits for 1 cpu of 0 free" in (
            text
        )
        assert "queue: Kueue says Pending: couldn't assign flavors to pod set" in text, text
        listed = ddpjob(cluster, "list", "-n", ns).stdout
        rows = {line.split()[0]: line.split() for line in listed.splitlines()[1:]}
        assert rows["second"][2:4] == ["Queued", "user-queue"], listed
        assert (
            cluster.get_json("pods", "-n", ns, "-l", "training.kubeflow.org/job-name=second")[
                "items"
            ]
            == []
        )
        rc, out, err = waiter.result(timeout=500)
    finally:
        waiter.stop()
    assert rc == 0, out + err
    assert f"job second: queued in user-queue -> {ns}" in err
    assert f"job second: admitted by {ns} at " in err
    assert f"job {ns}/second Succeeded" in out
    assert err.index("queued in") < err.index("admitted by") < err.index("Running")


def test_a_job_larger_than_its_queue_is_said_so_by_status_and_wait_in_kueues_words(
    cluster, own_queue, tmp_path
):
    """Two pods of 750m CPU in a queue of one CPU: Kueue can never admit it (``submit --force``
    past the preflight that says so). ``status`` quotes Kueue's reason and message from the
    Workload's condition and what it means; ``wait`` says the same from Kueue's event at once
    (it never clears), and its timeout names it. No pod is ever made."""
    ns = own_queue
    spec = _spec(cluster, tmp_path, "big", ns, resources={"cpu": "750m", "memory": "1Gi"})
    refused = ddpjob(cluster, "submit", str(spec))
    assert refused.returncode == 1 and "preflight queue admits failed" in refused.stderr
    assert ddpjob(cluster, "submit", str(spec), "--force").returncode == 0
    st = wait_until(
        "Kueue's verdict on big",
        lambda: (s := _status(cluster, "big", ns))["queue"].get("reason") and s,
        60,
    )
    q = st["queue"]
    assert (q["state"], q["reason"]) == ("pending", "Pending"), q
    assert "insufficient quota for cpu in flavor default-flavor" in q["message"], q
    assert "> maximum capacity (1)" in q["message"], q
    text = ddpjob(cluster, "status", "big", "-n", ns).stdout
    (said,) = [x for x in text.splitlines() if x.startswith("queue: Kueue says")]
    assert said == (
        f"queue: Kueue says Pending: {q['message']} (the job asks more than the ClusterQueue can "
        "ever hold: lower resources or nodes)"
    ), text
    r = ddpjob(cluster, "wait", "big", "-n", ns, "--timeout", "15")
    assert r.returncode == 1, r.stdout + r.stderr
    assert (
        f"job big: the job is held: Queued: in Kueue queue user-queue, Kueue says Pending: "
        f"{q['message']}" in r.stderr
    ), r.stderr
    last = r.stderr.strip().splitlines()
    timeout_line = next(x for x in last if "has not ended after 15 s" in x)
    assert "Kueue says Pending: " in timeout_line, r.stderr
    assert cluster.get_json("pods", "-n", ns)["items"] == []


def test_a_missing_queue_or_priority_class_is_refused_before_submit(cluster, namespace, tmp_path):
    spec = _spec(cluster, tmp_path, "typo", namespace)
    r = ddpjob(cluster, "submit", str(spec))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "queue: no LocalQueue user-queue in namespace" in r.stderr.splitlines()[-1]
    apply_objects(cluster, local_queue("user-queue", namespace, kueue.CLUSTER_QUEUE))
    r = ddpjob(cluster, "submit", str(spec), "--set", "priority_class=no-such-class")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "priority_class: no WorkloadPriorityClass no-such-class" in r.stderr.splitlines()[-1]
    assert "Traceback" not in r.stderr
    assert cluster.get_json("pytorchjobs", "-n", namespace)["items"] == []  # nothing submitted


# ---------------------------------------------------------------------------------------------
# Preemption, end to end on the real node

#: The low job's steps, paced at :data:`STEP_S` (helpers.paced): at least 19 s of training
#: after the high job is submitted at step 10, longer than Kueue takes to evict it (a few
#: seconds) on any machine. Every step is logged.
MAX_STEPS = 400
STEP_S = 0.05


def _rank0_selector(api: str, name: str) -> str:
    if api == "trainjob":
        return f"{kubeflow.LABEL_JOBSET_NAME}={name},{kubeflow.LABEL_JOB_COMPLETION_INDEX}=0"
    return f"{kubeflow.LABEL_JOB_NAME}={name},{kubeflow.LABEL_REPLICA_TYPE}=master"


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_a_low_priority_job_preempted_by_a_high_one_checkpoints_resumes_and_loses_no_step(
    cluster, own_queue, tmp_path, api
):
    ns = own_queue
    low = _spec(
        cluster, tmp_path, "low", ns, api=api, priority_class=LOW, max_steps=MAX_STEPS,
        log_every=1,
        **s3_checkpoints(cluster, ns, "low", paced(cluster, ns, STEP_S), every_steps=5),
    )  # fmt: skip
    high = _spec(cluster, tmp_path, "high", ns, api=api, priority_class=HIGH, max_steps=10)
    exits = ExitCodes(cluster, ns, _rank0_selector(api, "low"))
    assert ddpjob(cluster, "submit", str(low)).returncode == 0
    follow = Background(cluster, tmp_path, "low-logs", "logs", "low", "-n", ns, "-f")
    wait_low = Background(cluster, tmp_path, "low-wait", "wait", "low", "-n", ns)
    try:
        wait_until(
            "low training past step 10", lambda: last_step(follow.out_path.read_text()) >= 10, 400
        )
        r = ddpjob(cluster, "submit", str(high), "--wait", "--timeout", "500", timeout=520)
        assert r.returncode == 0, r.stdout + r.stderr  # the high one ran and completed
        rc_w, out_w, err_w = wait_low.result(timeout=600)
        rc_f, out_f, err_f = follow.result(timeout=120)
    finally:
        follow.stop()
        wait_low.stop()
        runs = exits.stop()
    assert rc_w == 0, out_w + err_w
    assert rc_f == 0, err_f[-3000:]

    # Rank 0 of the low job: SIGTERM from the kubelet when Kueue evicted it -> checkpoint, 143;
    # the run after readmission -> 0.
    assert [code for _, _, code in runs] == [143, 0], runs
    done = events(out_f, "done")
    assert [d["reason"] for d in done] == ["preempted", "completed"], err_f[-2000:]
    preempted_at = done[0]["step"]
    assert 10 <= preempted_at < MAX_STEPS
    assert preempted_at in [e["step"] for e in events(out_f, "checkpoint")]
    (resumed,) = events(out_f, "resume")
    assert resumed["step"] == preempted_at
    # Every checkpoint went to object storage, and the resume read it from there.
    where = s3_url(ns, "low")
    assert all(e["path"].startswith(where) for e in events(out_f, "checkpoint"))
    assert resumed["path"].startswith(where)
    assert len(events(out_f, "start")) == 2
    # Exactly max_steps steps: each step from 1 to max_steps trained once (log_every=1).
    steps = [e["step"] for e in events(out_f, "train")]
    assert steps == list(range(1, MAX_STEPS + 1)), steps
    assert done[-1]["step"] == MAX_STEPS
    # logs -f showed both runs: everything rank 0's containers printed, in order, once.
    pods = list(dict.fromkeys(pod for pod, _, _ in runs))
    truth = [line for pod in pods for line in cluster.pod_log_lines(ns, pod)]
    assert_same_lines(out_f, truth, "rank 0 of low")
    # What `wait` told the user: evicted by the high job (or, had Kueue requeued it before
    # `wait` looked, queued again after it), then admitted again.
    told = err_w.splitlines()
    by_high = [i for i, line in enumerate(told) if f"by {api} {ns}/high (prioritization" in line]
    again = [i for i, line in enumerate(told) if line.startswith(f"job low: admitted by {ns} at")]
    assert by_high and again and by_high[0] < again[-1], err_w
    st = _status(cluster, "low", ns, "--price-per-gpu-hour", "2.5")
    assert st["condition"] == "Succeeded"
    assert st["queue"]["preempted"] == 1
    assert st["queue"]["preempted_by"] == f"{api} {ns}/high"
    assert st["queue"]["preempted_why"] == "prioritization in the ClusterQueue"
    text = ddpjob(cluster, "status", "low", "-n", ns).stdout
    assert f"queue: preempted 1 time, last by {api} {ns}/high" in text
    high_st = _status(cluster, "high", ns)
    assert high_st["condition"] == "Succeeded" and high_st["queue"]["preempted"] == 0
    _check_goodput(cluster, ns, api, st["goodput"], high_st["goodput"])


def _job_events(cluster, ns: str) -> list[tuple]:
    """The low job's events, as goodput reads Kueue's in them (for a failure's message)."""
    items = cluster.get_json("events", "-n", ns, "--field-selector", "involvedObject.name=low")
    return [
        (e["involvedObject"].get("kind"), e.get("reason"), e.get("message"), e.get("count"),
         e.get("firstTimestamp") or e.get("eventTime"), e.get("lastTimestamp"), e.get("series"))
        for e in items["items"]
    ]  # fmt: skip


def _check_goodput(cluster, ns: str, api: str, g: dict, high: dict) -> None:
    """What the preempted job cost (status -o json's goodput, `goodput`): two runs, no step
    lost (the SIGTERM checkpoint), queued at least while the high job trained, every moment of
    its wall time in one part; priced, a job without GPUs has no GPU cost."""
    assert sum(g[k] for k in PARTS) == pytest.approx(g["wall_s"], abs=0.05)
    assert (g["running"], g["runs"], g["lost_steps"]) == (False, 2, 0)
    assert g["sources"] == {"queue": "kueue events", "trainer": "ledger"}, "\n".join(
        map(str, _job_events(cluster, ns))
    )
    assert g["productive_s"] >= MAX_STEPS * STEP_S  # each step sleeps STEP_S
    assert g["startup_s"] > 0 and g["scheduling_s"] > 0 and g["checkpoint_s"] > 0
    # Kueue admits the high job once the low one's pods are gone, and the low one again once
    # the high one is done: the high one's start-up and steps lie in the low one's wait.
    assert g["queued_s"] >= high["startup_s"] + high["productive_s"] > 0
    assert (g["price_per_gpu_hour"], g["cost"], g["gpus"], g["replicas"]) == (2.5, None, 0, 2)
    r = ddpjob(cluster, "goodput", "low", "-n", ns, "--price-per-gpu-hour", "2.5")
    assert r.returncode == 0, r.stderr
    print(r.stdout)  # the account, as a user reads it (pytest -rP shows it)
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{api} {ns}/low: ") and lines[0].endswith("(ended), 2 run(s)")
    assert [line.split()[0] for line in lines[1:9]] == [
        "queued", "scheduling", "start-up", "productive", "checkpoint", "evaluation", "work",
        "restarts,",
    ]  # fmt: skip
    assert lines[9].startswith(f"goodput: {g['goodput_pct']:.1f}% (productive / wall)")
    assert "cost: none at 2.5 per GPU-hour (no GPUs held)" in lines
