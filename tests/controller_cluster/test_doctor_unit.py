"""Will the job ever schedule? The preflight's fit check on API dicts, without a cluster."""

from __future__ import annotations

from typing import Any

from controller.doctor import fit_problem


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
