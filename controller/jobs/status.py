"""A job's state as the commands show it: ``status``'s dict, and the story of a failed job.

These read the cluster (job, pods, events, logs) and return plain data or text; printing is the
CLI's.
"""

from __future__ import annotations

from typing import Any

from controller.errors import ClusterError, JobFailed
from controller.jobs.apis import JobKind
from controller.jobs.explain import (
    age,
    explain_failure,
    is_elastic,
    job_kind,
    last_termination,
    latest_progress,
    log_excerpt,
    pod_kind,
    replica_rows,
    sort_events,
    termination_run,
)
from controller.jobs.find import find_job
from controller.jobs.queue import read_queue
from controller.jobs.rank0 import rank0_pod
from controller.jobs.why import job_events, job_waiting
from controller.kube.client import Cluster
from trainer.contract import RETRYABLE_EXIT_CODES

#: Log lines shown for a failed replica.
DEFAULT_TAIL_LINES = 20
#: Lines read for it: torchrun's traceback and summary (about 30 lines) may follow the error.
READ_TAIL_LINES = 200


class PodHistory:
    """The last state of every pod a watch saw during a run, and each failed container run: the
    pod as it was then, and its log tail, read when it failed (the pod may be deleted, or its
    container restarted in place, before the job ends)."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.tails: dict[str, list[str]] = {}  # pod name -> last lines of its failed run
        self.failed: list[dict[str, Any]] = []  # the pod as seen when a run failed, in order
        self.run_tails: dict[tuple[str, int], list[str]] = {}  # (uid, run) -> its last lines
        self._read: set[tuple[str, int]] = set()

    def see(self, cluster: Cluster, pod: dict[str, Any], namespace: str) -> None:
        """Record ``pod``; if its training container just failed, keep its log tail."""
        meta = pod.get("metadata", {})
        self.pods[meta.get("uid", meta.get("name", "?"))] = pod
        term = last_termination(pod)
        if not term or term.get("exitCode", 0) == 0:
            return
        key, previous = termination_run(pod)
        if key in self._read:
            return
        self._read.add(key)
        self.failed.append(pod)
        try:
            text = cluster.read_log(
                meta["name"],
                namespace,
                container=pod_kind(pod).container,
                tail_lines=READ_TAIL_LINES,
                previous=previous,
            )
        except ClusterError:
            return
        self.tails[meta["name"]] = self.run_tails[key] = log_excerpt(text, DEFAULT_TAIL_LINES)

    def earlier_errors(self) -> list[dict[str, Any]]:
        """The pods as they were when a run of theirs failed with a code no operator retries
        (not 130/137/138/143): a rank that raised. Restarted in place (a TrainJob's pods,
        ``restart_policy: OnFailure``), its later runs may end otherwise, and a peer's later
        failure (torchrun losing its rendezvous) may look like the first."""
        return [
            p
            for p in self.failed
            if last_termination(p).get("exitCode") not in RETRYABLE_EXIT_CODES
        ]

    def with_gone(self, live: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``live`` plus the last seen state of pods whose replica has no live pod now."""
        have = {pod_kind(p).replica_name(p) for p in live}
        gone = [
            p
            for p in self.pods.values()
            if pod_kind(p).replica_name(p) not in have
            and p.get("metadata", {}).get("uid") not in {q["metadata"].get("uid") for q in live}
        ]
        latest: dict[str, dict[str, Any]] = {}
        for p in gone:  # one per replica: the pod seen last
            latest[pod_kind(p).replica_name(p)] = p
        return [*live, *latest.values()]

    def tail(self, pod_name: str) -> list[str] | None:
        return self.tails.get(pod_name)


def job_status(
    cluster: Cluster, name: str, namespace: str, api: str | None = None
) -> dict[str, Any]:
    """Everything ``status`` shows, as one JSON-ready dict (either API; ``api`` narrows the
    lookup)."""
    kind, job = find_job(cluster, name, namespace, api, where="status")
    pods = cluster.list_pods(namespace, kind.pods_selector(name))
    cond = kind.condition(job)
    out: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "api": kind.name,
        "kind": kind.api.kind,
        "condition": cond,
        "message": kind.condition_message(job, cond),
        "age": age(job["metadata"].get("creationTimestamp")),
        "replicas": [r.as_dict() for r in replica_rows(pods)],
        "progress": None,
        # What the job's own status says (a TrainJob's trainerStatus, posted by rank 0).
        "reported_progress": kind.reported_progress(job),
        "pending": [],
    }
    out["pending"] = _pending(cluster, kind, job, pods, namespace)
    view = read_queue(cluster, job)  # None for a job without a Kueue queue
    out["queue"] = view.as_dict() if view is not None else None
    # Progress from rank 0's latest events: its pod's log (a Master, node 0 of a TrainJob), or
    # in an elastic job the log of the worker the rendezvous made rank 0 (found by its events).
    rank0, tail = rank0_pod(cluster, namespace, job, kind, tail_lines=200)
    out["rank0_pod"] = rank0["metadata"]["name"] if rank0 is not None else None
    out["elastic"] = is_elastic(job)
    if rank0 is not None and rank0.get("status", {}).get("phase") != "Pending":
        try:
            if tail is None:
                text = cluster.read_log(
                    rank0["metadata"]["name"], namespace, container=kind.container, tail_lines=200
                )
                tail = text.splitlines()
            out["progress"] = latest_progress(tail)
        except ClusterError:
            pass
    return out


