"""A job's state as the commands show it: ``status``'s dict, and the story of a failed job.

These read a snapshot of the job (``controller.jobs.snapshot``: the job, its pods, events, queue
and rank 0's log, each read once) and return plain data or text; printing is the CLI's.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from controller.errors import ClusterError, JobFailed
from controller.jobs.goodput import read_goodput
from controller.jobs.queue import read_queue
from controller.jobs.read.apis import JobKind
from controller.jobs.read.checkpoints import last_checkpoint
from controller.jobs.read.explain import (
    age,
    explain_failure,
    is_elastic,
    log_excerpt,
    replica_rows,
    sort_events,
)
from controller.jobs.read.history import DEFAULT_TAIL_LINES, READ_TAIL_LINES, RunHistory
from controller.jobs.read.loglines import no_log, split_timestamp
from controller.jobs.read.trainer_events import TrainerEvents
from controller.jobs.read.view import JobView
from controller.jobs.read.why import not_started, pending
from controller.jobs.read.workdir import workdir_of
from controller.jobs.snapshot import TAIL_LINES, Snapshot
from controller.kube.client import Cluster
from trainer.contract import MLFLOW_TRACKING_URI, TRACKING, read_node_faults

#: Rank 0's log lines read further back for a checkpoint when its tail has none.
CHECKPOINT_LINES = 5000


def job_status(
    cluster: Cluster,
    name: str,
    namespace: str,
    api: str | None = None,
    price_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """:func:`status_of` the job ``namespace/name`` (either API; ``api`` narrows the lookup)."""
    snap = Snapshot.find(cluster, name, namespace, api, where="status")
    return status_of(snap, price_per_gpu_hour)


def status_of(snap: Snapshot, price_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """Everything ``status`` shows, as one JSON-ready dict, read from one snapshot of the job
    (``price_per_gpu_hour`` adds the cost to its goodput): the job, its pods, the namespace's
    events (why a pod waits or is missing), its Kueue queue, rank 0's log tail (its progress,
    its verdicts, its last checkpoint), each read once."""
    kind, job = snap.kind, snap.job
    view = JobView.of(kind, job, snap.pods(), trainer=snap.trainer())
    if any(not_started(view)):  # the events say why
        view.see_events(snap.events())
    queue = read_queue(snap)  # None for a job without a Kueue queue
    # Progress from rank 0's latest events: its pod's log (a Master, node 0 of a TrainJob), or
    # in an elastic job the log of the worker the rendezvous made rank 0 (found by its events).
    rank0 = snap.rank0()
    cond = view.condition
    goodput = read_goodput(snap, price_per_gpu_hour=price_per_gpu_hour)
    return {
        "name": snap.name,
        "namespace": snap.namespace,
        "api": kind.name,
        "kind": kind.api.kind,
        "condition": cond,
        "message": kind.condition_message(job, cond),
        "age": age(job["metadata"].get("creationTimestamp")),
        "replicas": [r.as_dict() for r in replica_rows(view.pod_list())],
        "progress": view.trainer.progress(),
        # Rank 0's newest checkpoint event, or the checkpoint its run resumed from.
        "checkpoint": _last_checkpoint(snap),
        # Rank 0's experiment tracker: its run and the run's URL (a `tracking` event).
        "tracking": _tracking(snap),
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
        # What its wall time went to so far (controller.jobs.read.goodput).
        "goodput": goodput,
        # Which code it runs: its shipped workdir's digest, git commit and dirty flag.
        "workdir": workdir_of(job),
        # What the job did about itself: each time it restarted itself, and why; the nodes
        # its ranks failed on and those its next pods avoid; the slow ranks its pre-flight
        # found.
        "restarts": goodput["restarts"] if goodput else [],
        "nodes": node_faults(job),
        "preflight": view.trainer.preflight_slow(),
    }


def node_faults(job: dict[str, Any]) -> dict[str, Any]:
    """The faults the trainer recorded on ``job``, by node, and the nodes its pods avoid
    (``trainer/health/nodes.py``)."""
    faults, avoided = read_node_faults(job)
    by_node: dict[str, list[str]] = {}
    for f in faults:
        by_node.setdefault(str(f.get("node")), []).append(str(f.get("cause")))
    return {
        "avoided": avoided,
        "faults": [{"node": n, "faults": len(c), "causes": c} for n, c in by_node.items()],
    }


def _last_checkpoint(snap: Snapshot) -> dict[str, Any] | None:
    """Rank 0's last checkpoint from its log tail; read further back when the tail has none
    and is full (a run that logs many lines between checkpoints). None where the log cannot be
    read."""
    now = datetime.now(timezone.utc)
    try:
        tail = snap.tail()
        found = last_checkpoint(tail, now)
        if found is None and len(tail) >= TAIL_LINES:
            found = last_checkpoint(snap.tail(CHECKPOINT_LINES), now)
    except ClusterError:
        return None
    return found


def _tracking(snap: Snapshot) -> dict[str, Any] | None:
    """Rank 0's newest ``tracking`` event: from its log tail, else (for a job whose pod is told
    where to track: MLflow's variable or the trainer setting) from further back, the lines a
    checkpoint is looked for in too. None where the log cannot be read."""
    found = snap.trainer().newest(TRACKING)
    rank0 = snap.rank0()
    if found is not None or rank0 is None or not _tracks(rank0, snap.kind):
        return found
    try:
        if len(snap.tail()) < TAIL_LINES:
            return None
        lines = snap.tail(CHECKPOINT_LINES)
    except ClusterError:
        return None
    events = TrainerEvents()
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


def outcome(snap: Snapshot, seen: RunHistory | None = None) -> str:
    """The line for a Succeeded job; raise JobFailed with the failing replica's story."""
    job, namespace = snap.job, snap.namespace
    if snap.kind.terminal(job) == "Succeeded":
        started = snap.kind.start_time(job)
        took = age(started) if started else "?"
        return f"job {namespace}/{snap.name} Succeeded (started {took} ago)"
    raise JobFailed(failure_report(snap, seen=seen))


