"""Will the job ever schedule? The preflight's fit check on API dicts, without a cluster."""

from __future__ import annotations

from typing import Any

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
    return {"spec": {"pytorchReplicaSpecs": specs}}


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


class FakeCluster:
    """Answers what doctor asks; ``probe`` is what a dry-run create raises (None = accepted)."""

    server = "https://example:6443"

    def __init__(self, *, operator_pods=(), probe=None, allowed=True, served=True):
        self.operator_pods, self.probe, self.allowed, self.served = (
            list(operator_pods),
            probe,
            allowed,
            served,
        )

    def version(self):
        return {"gitVersion": "v1.31.0"}

    def job_api_served(self):
        return self.served

    def can_i(self, verb, resource, **_):
        return self.allowed, ""

    def list_pods_all_namespaces(self, selector):
        return self.operator_pods

    def create_job(self, manifest, dry_run=False):
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
    """What the API layer raises for an ApiException with this status and message."""
    import json

    from kubernetes.client.exceptions import ApiException

    from controller.kube.client import translate

    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"kind": "Status", "message": message, "details": {}})
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

    checks = run_checks(FakeCluster(served=False), "default")
    assert [c.status for c in checks] == ["ok", "FAIL"]
    assert "Install the Kubeflow training operator" in checks[-1].detail


def test_rbac_lists_every_missing_verb_and_a_job_that_cannot_fit_fails():
    from controller.jobs.doctor import run_checks

    checks = _by_name(run_checks(FakeCluster(allowed=False), "ml", job(1, 16)))
    assert checks["RBAC"].status == "FAIL"
    assert "create pytorchjobs (for submit)" in checks["RBAC"].detail
    assert checks["RBAC (nodes)"].status == "warn"
    assert checks["job accepted"].status == "warn"  # no permission to dry-run
    assert checks["job fits"].status == "FAIL" and "--force" in checks["job fits"].detail
