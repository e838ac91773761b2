"""A job's state as the commands show it: ``status``'s dict, and the story of a failed job.

These read the cluster (job, pods, events, logs) and return plain data or text; printing is the
CLI's.
"""

from __future__ import annotations

from typing import Any

from controller.errors import ClusterError, JobFailed
from controller.jobs.explain import (
    age,
    condition_message,
    explain_failure,
    is_elastic,
    job_condition,
    job_terminal,
    latest_progress,
    pending_reason,
    replica_rows,
    sort_events,
)
from controller.jobs.rank0 import rank0_pod
from controller.kube.client import Cluster
from controller.kubeflow import CONTAINER, LABEL_JOB_NAME

#: Log lines shown for a failed replica.
DEFAULT_TAIL_LINES = 20


def job_status(cluster: Cluster, name: str, namespace: str) -> dict[str, Any]:
    """Everything ``status`` shows, as one JSON-ready dict."""
    job = cluster.get_job(name, namespace)
    pods = cluster.list_pods(namespace, f"{LABEL_JOB_NAME}={name}")
    cond = job_condition(job)
    out: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "condition": cond,
        "message": condition_message(job, cond),
        "age": age(job["metadata"].get("creationTimestamp")),
        "replicas": [r.as_dict() for r in replica_rows(pods)],
        "progress": None,
        "pending": [],
    }
    waiting = [p for p in pods if p.get("status", {}).get("phase") == "Pending"]
    have = {p["metadata"]["name"] for p in pods}
    missing = [
        f"{name}-{rtype.lower()}-{i}"
        for rtype, rspec in job.get("spec", {}).get("pytorchReplicaSpecs", {}).items()
        for i in range(int(rspec.get("replicas", 1)))
        if f"{name}-{rtype.lower()}-{i}" not in have
    ]
    if cond in ("Succeeded", "Failed"):
        missing = []
    if waiting or missing:
        events = cluster.list_events(namespace)
        mine = [e for e in events if e.get("involvedObject", {}).get("name", "").startswith(name)]
        for pod in waiting:
            reason = pending_reason(pod, mine)
            out["pending"].append({"pod": pod["metadata"]["name"], "reason": reason})
        job_events = [e for e in mine if e.get("involvedObject", {}).get("name") == name]
        for pod_name in missing:  # the operator could not create it: the job's events say why
            about = [e for e in job_events if pod_name in (e.get("message") or "")]
            reason = pending_reason(None, about or job_events) or "not created yet"
            out["pending"].append({"pod": pod_name, "reason": f"no pod: {reason}"})
    # Progress from rank 0's latest events: the Master's log, or in an elastic job the log of
    # the worker the rendezvous made rank 0 (found by its events).
    rank0, tail = rank0_pod(cluster, namespace, job, tail_lines=200)
    out["rank0_pod"] = rank0["metadata"]["name"] if rank0 is not None else None
    out["elastic"] = is_elastic(job)
    if rank0 is not None and rank0.get("status", {}).get("phase") != "Pending":
        try:
            if tail is None:
                text = cluster.read_log(
                    rank0["metadata"]["name"], namespace, container=CONTAINER, tail_lines=200
                )
                tail = text.splitlines()
            out["progress"] = latest_progress(tail)
        except ClusterError:
            pass
    return out


def outcome(cluster: Cluster, job: dict[str, Any], namespace: str) -> str:
    """The line for a Succeeded job; raise JobFailed with the failing replica's story."""
    name = job["metadata"]["name"]
    if job_terminal(job) == "Succeeded":
        started = job.get("status", {}).get("startTime") or job["metadata"].get("creationTimestamp")
        took = age(started) if started else "?"
        return f"job {namespace}/{name} Succeeded (started {took} ago)"
    pods = cluster.list_pods(namespace, f"{LABEL_JOB_NAME}={name}")
    raise JobFailed(failure_report(cluster, job, pods, namespace))


def failure_report(
    cluster: Cluster, job: dict[str, Any], pods: list[dict[str, Any]], namespace: str
) -> str:
    """Which replica failed, its exit code and reason, and its last log lines."""
    failure = explain_failure(job, pods)
    if failure.pod is not None:
        try:
            text = cluster.read_log(
                failure.pod,
                namespace,
                container=CONTAINER,
                tail_lines=DEFAULT_TAIL_LINES,
                previous=failure.previous,
            )
            failure.last_lines = text.splitlines()[-DEFAULT_TAIL_LINES:]
        except ClusterError as e:
            failure.last_lines = [f"(log unavailable: {e})"]
    text = failure.render(f"{namespace}/{job['metadata']['name']}")
    # Replicas that died earlier with a retryable code were deleted and re-created by the
    # operator, so no pod shows them; its ExitedWithCode events still do (often the cause).
    try:
        events = cluster.list_events(namespace)
    except ClusterError:
        return text
    earlier = [
        " ".join((e.get("message") or "").split())
        for e in sort_events(events)
        if e.get("reason") == "ExitedWithCode"
        and e.get("involvedObject", {}).get("name") == job["metadata"]["name"]
        and not (failure.pod and f".{failure.pod} " in (e.get("message") or ""))
    ]
    if earlier:
        text += "\nbefore that, retried by the operator:\n" + "\n".join(f"  {m}" for m in earlier)
    return text