def failure_report(snap: Snapshot, seen: RunHistory | None = None) -> str:
    """Which replica failed, its exit code and reason, and its last log lines.

    ``seen`` holds the pods a watch saw during the run: a TrainJob's Job deletes its active
    pods when it fails, so the failed pod (restarted in place until the backoff limit) may be
    gone by now; its last state and log tail were kept when it failed.
    """
    cluster, job, kind = snap.cluster, snap.job, snap.kind
    name, namespace = snap.name, snap.namespace
    pods = snap.pods()
    if seen is not None:
        pods = seen.with_gone(pods) + seen.earlier_errors()
    failure = explain_failure(job, pods)
    kept_run = seen.run_tail(failure.run) if seen is not None else None
    if kept_run:  # kept when that run failed: the log now may hold a later run, or be gone
        failure.last_lines = kept_run
    elif failure.pod is not None:
        kept = seen.tail(failure.pod) if seen is not None else None
        try:
            text = cluster.read_log(
                failure.pod,
                namespace,
                container=failure.init_container or kind.container,
                tail_lines=READ_TAIL_LINES,
                previous=failure.previous,
            )
        except ClusterError as e:
            failure.last_lines = kept or [f"(log unavailable: {e})"]
        else:
            if no_log(text):  # the pod went as its container ended
                failure.last_lines = kept or [f"(log unavailable: {text.strip()})"]
            else:
                failure.last_lines = log_excerpt(text, DEFAULT_TAIL_LINES)
    text = failure.render(f"{namespace}/{name}")
    # Replicas that died earlier with a retryable code were deleted and re-created by the
    # operator, so no pod shows them; its ExitedWithCode events still do (often the cause).
    try:
        events = snap.events()
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
