"""Render a JobSpec into the Kubeflow PyTorchJob (kubeflow.org/v1) the training operator runs.

Pure: the same spec gives the same dict, key order included. No clock, no randomness, no API.
The Helm chart (charts/ddpjob) renders the identical object from ``render --values``; a test holds
them equal. Shape decisions, with the operator source they follow:

- Replicas: a ``Master`` (1) and ``nodes - 1`` ``Worker`` (omitted when nodes == 1). The operator
  injects MASTER_ADDR/RANK/WORLD_SIZE only when a Master exists.
- Elastic: ``Worker`` replicas only (= nodes), no Master. The operator's rendezvous endpoint is
  ``<name>-worker-0:<pytorchjob-port>`` and min/maxReplicas (and its HPA / scale subresource)
  count Worker pods, so a Master would sit outside the elastic range. ``elasticPolicy`` carries
  minReplicas, maxReplicas, rdzvBackend c10d and maxRestarts; *not* ``nProcPerNode``: it is
  deprecated and the operator's webhook rejects it beside ``spec.nprocPerNode``.
- ``spec.nprocPerNode`` is a string (the v1 field is ``*string``).
- No key ever carries null: optional fields are left out.
- The pod template (container, resources, env, volumes, security context) is ``pod.py``'s; the
  trainer settings become args in ``args.py``. The Master runs rank 0: only its template mounts
  the ``rank0_only`` volumes (an elastic job, whose rank 0 the rendezvous picks, has none).
"""

from __future__ import annotations

from typing import Any

from controller.kubeflow import PYTORCHJOB
from controller.render.pod import job_metadata, pod_priority_class, pod_template, suspended
from controller.spec import JobSpec


def render_pytorchjob(spec: JobSpec) -> dict[str, Any]:
    """The PyTorchJob for ``spec`` as a plain dict, ready for ``yaml.safe_dump`` or the API."""
    return {
        "apiVersion": PYTORCHJOB.api_version,
        "kind": PYTORCHJOB.kind,
        "metadata": job_metadata(spec),
        "spec": job_spec(spec),
    }


def job_spec(spec: JobSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"runPolicy": run_policy(spec)}
    if spec.elastic:
        out["elasticPolicy"] = elastic_policy(spec)
    out["nprocPerNode"] = str(spec.nproc_per_node)
    out["pytorchReplicaSpecs"] = replica_specs(spec)
    return out


def run_policy(spec: JobSpec) -> dict[str, Any]:
    policy: dict[str, Any] = {
        "cleanPodPolicy": spec.pod_cleanup,
        "backoffLimit": spec.backoff_limit,
    }
    if spec.active_deadline_s is not None:
        policy["activeDeadlineSeconds"] = spec.active_deadline_s
    if spec.ttl_after_finished_s is not None:
        policy["ttlSecondsAfterFinished"] = spec.ttl_after_finished_s
    policy["suspend"] = suspended(spec)
    if spec.gang:
        default_min = spec.elastic.min_nodes if spec.elastic else spec.nodes
        scheduling: dict[str, Any] = {"minAvailable": spec.gang.min_available or default_min}
        if spec.queue:
            scheduling["queue"] = spec.queue
        if pod_priority_class(spec):
            scheduling["priorityClass"] = pod_priority_class(spec)
        policy["schedulingPolicy"] = scheduling
    return policy


def elastic_policy(spec: JobSpec) -> dict[str, Any]:
    assert spec.elastic is not None
    return {
        "minReplicas": spec.elastic.min_nodes,
        "maxReplicas": spec.elastic.max_nodes,
        "rdzvBackend": "c10d",
        "maxRestarts": spec.elastic.max_restarts,
    }


def replica_specs(spec: JobSpec) -> dict[str, Any]:
    """Master (1) + Worker (nodes - 1); elastic: Worker (nodes) only. Each gets its own template."""
    replicas: dict[str, Any] = {}
    if not spec.elastic:
        replicas["Master"] = _replica(spec, 1, rank0=True)
    if spec.worker_replicas > 0:
        replicas["Worker"] = _replica(spec, spec.worker_replicas, rank0=False)
    return replicas


def _replica(spec: JobSpec, count: int, rank0: bool) -> dict[str, Any]:
    # A fresh template per replica type: shared dicts would come out as YAML anchors.
    template = pod_template(spec, rank0)
    return {"replicas": count, "restartPolicy": spec.restart_policy, "template": template}
