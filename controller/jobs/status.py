"""A job's state as the commands show it: ``status``'s dict, and the story of a failed job.

These read the cluster (job, pods, events, logs) and return plain data or text; printing is the
CLI's.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from controller.errors import ClusterError, JobFailed
from controller.jobs.find import find_job
from controller.jobs.goodput import read_goodput
from controller.jobs.queue import read_queue
from controller.jobs.rank0 import rank0_pod
from controller.jobs.read.apis import JobKind
from controller.jobs.read.checkpoints import last_checkpoint
from controller.jobs.read.explain import (
    age,
    explain_failure,
    is_elastic,
    job_kind,
    log_excerpt,
    replica_rows,
    sort_events,
)
from controller.jobs.read.history import DEFAULT_TAIL_LINES, READ_TAIL_LINES, RunHistory
from controller.jobs.read.loglines import split_timestamp
from controller.jobs.read.trainer_events import TrainerEvents
from controller.jobs.read.view import JobView
from controller.jobs.read.why import not_started, pending
from controller.kube.client import Cluster
from trainer.contract import MLFLOW_TRACKING_URI, TRACKING

#: Rank 0's log lines read for its progress and last checkpoint; the lines read further back
#: for a checkpoint when those have none.
TAIL_LINES = 200
CHECKPOINT_LINES = 5000


def job_status(
    cluster: Cluster,
    name: str,
    namespace: str,
    api: str | None = None,
    price_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """Everything ``status`` shows, as one JSON-ready dict (either API; ``api`` narrows the
    lookup; ``price_per_gpu_hour`` adds the cost to its goodput).

    Reads first (the job, its pods, the namespace's events when a pod waits or is missing, its
    Kueue queue, rank 0's log tail), into the job's view; then says what the view shows."""
    kind, job = find_job(cluster, name, namespace, api, where="status")
    view = JobView.of(kind, job, cluster.list_pods(namespace, kind.pods_selector(name)))
    if any(not_started(view)):  # the events say why
        view.see_events(cluster.list_events(namespace))
    queue = read_queue(cluster, job)  # None for a job without a Kueue queue
    # Progress from rank 0's latest events: its pod's log (a Master, node 0 of a TrainJob), or
    # in an elastic job the log of the worker the rendezvous made rank 0 (found by its events).
    rank0, tail = rank0_pod(cluster, namespace, job, kind, tail_lines=TAIL_LINES)
    checkpoint = tracking = None
    if rank0 is not None and rank0.get("status", {}).get("phase") != "Pending":
        pod = rank0["metadata"]["name"]
        try:
            if tail is None:
                tail = _read_tail(cluster, pod, namespace, kind, TAIL_LINES)
            view.trainer.see_lines([split_timestamp(line)[1] for line in tail], pod=pod)
            checkpoint = _last_checkpoint(cluster, pod, namespace, kind, tail)
            tracking = _tracking(cluster, rank0, namespace, kind, tail, view)
        except ClusterError:
            pass
    cond = view.condition
    # What its wall time went to so far (controller.jobs.read.goodput).
    goodput = read_goodput(
        cluster,
        kind,
        job,
        pods=view.pod_list(),
        trainer=view.trainer,
        price_per_gpu_hour=price_per_gpu_hour,
    )
    return {
        "name": name,
        "namespace": namespace,
        "api": kind.name,
        "kind": kind.api.kind,
        "condition": cond,
        "message": kind.condition_message(job, cond),
        "age": age(job["metadata"].get("creationTimestamp")),
        "replicas": [r.as_dict() for r in replica_rows(view.pod_list())],
        "progress": view.trainer.progress(),
        # Rank 0's newest checkpoint event, or the checkpoint its run resumed from.
        "checkpoint": checkpoint,
        # Rank 0's experiment tracker: its run and the run's URL (a `tracking` event).
        "tracking": tracking,
        # What ails it while it runs: rank 0's verdict on a rank the others wait for, and the
        # ranks that lag (from rank 0's log tail, as the progress).
        "stuck": view.trainer.stuck() if view.terminal is None else None,
        "stragglers": view.trainer.stragglers() if view.terminal is None else [],
        # What the job's own status says (a TrainJob's trainerStatus, posted by rank 0).
        "reported_progress": kind.reported_progress(job),
        "pending": pending(view),
        "queue": queue.as_dict() if queue is not None else None,
        "rank0_pod": rank0["metadata"]["name"] if rank0 is not None else None,
        "elastic": is_elastic(job),
        "goodput": goodput,
    }


def _read_tail(cluster: Cluster, pod: str, namespace: str, kind: JobKind, lines: int) -> list[str]:
    """The last ``lines`` lines of a pod's training container, each with its timestamp."""
    text = cluster.read_log(
        pod, namespace, container=kind.container, tail_lines=lines, timestamps=True
    )
    return text.splitlines()


def _last_checkpoint(
    cluster: Cluster, pod: str, namespace: str, kind: JobKind, tail: list[str]
) -> dict[str, Any] | None:
    """Rank 0's last checkpoint from its log ``tail``; read further back when the tail has none
    and is full (a run that logs many lines between checkpoints)."""
    now = datetime.now(timezone.utc)
    found = last_checkpoint(tail, now)
    if found is None and len(tail) >= TAIL_LINES:
        found = last_checkpoint(_read_tail(cluster, pod, namespace, kind, CHECKPOINT_LINES), now)
    return found


def _tracking(
    cluster: Cluster,
    rank0: dict[str, Any],
    namespace: str,
    kind: JobKind,
    tail: list[str],
    view: JobView,
) -> dict[str, Any] | None:
    """Rank 0's newest ``tracking`` event: from the tail it read, else (for a job whose pod is
    told where to track: MLflow's variable or the trainer setting) from further back."""
    found = view.trainer.newest(TRACKING)
    if found is not None or not _tracks(rank0, kind) or len(tail) < TAIL_LINES:
        return found
    pod = rank0["metadata"]["name"]
    events = TrainerEvents()
    lines = _read_tail(cluster, pod, namespace, kind, CHECKPOINT_LINES)
    events.see_lines([split_timestamp(line)[1] for line in lines])
    return events.newest(TRACKING)


def _tracks(pod: dict[str, Any], kind: JobKind) -> bool:
    """Whether the pod's training container is told where to track its run."""
    for c in pod.get("spec", {}).get("containers", []):
        if c.get("name") == kind.container:
            names = {e.get("name") for e in c.get("env") or []}
            args = c.get("args") or []
            return MLFLOW_TRACKING_URI in names or any(
                a.startswith("mlflow.tracking_uri=") for a in args
            )
    return False


def outcome(
    cluster: Cluster, job: dict[str, Any], namespace: str, seen: RunHistory | None = None
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
    seen: RunHistory | None = None,
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
