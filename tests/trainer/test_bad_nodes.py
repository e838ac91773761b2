"""The record of a job's faults by node, and the patch that keeps its next pods off a node that
had ``avoid_node_after`` of them (``trainer.health.nodes``): its rules here, on dicts; a lost
rank named by rank 0 in a real 2-rank run; the patch applied by a real API server and honoured by
the real scheduler in tests/e2e/test_heal.py."""

from __future__ import annotations

import json

from trainer.contract import AVOIDED_NODES_ANNOTATION, NODE_FAULTS_ANNOTATION, read_node_faults
from trainer.health.nodes import add_fault, avoid_affinity, job_patch, to_avoid


def _fault(node: str, run: str, rank: int = 1) -> dict:
    return {"node": node, "rank": rank, "pod": f"p{rank}", "cause": "stuck", "at": 1.0, "run": run}


def test_a_node_is_avoided_once_it_had_the_configured_faults_one_per_run() -> None:
    faults: list[dict] = []
    faults = add_fault(faults, _fault("a", "r1", rank=1))
    faults = add_fault(faults, _fault("a", "r1", rank=2))  # two ranks of one pod, one run: one
    assert len(faults) == 1 and to_avoid(faults, 2) == []
    faults = add_fault(faults, _fault("b", "r2"))
    faults = add_fault(faults, _fault("a", "r3"))
    assert to_avoid(faults, 2) == ["a"] and to_avoid(faults, 1) == ["a", "b"]
    assert to_avoid(faults, 0) == []  # 0: never


def test_the_record_keeps_the_newest_faults() -> None:
    faults: list[dict] = []
    for i in range(100):
        faults = add_fault(faults, _fault(f"n{i}", f"r{i}"))
    assert len(faults) == 64 and faults[-1]["node"] == "n99" and faults[0]["node"] == "n36"


def test_a_pytorchjobs_patch_records_the_faults_and_gives_every_replica_the_affinity() -> None:
    job = {
        "metadata": {"resourceVersion": "42", "annotations": {"keep": "me"}},
        "spec": {"pytorchReplicaSpecs": {"Master": {}, "Worker": {}}},
    }
    faults = [_fault("a", "r1"), _fault("a", "r2")]
    patch, why_not = job_patch("pytorchjob", job, faults, ["a"])
    assert why_not is None
    assert patch["metadata"]["resourceVersion"] == "42"  # a concurrent change is a conflict
    annotations = patch["metadata"]["annotations"]
    assert json.loads(annotations[NODE_FAULTS_ANNOTATION]) == faults
    assert json.loads(annotations[AVOIDED_NODES_ANNOTATION]) == ["a"]
    replicas = patch["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    affinity = replicas["Worker"]["template"]["spec"]["affinity"]
    (term,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "weight": 100,
        "preference": {
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}]
        },
    }
    assert affinity == avoid_affinity(["a"])
    job["metadata"]["annotations"] |= annotations
    assert read_node_faults(job) == (faults, ["a"])


def test_a_trainjob_or_a_queued_job_records_the_faults_and_says_why_its_pods_stay() -> None:
    faults = [_fault("a", "r1"), _fault("a", "r2")]
    patch, why_not = job_patch("trainjob", {"metadata": {}}, faults, ["a"])
    assert "spec" not in patch and AVOIDED_NODES_ANNOTATION not in patch["metadata"]["annotations"]
    assert why_not.startswith("a TrainJob's pods restart in place")
    queued = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}, "spec": {}}
    patch, why_not = job_patch("pytorchjob", queued, faults, ["a"])
    assert "spec" not in patch and why_not.startswith("Kueue re-queues")
    assert json.loads(patch["metadata"]["annotations"][NODE_FAULTS_ANNOTATION]) == faults


def test_faults_that_are_not_a_list_of_records_read_as_none() -> None:
    for raw in ("not json", '{"a": 1}', "[1, 2]"):
        job = {"metadata": {"annotations": {NODE_FAULTS_ANNOTATION: raw}}}
        assert read_node_faults(job) == ([], [])
    assert read_node_faults({"metadata": {}}) == ([], [])
