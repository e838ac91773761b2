"""Will the job ever schedule? The preflight's fit check on API dicts, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from controller.jobs.doctor import fit_problem


def node(
    name: str,
    gpus: int = 8,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {
                "cpu": "32",
                "memory": "256Gi",
                "nvidia.com/gpu": str(gpus),
                "pods": "110",
            }
        },
    }


def job(nodes: int, gpus: int, **pod_spec: Any) -> dict[str, Any]:
    limits = {"cpu": "4", "memory": "16Gi"}
    if gpus:
        limits["nvidia.com/gpu"] = gpus

    def replica(n: int) -> dict[str, Any]:
        return {
            "replicas": n,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "pytorch",
                            "resources": {
                                "limits": limits,
                                "requests": {"cpu": "4", "memory": "16Gi"},
                            },
                        }
                    ],
                    **pod_spec,
                }
            },
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": specs},
    }


NODES = [node("a"), node("b")]


def test_fits():
    assert fit_problem(job(2, 8), NODES) is None
    assert fit_problem(job(4, 4), NODES) is None
    assert fit_problem(job(2, 0), NODES) is None


def test_a_pod_larger_than_any_node():
    problem = fit_problem(job(1, 16), NODES)
    assert problem == (
        "a Master pod asks nvidia.com/gpu: 16 but the largest node has 8 "
        "allocatable (got 2 eligible nodes)"
    )


def test_pods_that_fit_alone_but_not_together():
    problem = fit_problem(job(3, 8), NODES)
    assert problem is not None and "3 pods do not fit on the 2 eligible nodes together" in problem


def test_node_selector_and_taints():
    gpu_nodes = [
        node("a", labels={"pool": "a100"}),
        node("b", taints=[{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]),
    ]
    assert fit_problem(job(1, 8, nodeSelector={"pool": "h100"}), gpu_nodes) is not None
    assert fit_problem(job(2, 8), gpu_nodes) is not None  # b's taint is not tolerated
    tolerate = [{"key": "gpu", "operator": "Exists"}]
    assert fit_problem(job(2, 8, tolerations=tolerate), gpu_nodes) is None


def test_gpu_nodes_tainted_with_the_resource_name_take_the_pods_that_ask_it():
    """GPU nodes tainted nvidia.com/gpu (as GKE's and the local cluster's are) beside a CPU node:
    the API server's ExtendedResourceToleration gives a pod that asks nvidia.com/gpu the
    toleration, so the check counts those nodes for GPU pods, and only for them."""
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [node("cpu", gpus=0), node("g0", taints=[taint]), node("g1", taints=[taint])]
    assert fit_problem(job(2, 0), nodes) is None  # CPU pods: the untainted node
    assert fit_problem(job(2, 8), nodes) is None  # GPU pods: the tainted GPU nodes
    assert fit_problem(job(3, 0), nodes[1:]) is not None  # CPU pods never go there
    problem = fit_problem(job(1, 16), nodes)
    assert problem == (
        "a Master pod asks nvidia.com/gpu: 16 but the largest node has 8 allocatable "
        "(got 3 eligible nodes)"
    )
    selected = fit_problem(job(1, 8, nodeSelector={"pool": "x"}), [node("a", labels={})])
    assert selected is not None and selected.startswith("no node matches")


def test_gpu_nodes_tainted_another_way_are_named_when_not_tolerated():
    """A taint of another name (AKS's sku=gpu) is the user's to tolerate, and the check says so."""
    taint = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}
    nodes = [node("cpu", gpus=0), node("g0", taints=[taint]), node("g1", taints=[taint])]
    problem = fit_problem(job(1, 8), nodes)
    assert problem == (
        "a Master pod asks nvidia.com/gpu: 8 but the largest node has 0 allocatable (got 1 "
        "eligible nodes); 2 nodes with enough are tainted sku=gpu:NoSchedule, "
        "which the pods do not tolerate (add it to tolerations)"
    )
    tolerate = [{"key": "sku", "operator": "Exists", "effect": "NoSchedule"}]
    assert fit_problem(job(2, 8, tolerations=tolerate), nodes) is None


class FakeCluster:
    """Answers what doctor asks; ``probe`` is what a dry-run create raises (None = accepted)."""

    server = "https://example:6443"

    def __init__(
        self,
        *,
        operator_pods=(),
        probe=None,
        allowed=True,
        served=("pytorchjobs", "jobsets"),
        runtimes=None,
    ):
        self.operator_pods, self.probe, self.allowed, self.served = (
            list(operator_pods),
            probe,
            allowed,
            set(served),
        )
        self.runtimes = runtimes or {}
        self.probed = []

    def version(self):
        return {"gitVersion": "v1.31.0"}

    def job_api_served(self, api):
        return api.plural in self.served

    def get_cluster_object(self, api, name):
        from controller.errors import NotFound

        if name not in self.runtimes:
            raise NotFound(f"get: {api.kind} {name} not found", reason="NotFound")
        return self.runtimes[name]

    def can_i(self, verb, resource, **_):
        return self.allowed, ""

    def list_pods_all_namespaces(self, selector):
        return self.operator_pods

    def create_job(self, manifest, dry_run=False):
        self.probed.append(manifest)
        if self.probe is not None:
            raise self.probe
        return manifest

    def list_nodes(self):
        return NODES


def _by_name(checks):
    return {c.name: c for c in checks}


def test_operator_found_by_its_ready_pod():
    from controller.jobs.doctor import run_checks

    pod = {
        "metadata": {"name": "training-operator-x", "namespace": "kubeflow"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    checks = _by_name(run_checks(FakeCluster(operator_pods=[pod]), "default"))
    assert checks["training operator"].status == "ok"
    assert "kubeflow/training-operator-x is Ready" in checks["training operator"].detail


def _api_error(status: int, message: str):
    """What the API layer raises for an HTTP error with this status and message."""
    import json

    from controller.kube.client import translate
    from controller.kube.transport import ApiError

    body = json.dumps({"kind": "Status", "message": message, "details": {}})
    e = ApiError(status, "x", body.encode())
    return translate(e, "submit", "PyTorchJob default/ddpjob-doctor-probe", "https://x")


def test_operator_down_when_its_webhook_does_not_answer():
    from controller.jobs.doctor import run_checks

    down = _api_error(500, 'failed calling webhook "validator": connection refused')
    checks = _by_name(run_checks(FakeCluster(probe=down), "default"))
    assert checks["training operator"].status == "FAIL"
    denied = _api_error(
        403,
        'admission webhook "v" denied the request: '
        "spec.pytorchReplicaSpecs[Master].replicas: must be 1",
    )
    checks = _by_name(run_checks(FakeCluster(probe=denied), "default"))
    assert checks["training operator"].status == "ok"
    checks = _by_name(run_checks(FakeCluster(), "default"))  # no webhook installed
    assert checks["training operator"].status == "warn"


def test_missing_crd_stops_the_checks_and_says_what_to_install():
    from controller.jobs.doctor import run_checks

    checks = run_checks(FakeCluster(served=()), "default")
    assert [(c.name, c.status) for c in checks] == [
        ("cluster reachable", "ok"),
        ("PyTorchJob CRD", "FAIL"),
        ("TrainJob CRD", "FAIL"),
    ]
    assert "Install the Kubeflow training operator" in checks[1].detail
    assert "Install Kubeflow Trainer v2.3.0" in checks[2].detail


def test_rbac_lists_every_missing_verb_and_a_job_that_cannot_fit_fails():
    from controller.jobs.doctor import run_checks

    checks = _by_name(run_checks(FakeCluster(allowed=False), "ml", job(1, 16)))
    assert checks["RBAC (PyTorchJob)"].status == "FAIL"
    assert "create pytorchjobs (for submit)" in checks["RBAC (PyTorchJob)"].detail
    assert checks["RBAC (nodes)"].status == "warn"
    assert checks["job accepted"].status == "warn"  # no permission to dry-run
    assert checks["job fits"].status == "FAIL" and "--force" in checks["job fits"].detail


# ---------------------------------------------------------------------------------------------
# Both APIs: which the cluster serves, and a TrainJob's own checks


def trainjob(nodes: int, gpus: int, runtime: str = "torch-distributed", **pod) -> dict[str, Any]:
    from controller.render.trainjob import render_trainjob
    from controller.spec import validate_spec

    spec = {
        "name": "tj",
        "namespace": "ml",
        "image": "i",
        "api": "trainjob",
        "nodes": nodes,
        "nproc_per_node": max(gpus, 1),
        "resources": {"gpus": gpus, "cpu": "4", "memory": "16Gi"},
        **pod,
    }
    if runtime != "torch-distributed":
        spec["runtime"] = runtime
    return render_trainjob(validate_spec(spec))


TORCH_RUNTIME = {
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {"containers": [{"name": "node", "image": "x"}]}
                                }
                            }
                        },
                    }
                ]
            }
        },
    }
}


def test_doctor_says_which_api_is_served_and_checks_only_those():
    from controller.jobs.doctor import run_checks

    fake = FakeCluster(served=("pytorchjobs",))
    checks = _by_name(run_checks(fake, "default"))
    assert checks["PyTorchJob CRD"].status == "ok"
    assert checks["TrainJob CRD"].status == "warn"
    assert "specs with api: trainjob cannot run here" in checks["TrainJob CRD"].detail
    assert "Trainer controller" not in checks and "RBAC (TrainJob)" not in checks

    fake = FakeCluster(served=("pytorchjobs", "trainjobs", "jobsets"))
    checks = _by_name(run_checks(fake, "default"))
    assert checks["TrainJob CRD"].status == "ok" and checks["JobSet CRD"].status == "ok"
    assert checks["RBAC (TrainJob)"].status == "ok" and checks["RBAC (PyTorchJob)"].status == "ok"
    assert checks["Trainer controller"].status == "warn"  # no pod, no webhook answered
    # The webhook probe of each API is a job of that API the webhook must refuse.
    probes = {(m["kind"], m["metadata"]["name"]) for m in fake.probed}
    assert probes == {("PyTorchJob", "ddpjob-doctor-probe"), ("TrainJob", "ddpjob-doctor-probe")}
    tj_probe = next(m for m in fake.probed if m["kind"] == "TrainJob")
    assert tj_probe["spec"]["runtimeRef"]["name"] == "ddpjob-doctor-probe-no-such-runtime"


def test_a_trainjob_on_a_cluster_without_trainer_fails_and_stops():
    from controller.jobs.doctor import run_checks

    checks = run_checks(FakeCluster(served=("pytorchjobs",)), "ml", trainjob(2, 0))
    assert [(c.name, c.status) for c in checks][-2:] == [
        ("PyTorchJob CRD", "ok"),
        ("TrainJob CRD", "FAIL"),
    ]


def test_preflight_refuses_a_spec_whose_api_is_not_served():
    from controller.errors import ClusterError
    from controller.jobs.doctor import preflight

    said = []
    with pytest.raises(ClusterError) as e:
        preflight(FakeCluster(served=("pytorchjobs",)), trainjob(2, 0), force=True, say=said.append)
    assert str(e.value).startswith(
        "submit: preflight TrainJob CRD failed: the API server does not serve "
        "trainjobs.trainer.kubeflow.org. Install Kubeflow Trainer v2.3.0"
    )


def test_trainjob_runtime_must_exist_be_torch_and_have_node():
    from controller.jobs.doctor import run_checks

    served = ("trainjobs", "jobsets")
    checks = _by_name(run_checks(FakeCluster(served=served), "ml", trainjob(2, 0)))
    assert checks["runtime"].status == "FAIL"
    assert "ClusterTrainingRuntime torch-distributed does not exist" in checks["runtime"].detail
    fake = FakeCluster(served=served, runtimes={"torch-distributed": TORCH_RUNTIME})
    checks = _by_name(run_checks(fake, "ml", trainjob(2, 0)))
    assert checks["runtime"].status == "ok", checks["runtime"]
    assert checks["job accepted"].status == "ok" and checks["job fits"].status == "ok"
    assert "PyTorchJob CRD" in checks and "RBAC (PyTorchJob)" not in checks  # its API only
    bare = {"spec": {"mlPolicy": {"torch": {}}, "template": {"spec": {"replicatedJobs": []}}}}
    fake = FakeCluster(served=served, runtimes={"mine": bare})
    checks = _by_name(run_checks(fake, "ml", trainjob(2, 0, runtime="mine")))
    assert (
        checks["runtime"].status == "FAIL"
        and "no replicated job `node`" in checks["runtime"].detail
    )


def test_jobset_missing_is_a_failure_for_trainjobs():
    from controller.jobs.doctor import run_checks

    checks = _by_name(run_checks(FakeCluster(served=("trainjobs",)), "default"))
    assert checks["JobSet CRD"].status == "FAIL"


def test_trainjob_fit_counts_num_nodes_pods_of_resources_per_node():
    assert fit_problem(trainjob(2, 8), NODES) is None
    problem = fit_problem(trainjob(3, 8), NODES)
    assert problem is not None and "3 pods do not fit on the 2 eligible nodes together" in problem
    problem = fit_problem(trainjob(1, 16, nproc_per_node=1), NODES)
    assert problem == (
        "a node pod asks nvidia.com/gpu: 16 but the largest node has 8 allocatable "
        "(got 2 eligible nodes)"
    )
    tainted = [node("a", taints=[{"key": "gpu", "value": "x", "effect": "NoSchedule"}])]
    assert "no node matches" in fit_problem(trainjob(1, 1), tainted)
    tolerated = trainjob(1, 1, tolerations=[{"key": "gpu", "operator": "Exists"}])
    assert fit_problem(tolerated, tainted) is None


def test_a_job_shipping_its_workdir_in_a_configmap_checks_it_may_create_one():
    """The ConfigMap road needs `create configmaps` (submit makes it after the job); the store
    road and a job without a workdir need nothing of ConfigMaps."""
    from controller.jobs.doctor import run_checks
    from controller.render.job import render_job
    from controller.spec import validate_spec
    from controller.workdir import Shipped

    class OnlyNoConfigMaps(FakeCluster):
        def can_i(self, verb, resource, **_):
            return resource != "configmaps", ""

    spec = validate_spec({"name": "wd", "namespace": "ml", "image": "i", "workdir": "."})
    digest = "sha256:" + "0" * 64
    in_map = render_job(spec, Shipped(digest, config_map="wd-workdir"))
    checks = _by_name(run_checks(OnlyNoConfigMaps(operator_pods=[]), "ml", in_map))
    assert checks["workdir"].status == "FAIL"
    assert checks["workdir"].detail.startswith(
        "in namespace ml the current user may not create configmaps (for submit with a workdir)"
    )
    assert _by_name(run_checks(FakeCluster(), "ml", in_map))["workdir"].status == "ok"
    in_store = render_job(spec, Shipped(digest, url="s3://b/p/x.tar.gz"))
    assert "workdir" not in _by_name(run_checks(OnlyNoConfigMaps(), "ml", in_store))


# ---------------------------------------------------------------------------------------------
# The model state per rank: does a built-in task's training state fit the GPUs it asks?

#: The lm task at 6.4 B parameters (32 blocks of width 4096).
BIG_LM = {"task": "lm", "task_args": {"n_layer": 32, "n_embd": 4096, "n_head": 32}}


def _spec(strategy: str, nodes: int, gpu_memory: str | None = "80Gi", **trainer: Any):
    from controller.spec import validate_spec

    resources = {"gpus": 8, "gpu_memory": gpu_memory} if gpu_memory else {"gpus": 8}
    return validate_spec(
        {
            "name": "big",
            "image": "repo/trainer:1",
            "nodes": nodes,
            "nproc_per_node": 8,
            "resources": resources,
            "trainer": {**BIG_LM, "strategy": strategy, **trainer},
        }
    )


def test_the_model_state_check_warns_when_a_rank_cannot_hold_it_and_says_what_would():
    from controller.jobs.doctor import spec_checks

    (ddp,) = spec_checks(_spec("ddp", 1))
    assert ddp.status == "warn"
    assert ddp.detail == (
        "96 GiB (6.4B parameters x 16 bytes on every rank, strategy ddp): more than 80% of a "
        "80 GiB GPU (64 GiB). Use strategy fsdp over at least 2 GPUs, or a smaller model"
    )
    (fsdp,) = spec_checks(_spec("fsdp", 1))  # 8 ranks share it
    assert fsdp.status == "ok"
    assert fsdp.detail.startswith("12 GiB (6.4B parameters x 16 bytes/8 ranks, strategy fsdp)")
    (ema,) = spec_checks(_spec("fsdp", 1, gpu_memory="16Gi", ema_decay=0.999))
    assert ema.status == "warn" and "x 20 bytes/8 ranks" in ema.detail
    assert ema.detail.endswith(
        "Shard it over at least 10 GPUs (nodes x nproc_per_node), or a smaller model"
    )
    (whole,) = spec_checks(_spec("fsdp", 1, grad_accum=4))  # whole gradients between steps
    assert whole.status == "ok" and whole.detail.startswith(
        "36 GiB (6.4B parameters x 16 bytes/8 ranks, + 4 bytes of whole gradients while "
        "accumulating, strategy fsdp)"
    )
    (tight,) = spec_checks(_spec("fsdp", 1, gpu_memory="40Gi", grad_accum=4))
    assert tight.status == "warn" and tight.detail.endswith(
        "Shard it over at least 13 GPUs (nodes x nproc_per_node), or set "
        "fsdp.reduce_each_micro_batch, or a smaller model"
    )
    (unknown,) = spec_checks(_spec("ddp", 1, gpu_memory=None))
    assert unknown.status == "ok" and unknown.detail.endswith(
        "set resources.gpu_memory to check that it fits"
    )
    assert spec_checks(_spec("ddp", 1, task="tests.trainer.tasks:build", task_args={})) == []


def test_preflight_says_the_model_state_warning_and_submits():
    from controller.jobs.doctor import preflight, spec_checks
    from controller.render.job import render_job

    spec = _spec("ddp", 1)
    said: list[str] = []
    preflight(
        FakeCluster(), render_job(spec), force=False, say=said.append, spec_checks=spec_checks(spec)
    )
    assert said[0].startswith("preflight [warn] model state: 96 GiB")
    assert said[-1] == "preflight: ok (8 checks)"  # a warning: the job is submitted
