"""Kubeflow Trainer v2 and JobSet in the local cluster, against the real controllers.

What a TrainJob becomes (JobSet -> Indexed Job -> pods with the torch plugin's PET_* env), how
Trainer reports what goes wrong, and that the training operator v1 still works beside it. The pods
run on the real node in this checkout's trainer image (the runtime's), like every pod: the
logs and the Complete condition come from the kubelet, which resolves the env's fieldRefs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from controller import kubeflow
from localkube.addons import trainer_v2
from localkube.builds import gotools, images
from localkube.handle import temporary_namespace, wait_until

#: What the TrainJobStatus plugin gives every trainer container (trainer/telemetry/progress_api.py).
PROGRESS_ENV = (
    "KUBEFLOW_TRAINER_SERVER_URL",
    "KUBEFLOW_TRAINER_SERVER_CA_CERT",
    "KUBEFLOW_TRAINER_SERVER_TOKEN",
)

pytestmark = pytest.mark.cluster

PRINT_PET_ENV = (
    "import json, os; "
    "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('PET_')}))"
)


@pytest.fixture
def namespace(real_node):
    with temporary_namespace(real_node, "tv2") as name:
        yield name


def _trainjob(
    name: str,
    num_nodes: int = 2,
    command: str = "pass",
    suspend: bool = False,
    num_proc_per_node: int | None = None,
    resources: dict | None = None,
    runtime: str = kubeflow.DEFAULT_RUNTIME,
) -> str:
    # No image: the runtime's, this checkout's trainer image.
    trainer: dict = {
        "numNodes": num_nodes,
        "command": ["python3", "-c", command],
    }
    if num_proc_per_node is not None:
        trainer["numProcPerNode"] = num_proc_per_node
    if resources is not None:
        trainer["resourcesPerNode"] = resources
    return json.dumps(
        {
            "apiVersion": kubeflow.TRAINJOB.api_version,
            "kind": kubeflow.TRAINJOB.kind,
            "metadata": {"name": name},
            "spec": {"runtimeRef": {"name": runtime}, "suspend": suspend, "trainer": trainer},
        }
    )


def _create(cluster, ns: str, manifest: str, check: bool = True) -> subprocess.CompletedProcess:
    return cluster.kubectl("create", "-n", ns, "-f", "-", input_text=manifest, check=check)


def _owned(cluster, kind: str, ns: str, jobset: str) -> list[dict]:
    """The pods or Jobs of a JobSet (= of the TrainJob of that name), by JobSet's label."""
    selector = f"{kubeflow.LABEL_JOBSET_NAME}={jobset}"
    return cluster.get_json(kind, "-n", ns, "-l", selector)["items"]


def _pods(cluster, ns: str, jobset: str, count: int | None = None) -> list[dict]:
    """A JobSet's pods; with ``count``, an empty list until there are exactly that many."""
    pods = _owned(cluster, "pods", ns, jobset)
    return pods if count is None or len(pods) == count else []


def _condition(obj: dict, kind: str) -> dict | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _condition_true(cluster, kind: str, ns: str, name: str, condition: str) -> dict | None:
    """The object once its ``condition`` is True, else None."""
    obj = cluster.get_json(kind, name, "-n", ns)
    return obj if (_condition(obj, condition) or {}).get("status") == "True" else None


def _jobset(cluster, ns: str, name: str) -> dict | None:
    return cluster.get_json("jobset", name, "-n", ns, missing_ok=True)


def _node_template(jobset: dict) -> dict:
    """The replicated job ``node`` of a JobSet (fails when there is none)."""
    jobs = {j["name"]: j for j in jobset["spec"]["replicatedJobs"]}
    assert list(jobs) == [kubeflow.TRAINJOB_REPLICATED_JOB]
    return jobs[kubeflow.TRAINJOB_REPLICATED_JOB]


def _is_subset(want, got) -> bool:
    """True when every field of ``want`` is in ``got`` with the same value (lists: same length,
    element-wise); the API server may add defaults to ``got``."""
    if isinstance(want, dict):
        return isinstance(got, dict) and all(
            k in got and _is_subset(v, got[k]) for k, v in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(want) == len(got)
            and all(_is_subset(w, g) for w, g in zip(want, got, strict=True))
        )
    return want == got


# ------------------------------------------------------------------------------------ install