def _pending(
    cluster: Cluster,
    kind: JobKind,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    namespace: str,
) -> list[dict[str, str]]:
    """Why each pending pod waits, and why each missing pod was not created (from the events
    of the objects between the job and its pods: ``TrainJobResourcesCreationFailed``,
    ``FailedCreate``, ...): ``controller.jobs.why``'s reasons, for the pods not yet running
    (a running pod's restarts are the replica table's)."""
    waiting = [p for p in pods if p.get("status", {}).get("phase") == "Pending"]
    have = {kind.replica_name(p) for p in pods}
    missing = [r for r in kind.expected_replicas(job) if r not in have]
    if kind.terminal(job) or kind.condition(job) == "Suspended":
        missing = []  # ended, or suspended on purpose: no pods is no news
    if not (waiting or missing):
        return []
    events = job_events(job["metadata"]["name"], cluster.list_events(namespace))
    reasons = job_waiting(kind, job, pods, events)
    pending = {p["metadata"]["name"] for p in waiting}
    return [
        {
            "pod": kind.pod_name_of(job["metadata"]["name"], w.subject) if w.missing else w.subject,
            "reason": w.text(),
        }
        for w in reasons
        if w.pod in pending or w.missing
    ]


def outcome(
    cluster: Cluster, job: dict[str, Any], namespace: str, seen: PodHistory | None = None
) -> str:
    """The line for a Succeeded job; raise JobFailed with the failing replica's story."""
    name = job["metadata"]["name"]
    kind = job_kind(job)
    if kind.terminal(job) == "Succeeded":
        started = kind.start_time(job)
        took = age(started) if started else "?"
        return f"job {namespace}/{name} Succeeded (started {took} ago)"
    pods = cluster.list_pods(namespace, kind.pods_selector(name))
    raise JobFailed(failure_report(cluster, job, pods, namespace, seen=seen))


def failure_report(
    cluster: Cluster,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    namespace: str,
    seen: PodHistory | None = None,
) -> str:
    """Which replica failed, its exit code and reason, and its last log lines.

    ``seen`` holds the pods a watch saw during the run: a TrainJob's Job deletes its active
    pods when it fails, so the failed pod (restarted in place until the backoff limit) may be
    gone by now; its last state and log tail were kept when it failed.
    """
    kind = job_kind(job)
    name = job["metadata"]["name"]
    if seen is not None:
        pods = seen.with_gone(pods) + seen.earlier_errors()
    failure = explain_failure(job, pods)
    kept_run = seen.run_tails.get(failure.run) if seen is not None and failure.run else None
    if kept_run:  # read when that run failed: the log now may hold a later run
        failure.last_lines = kept_run
    elif failure.pod is not None:
        try:
            text = cluster.read_log(
                failure.pod,
                namespace,
                container=kind.container,
                tail_lines=READ_TAIL_LINES,
                previous=failure.previous,
            )
            failure.last_lines = log_excerpt(text, DEFAULT_TAIL_LINES)
        except ClusterError as e:
            kept = seen.tail(failure.pod) if seen is not None else None
            failure.last_lines = kept or [f"(log unavailable: {e})"]
    text = failure.render(f"{namespace}/{name}")
    # Replicas that died earlier with a retryable code were deleted and re-created by the
    # operator, so no pod shows them; its ExitedWithCode events still do (often the cause).
    try:
        events = cluster.list_events(namespace)
    except ClusterError:
        return text
    if failure.pod is None:  # no pod says why: what the job's controllers said does
        said = [
            f"  {e.get('involvedObject', {}).get('kind', '').lower()}/"
            f"{e.get('involvedObject', {}).get('name', '')}: {e.get('reason', '')}: "
            + " ".join((e.get("message") or "").split())
            for e in sort_events(kind.build_failures(name, events))
        ]
        if said:
            text += "\nevents:\n" + "\n".join(dict.fromkeys(said))
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