def test_crds_served_and_torch_runtime_installed(cluster):
    """The four CRDs are Established and served; torch-distributed is upstream's runtime with
    our image and nothing else changed."""
    crds = cluster.get_json("crd", *trainer_v2.CRDS)["items"]
    established = {
        c["metadata"]["name"]
        for c in crds
        if (_condition(c, "Established") or {}).get("status") == "True"
    }
    assert established == set(trainer_v2.CRDS)
    served = cluster.kubectl("api-resources", "-o", "name").stdout.split()
    for api in (kubeflow.TRAINJOB, kubeflow.CLUSTER_TRAINING_RUNTIME, kubeflow.JOBSET):
        assert api.crd in served

    manifests = gotools.tools_dir() / "manifests"
    upstream = yaml.safe_load((manifests / "trainer-torch-distributed.yaml").read_text())
    installed = cluster.get_json("clustertrainingruntime", kubeflow.DEFAULT_RUNTIME)
    # Ours differs from upstream's file in the node container's image only: this checkout's
    # trainer image, the one `up` imports into the node.
    (node,) = installed["spec"]["template"]["spec"]["replicatedJobs"]
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == images.trainer_ref()
    (up_node,) = upstream["spec"]["template"]["spec"]["replicatedJobs"]
    (up_container,) = up_node["template"]["spec"]["template"]["spec"]["containers"]
    assert up_container["image"].startswith("pytorch/pytorch:")
    want = trainer_v2.torch_runtime(manifests, images.trainer_ref())
    up_container["image"] = images.trainer_ref()
    assert want == upstream
    assert _is_subset(want["spec"], installed["spec"])
    assert installed["metadata"]["labels"] == want["metadata"]["labels"]
    assert installed["spec"]["mlPolicy"]["torch"] == {}


def test_the_sdks_public_configmap_is_readable_by_any_user(cluster):
    """Upstream's kubeflow-trainer-public ConfigMap (the Trainer version the Kubeflow SDK reads
    when a TrainerClient starts) in kubeflow-system, readable by every authenticated user and
    nothing else there."""
    cm = cluster.get_json("configmap", trainer_v2.PUBLIC, "-n", "kubeflow-system")
    assert cm["data"] == {"kubeflow_trainer_version": kubeflow.TRAINER_VERSION}
    as_anyone = ("--as", "someone", "--as-group", "system:authenticated", "-n", "kubeflow-system")
    can = cluster.kubectl("auth", "can-i", "get", f"configmap/{trainer_v2.PUBLIC}", *as_anyone)
    assert can.stdout.strip() == "yes"
    cannot = cluster.kubectl("auth", "can-i", "get", "configmap/other", *as_anyone, check=False)
    assert cannot.stdout.strip() == "no"


def test_status_shows_controller_memory(cluster):
    """``python -m localkube status`` reports both controllers' memory."""
    proc = subprocess.run(
        [sys.executable, "-m", "localkube", "status"],
        capture_output=True,
        text=True,
        check=True,
        cwd=cluster.control_plane.repo,
    )
    rss = json.loads(proc.stdout)["rss_mib"]
    assert rss["trainer-controller-manager"] > 0
    assert rss["jobset-controller-manager"] > 0


# ------------------------------------------------------------------------------------ TrainJob


def test_two_node_trainjob_becomes_indexed_jobset_with_pet_env(cluster, namespace):
    """numNodes 2 -> a JobSet defaulted by its webhook (Indexed, DNS hostnames) -> 2 pods with
    container ``node``, the JobSet labels and exactly the torch plugin's 5 PET_* variables."""
    name = "pair"
    _create(
        cluster, namespace, _trainjob(name, num_nodes=2, num_proc_per_node=2, command=PRINT_PET_ENV)
    )
    jobset = wait_until("JobSet", lambda: _jobset(cluster, namespace, name), 60)
    node = _node_template(jobset)
    # What JobSet's mutating webhook sets (Trainer leaves them unset).
    assert node["template"]["spec"]["completionMode"] == "Indexed"
    assert node["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    assert jobset["spec"]["successPolicy"]["operator"] == "All"
    assert node["template"]["spec"]["parallelism"] == node["template"]["spec"]["completions"] == 2

    jobs = wait_until("Job", lambda: _owned(cluster, "jobs", namespace, name), 60)
    assert [j["spec"]["completionMode"] for j in jobs] == ["Indexed"]
    service = cluster.get_json("service", name, "-n", namespace)
    assert service["spec"]["clusterIP"] == "None"  # headless: <host>.<jobset> resolves to a pod

    pods = wait_until("2 pods", lambda: _pods(cluster, namespace, name, count=2), 60)
    by_index = {}
    for pod in pods:
        labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        index = labels[kubeflow.LABEL_JOB_COMPLETION_INDEX]
        assert annotations[kubeflow.LABEL_JOB_COMPLETION_INDEX] == index
        assert labels[kubeflow.LABEL_JOBSET_NAME] == name
        assert labels[kubeflow.LABEL_REPLICATED_JOB_NAME] == kubeflow.TRAINJOB_REPLICATED_JOB
        by_index[index] = pod
    assert set(by_index) == {"0", "1"}

    master_addr = kubeflow.trainjob_master_addr(name)
    rank0 = by_index["0"]["spec"]
    assert f"{rank0['hostname']}.{rank0['subdomain']}" == master_addr == "pair-node-0-0.pair"
    for index, pod in by_index.items():
        spec = pod["spec"]
        assert spec["hostname"] == f"{name}-node-0-{index}" and spec["subdomain"] == name
        (container,) = spec["containers"]
        assert container["name"] == kubeflow.TRAINJOB_CONTAINER
        assert container["image"] == images.trainer_ref()  # the runtime's: this checkout's
        env = {e["name"]: e for e in container["env"]}
        # The 5 PET_* of the torch plugin, the Job controller's own JOB_COMPLETION_INDEX and
        # the progress API's three (the TrainJobStatus gate is on): no MASTER_ADDR, RANK or
        # WORLD_SIZE.
        assert set(env) == {*kubeflow.TRAINJOB_RESERVED_ENV, "JOB_COMPLETION_INDEX", *PROGRESS_ENV}
        port = cluster.control_plane.read_state()["ports"]["trainer-status"]
        assert env["KUBEFLOW_TRAINER_SERVER_URL"]["value"] == (
            f"https://{trainer_v2.STATUS_DNS}:{port}"
            f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
        )
        assert env[kubeflow.ENV_NNODES]["value"] == "2"
        assert env[kubeflow.ENV_NPROC_PER_NODE]["value"] == "2"
        assert env[kubeflow.ENV_MASTER_ADDR]["value"] == master_addr
        assert env[kubeflow.ENV_MASTER_PORT]["value"] == str(kubeflow.TRAINJOB_MASTER_PORT)
        rank_ref = env[kubeflow.ENV_NODE_RANK]["valueFrom"]["fieldRef"]["fieldPath"]
        assert rank_ref == f"metadata.annotations['{kubeflow.LABEL_JOB_COMPLETION_INDEX}']"
        assert {"containerPort": kubeflow.TRAINJOB_MASTER_PORT, "protocol": "TCP"} in container[
            "ports"
        ]

    # The kubelet runs the command: each pod's PET_NODE_RANK is its completion index, and
    # JobSet's success policy ends the TrainJob Complete.
    trainjob = wait_until(
        "TrainJob Complete",
        lambda: _condition_true(cluster, "trainjob", namespace, name, "Complete"),
        90,
    )
    assert _condition(trainjob, "Failed") is None
    for index, pod in by_index.items():
        out = cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"]).stdout
        printed = json.loads(out.strip().splitlines()[-1])
        assert printed[kubeflow.ENV_NODE_RANK] == index
        assert printed[kubeflow.ENV_NNODES] == "2"


@pytest.mark.parametrize(
    ("num_proc_per_node", "resources", "want"),
    [
        (3, None, "3"),  # spec.trainer.numProcPerNode wins
        (None, {"limits": {"nvidia.com/gpu": 1}}, "auto"),  # GPUs: torchrun decides
        (None, {"requests": {"cpu": 4}}, "4"),  # CPU only: the CPUs requested
        (None, None, "1"),  # nothing: at least 1
    ],
)
def test_num_proc_per_node_flows_to_env(cluster, namespace, num_proc_per_node, resources, want):
    """PET_NPROC_PER_NODE in the JobSet's pod template, from numProcPerNode or resourcesPerNode."""
    manifest = _trainjob(
        "procs", num_nodes=1, suspend=True, num_proc_per_node=num_proc_per_node, resources=resources
    )
    _create(cluster, namespace, manifest)
    jobset = wait_until("JobSet", lambda: _jobset(cluster, namespace, "procs"), 60)
    (container,) = _node_template(jobset)["template"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[kubeflow.ENV_NPROC_PER_NODE] == want


def test_suspended_trainjob_creates_no_pods_until_resumed(cluster, namespace):
    """suspend: true -> a suspended JobSet and Job, condition Suspended, no pods; resuming
    creates the pods and flips the condition to False (Resumed)."""
    name = "later"
    _create(cluster, namespace, _trainjob(name, num_nodes=2, suspend=True))
    jobs = wait_until("suspended Job", lambda: _owned(cluster, "jobs", namespace, name), 60)
    assert all(j["spec"]["suspend"] is True for j in jobs)
    assert _jobset(cluster, namespace, name)["spec"]["suspend"] is True
    wait_until(
        "Suspended=True",
        lambda: _condition_true(cluster, "trainjob", namespace, name, "Suspended"),
        30,
    )
    time.sleep(3)  # the Job controller has had its chance to (wrongly) create pods
    assert _pods(cluster, namespace, name) == []

    cluster.kubectl(
        "patch",
        "trainjob",
        name,
        "-n",
        namespace,
        "--type",
        "merge",
        "-p",
        '{"spec":{"suspend":false}}',
    )
    wait_until("2 pods after resume", lambda: _pods(cluster, namespace, name, count=2), 60)

    def resumed():
        cond = _condition(cluster.get_json("trainjob", name, "-n", namespace), "Suspended")
        return cond if cond and cond["status"] == "False" else None

    assert wait_until("Suspended=False", resumed, 30)["reason"] == "Resumed"


# ------------------------------------------------------------------------------------ failures


def test_missing_runtime_is_refused_at_admission(cluster, namespace):
    """A TrainJob naming a runtime that does not exist never exists: Trainer's validating
    webhook refuses it (no object, so no condition and no event to watch for)."""
    proc = _create(cluster, namespace, _trainjob("orphan", runtime="no-such-runtime"), check=False)
    assert proc.returncode != 0
    # Trainer's webhook and Kueue's (its TrainJob integration looks the runtime up too) both
    # refuse it; the API server calls validating webhooks in parallel and reports one of them.
    trainers = ('"validator.trainjob.trainer.kubeflow.org" denied', '"vtrainjob.kb.io" denied')
    assert any(w in proc.stderr for w in trainers), proc.stderr
    assert "no-such-runtime" in proc.stderr and "not found" in proc.stderr
    gone = cluster.kubectl("get", "trainjob", "orphan", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_reconcile_failure_is_only_a_warning_event(cluster, namespace):
    """When Trainer cannot create a TrainJob's objects (here: a suspended JobSet of the same name
    with other replicated jobs, whose immutable spec JobSet's webhook defends) it says so only in
    a Warning event TrainJobResourcesCreationFailed: no Failed condition."""
    name = "clash"
    foreign = {
        "apiVersion": kubeflow.JOBSET.api_version,
        "kind": kubeflow.JOBSET.kind,
        "metadata": {"name": name},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "other",
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "containers": [
                                        {"name": "c", "image": "localhost/x:1", "command": ["true"]}
                                    ]
                                }
                            }
                        }
                    },
                }
            ],
        },
    }
    _create(cluster, namespace, json.dumps(foreign))
    _create(cluster, namespace, _trainjob(name, num_nodes=1))

    def warning():
        events = cluster.get_json(
            "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
        )["items"]
        return next(
            (
                e
                for e in events
                if e["involvedObject"]["kind"] == kubeflow.TRAINJOB.kind
                and e["reason"] == "TrainJobResourcesCreationFailed"
            ),
            None,
        )

    event = wait_until("TrainJobResourcesCreationFailed event", warning, 60)
    assert event["type"] == "Warning"
    assert 'admission webhook "vjobset.kb.io" denied' in event["message"]
    trainjob = cluster.get_json("trainjob", name, "-n", namespace)
    assert _condition(trainjob, "Failed") is None
    assert _condition(trainjob, "Complete") is None
    assert [j["name"] for j in _jobset(cluster, namespace, name)["spec"]["replicatedJobs"]] == [
        "other"
    ]


# ------------------------------------------------------------------------------------ beside v1


def test_pytorchjob_still_gets_its_pods(cluster, namespace):
    """The training operator v1 and its webhook work beside Trainer v2 and JobSet's pod
    webhooks: a PyTorchJob gets its Master and Worker pods and succeeds."""
    replica = {
        "replicas": 1,
        "restartPolicy": "Never",
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": kubeflow.CONTAINER,
                        "image": images.trainer_ref(),
                        "command": ["python", "-c", "pass"],
                    }
                ]
            }
        },
    }
    job = {
        "apiVersion": kubeflow.PYTORCHJOB.api_version,
        "kind": kubeflow.PYTORCHJOB.kind,
        "metadata": {"name": "v1job"},
        "spec": {"pytorchReplicaSpecs": {"Master": replica, "Worker": replica}},
    }
    _create(cluster, namespace, json.dumps(job))

    def v1_pods():
        selector = f"{kubeflow.LABEL_JOB_NAME}=v1job"
        items = cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
        return items if len(items) == 2 else None

    pods = wait_until("PyTorchJob pods", v1_pods, 60)
    assert {p["metadata"]["name"] for p in pods} == {"v1job-master-0", "v1job-worker-0"}
    wait_until(
        "PyTorchJob Succeeded",
        lambda: _condition_true(cluster, "pytorchjob", namespace, "v1job", "Succeeded"),
        90,
    )
