"""Read a job, its pods and events (plain API dicts) and say what is going on.

Pure functions, no API calls: the operators' conditions are generic ("1 Worker replica(s)
failed", "jobset failed due to job node failing"), so the reason a job died or waits is read
here from the pods' container states, pod conditions and events. Either API: a job dict is read
by the adapter its apiVersion/kind names, a pod by the adapter its labels name
(``controller.jobs.read.apis``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from controller.jobs.read.apis import KINDS, PYTORCHJOB_KIND, TRAINJOB_KIND, JobKind
from controller.kubeflow import LABEL_JOBSET_NAME
from trainer.contract import EXIT_KILLED, EXIT_MEANINGS, EXIT_PEER_LOST, RETRYABLE_EXIT_CODES

#: The container runtime's reason for a container the kernel's OOM killer hit (the memory
#: cgroup went over the container's limit). It comes with any exit code: the kernel kills one
#: process (cgroup v1: the largest; cgroup v2 with the kubelet's memory.oom.group: all of them).
OOM_KILLED = "OOMKilled"


# ----------------------------------------------------------------------------------------
# The job


def job_kind(job: dict[str, Any]) -> JobKind:
    """The adapter for a job dict, by its apiVersion and kind (the API's objects always carry
    them; a dict without them is read as a PyTorchJob)."""
    for kind in KINDS.values():
        if job.get("apiVersion") == kind.api.api_version and job.get("kind") == kind.api.kind:
            return kind
    return PYTORCHJOB_KIND


def pod_kind(pod: dict[str, Any]) -> JobKind:
    """The adapter for a pod, by the labels its job's controller put on it."""
    labels = pod.get("metadata", {}).get("labels") or {}
    return TRAINJOB_KIND if LABEL_JOBSET_NAME in labels else PYTORCHJOB_KIND


def job_condition(job: dict[str, Any]) -> str:
    """The job's current state in one word: Pending, Created, Running, Suspended, Succeeded,
    Failed, Deleting (a PyTorchJob also Restarting)."""
    return job_kind(job).condition(job)


def job_terminal(job: dict[str, Any]) -> str | None:
    """ "Succeeded" or "Failed" once the job has ended, else None."""
    return job_kind(job).terminal(job)


def is_elastic(job: dict[str, Any]) -> bool:
    """Workers only, no Master: an elastic job, whose global rank 0 the rendezvous places."""
    specs = job.get("spec", {}).get("pytorchReplicaSpecs") or {}
    return bool(specs) and "Master" not in specs


def max_pods(job: dict[str, Any]) -> int:
    """The most pods the job can have at once (an elastic job's maxReplicas)."""
    spec = job.get("spec", {})
    replicas = sum(
        int(r.get("replicas", 1)) for r in (spec.get("pytorchReplicaSpecs") or {}).values()
    )
    return max(replicas, int((spec.get("elasticPolicy") or {}).get("maxReplicas") or 0))


def condition_message(job: dict[str, Any], ctype: str) -> str:
    return job_kind(job).condition_message(job, ctype)


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def age(text: str | None, now: datetime | None = None) -> str:
    """``kubectl``-style age: 45s, 3m12s, 2h5m, 3d4h."""
    start = parse_time(text)
    if start is None:
        return "-"
    s = int(((now or datetime.now(timezone.utc)) - start).total_seconds())
    s = max(s, 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


# ----------------------------------------------------------------------------------------
# Pods


def replica_name(pod: dict[str, Any]) -> str:
    """``master-0`` / ``worker-1`` (PyTorchJob), ``node-0`` / ``node-1`` (TrainJob), from the
    controllers' labels (the pod name as a fallback)."""
    return pod_kind(pod).replica_name(pod)


def node_rank(pod: dict[str, Any]) -> int:
    """The node rank of this pod: the PyTorchJob operator's RANK, the TrainJob's
    PET_NODE_RANK (its completion index)."""
    return pod_kind(pod).node_rank(pod)


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The training container's status (``pytorch`` or ``node``); {} before it has one."""
    name = pod_kind(pod).container
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        if cs.get("name") == name:
            return cs
    return {}


def has_container(pod: dict[str, Any], name: str) -> bool:
    """``pod`` runs a container ``name`` (a pod without a spec, as a test may write one, is
    taken to)."""
    containers = pod.get("spec", {}).get("containers")
    return containers is None or any(c.get("name") == name for c in containers)


def matches(selector: str, labels: dict[str, str]) -> bool:
    """``labels`` satisfy an equality-based label selector (``a=b,c=d``)."""
    pairs = (term.split("=", 1) for term in selector.split(",") if term)
    return all(labels.get(key) == value for key, value in pairs)


def memory_limit(pod: dict[str, Any]) -> str | None:
    """The training container's memory limit (``resources.memory`` of the spec), if any."""
    name = pod_kind(pod).container
    for c in pod.get("spec", {}).get("containers") or []:
        if c.get("name") == name:
            return ((c.get("resources") or {}).get("limits") or {}).get("memory")
    return None


def oom_meaning(exit_code: int | None, limit: str | None) -> str:
    """What OOMKilled means for a container that exited ``exit_code``.

    137: its main process was the one killed. Any other code: the kernel killed another process
    of the container (cgroup v1 picks the largest: with nproc_per_node > 1 a torchrun worker,
    bigger than torchrun itself), and the main process then exited with that code (torchrun
    exits 1 when a worker dies); the exit code's usual meaning does not apply.
    """
    over = f"its memory limit ({limit})" if limit else "its memory limit"
    fix = "raise resources.memory, or use less (batch_size, num_workers, nproc_per_node)"
    if exit_code == EXIT_KILLED:
        return (
            f"the container went over {over} and the kernel killed its main process (SIGKILL); "
            f"{fix}"
        )
    return (
        f"the container went over {over} and the kernel killed one of its processes (on cgroup "
        "v1 the largest: with nproc_per_node > 1 a torchrun worker), then the main process "
        f"exited {exit_code}, which here does not mean what it usually does; {fix}"
    )


def termination_meaning(pod: dict[str, Any], term: dict[str, Any]) -> str:
    """What a termination of the training container means, where its reason says more than its
    exit code (OOMKilled); "" otherwise."""
    if term.get("reason") == OOM_KILLED:
        return oom_meaning(term.get("exitCode"), memory_limit(pod))
    return ""


def last_termination(pod: dict[str, Any]) -> dict[str, Any]:
    """The trainer container's latest termination (current state, else the previous run)."""
    cs = container_status(pod)
    term = (cs.get("state") or {}).get("terminated")
    if term:
        return term
    return (cs.get("lastState") or {}).get("terminated") or {}


def termination_run(pod: dict[str, Any]) -> tuple[tuple[str, int], bool]:
    """Which container run :func:`last_termination` describes: ``(pod uid, run index)``, the
    key a run's kept log is found by, and whether it is the previous run (the container has
    restarted in place since)."""
    cs = container_status(pod)
    previous = not (cs.get("state") or {}).get("terminated") and bool(
        (cs.get("lastState") or {}).get("terminated")
    )
    uid = pod.get("metadata", {}).get("uid", "")
    return (uid, int(cs.get("restartCount", 0)) - previous), previous


def earlier_failure(pod: dict[str, Any]) -> dict[str, Any]:
    """The previous run's termination, where the container's current run has ended too and the
    previous one ended with a code no operator retries (a rank that raised); {} otherwise.

    A Job that gives up (a TrainJob's, at its backoffLimit) stops the containers it had
    restarted in place: their current run then ends 143, and the pod shows that SIGTERM with
    the failure before it only in ``lastState``."""
    cs = container_status(pod)
    if not (cs.get("state") or {}).get("terminated"):
        return {}
    term = (cs.get("lastState") or {}).get("terminated") or {}
    code = term.get("exitCode", 0)
    return term if code != 0 and code not in RETRYABLE_EXIT_CODES else {}


def earlier_failure_run(pod: dict[str, Any]) -> tuple[str, int]:
    """The ``(pod uid, run index)`` of :func:`earlier_failure`'s run: the one before the current."""
    run, _ = termination_run(pod)
    return run[0], run[1] - 1


@dataclass
class ReplicaRow:
    """One line of ``status``'s replica table."""

    replica: str
    pod: str
    phase: str
    node: str
    restarts: int
    exit_code: int | None
    reason: str
    meaning: str = ""  # what the reason means, where the exit code would mislead (OOMKilled)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def replica_rows(pods: list[dict[str, Any]]) -> list[ReplicaRow]:
    rows = []
    for pod in sorted(pods, key=node_rank):
        status = pod.get("status", {})
        term = last_termination(pod)
        phase = status.get("phase", "Unknown")
        if pod.get("metadata", {}).get("deletionTimestamp"):
            phase = "Terminating"
        reason = term.get("reason") or status.get("reason") or _waiting_reason(pod) or ""
        rows.append(
            ReplicaRow(
                replica=replica_name(pod),
                pod=pod.get("metadata", {}).get("name", "?"),
                phase=phase,
                node=pod.get("spec", {}).get("nodeName") or "-",
                restarts=int(container_status(pod).get("restartCount", 0)),
                exit_code=term.get("exitCode"),
                reason=reason,
                meaning=termination_meaning(pod, term) if term else "",
            )
        )
    return rows


def _waiting_reason(pod: dict[str, Any]) -> str:
    waiting = (container_status(pod).get("state") or {}).get("waiting") or {}
    return waiting.get("reason", "")


# ----------------------------------------------------------------------------------------
# Events (why a job waits is read from them in controller.jobs.read.why)


def event_time(e: dict[str, Any]) -> str:
    return (
        e.get("lastTimestamp")
        or e.get("eventTime")
        or e.get("firstTimestamp")
        or e.get("metadata", {}).get("creationTimestamp")
        or ""
    )


def job_events(job_name: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of a job and of what its controllers made (pods, a JobSet, a Job): all are
    named after the job."""
    return [
        e
        for e in events
        if (obj := e.get("involvedObject", {}).get("name", "")) == job_name
        or obj.startswith(f"{job_name}-")
    ]


def sort_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=event_time)


# ----------------------------------------------------------------------------------------
# Why a job failed


@dataclass
class Failure:
    """The first replica that failed and how; ``last_lines`` are filled in by the caller."""

    replica: str | None
    pod: str | None
    exit_code: int | None
    reason: str
    message: str
    restarts: int = 0
    last_lines: list[str] = field(default_factory=list)
    previous: bool = False  # the failed run is the container's previous one
    meaning: str = ""  # what the reason means beside the exit code (OOMKilled); see render
    run: tuple[str, int] | None = None  # (pod uid, run index): which container run failed
    #: The init container that failed (the pod's trainer never started).
    init_container: str | None = None

    def render(self, job_name: str) -> str:
        """The lines ``submit --wait`` / ``wait`` print for a failed job."""
        if self.pod is None:
            return f"job {job_name} Failed: {self.message or self.reason}"
        what = f"exit code {self.exit_code}" if self.exit_code is not None else "no exit code"
        meaning = self.meaning or EXIT_MEANINGS.get(self.exit_code or 0, "")
        reason = self.reason + (
            f": {meaning}" if self.meaning else f", {meaning}" if meaning else ""
        )
        where = f"init container {self.init_container} " if self.init_container else ""
        lines = [
            f"job {job_name} Failed: replica {self.replica} (pod {self.pod}) {where}{what} "
            f"({reason})"
        ]
        if self.message:
            lines.append(f"  {self.message}")
        if self.last_lines:
            of = f"{self.replica}'s {self.init_container}" if self.init_container else self.replica
            lines.append(f"last {len(self.last_lines)} log lines of {of}:")
            lines.extend(f"  | {line}" for line in self.last_lines)
        return "\n".join(lines)


#: torchrun's own error after a worker failed: its traceback ends with this exception, then a
#: summary block (which worker, exit code, no message unless the worker recorded one).
TORCHRUN_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


def log_excerpt(text: str, lines: int) -> list[str]:
    """The last ``lines`` lines of a failed container's log that say why it failed.

    Under torchrun (``nproc_per_node`` > 1, a TrainJob's pod) the log ends with torchrun's own
    traceback and summary, which name the failed worker but not its error: those are left out,
    so the excerpt ends with the worker's traceback instead."""
    all_lines = text.splitlines()
    failed = [i for i, line in enumerate(all_lines) if TORCHRUN_FAILED in line]
    if failed:
        start = max(
            (i for i in range(failed[-1]) if all_lines[i].startswith("Traceback (most recent")),
            default=None,
        )
        if start is not None and start > 0:
            return all_lines[:start][-lines:]
    return all_lines[-lines:]


def explain_failure(job: dict[str, Any], pods: list[dict[str, Any]]) -> Failure:
    """Pick the replica whose failure ended the job: the earliest non-zero termination (the
    others usually die afterwards of a broken collective), or an evicted pod. A rank that only
    lost a peer (exit 138) comes after every other failure whatever its time: it says another
    rank died first, and pods restarted in place (a TrainJob's) keep only their last run, whose
    times need not show the order of the first. A pod's run before its current one counts too
    where it raised (:func:`earlier_failure`): a give-up's SIGTERM ended the current one."""
    # (when, pod, termination, whether it is the run before the pod's current one)
    candidates: list[tuple[str, dict[str, Any], dict[str, Any], bool]] = []
    for pod in pods:
        status = pod.get("status", {})
        term = last_termination(pod)
        init = failed_init(pod)
        if init is not None and not term:  # the trainer never started: why is the init's
            finished = init["state"]["terminated"].get("finishedAt") or ""
            candidates.append((finished, pod, {**init["state"]["terminated"], "init": init}, False))
        elif status.get("reason") == "Evicted" or (status.get("phase") == "Failed" and not term):
            evicted = {
                "reason": status.get("reason") or "Failed",
                "message": status.get("message", ""),
            }
            candidates.append((status.get("startTime") or "", pod, evicted, False))
        elif term and term.get("exitCode", 0) != 0:
            candidates.append((term.get("finishedAt") or "", pod, term, False))
            earlier = earlier_failure(pod)
            if earlier:
                candidates.append((earlier.get("finishedAt") or "", pod, earlier, True))
    if not candidates:
        msg = condition_message(job, "Failed") or "no pod says why (they may have been deleted)"
        return Failure(None, None, None, "Failed", msg)
    # Ties (second-precision timestamps): a plain exit code before a signal (the others are
    # often killed after the first failure), then the lower rank.
    _, pod, term, before_current = min(
        candidates,
        key=lambda c: (
            c[2].get("exitCode") == EXIT_PEER_LOST,
            c[0],
            (c[2].get("exitCode") or 0) >= 128,
            node_rank(c[1]),
        ),
    )
    run, in_previous = termination_run(pod)
    if before_current:  # the container's previous log is that run's
        run, in_previous = earlier_failure_run(pod), True
    init = term.get("init")
    return Failure(
        replica=replica_name(pod),
        pod=pod["metadata"]["name"],
        exit_code=term.get("exitCode"),
        reason=term.get("reason") or "Error",
        message=(term.get("message") or "").strip(),
        restarts=int((init or container_status(pod)).get("restartCount", 0)),
        previous=in_previous and init is None,
        meaning=termination_meaning(pod, term),
        run=None if init else run,
        init_container=init["name"] if init else None,
    )


def failed_init(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The status of the pod's init container that ended non-zero, if one did (a user's own,
    or an operator's that gave up)."""
    for cs in pod.get("status", {}).get("initContainerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("exitCode", 0) != 0:
            return cs
    return None


# ----------------------------------------------------------------------------------------
# Progress, as the commands show it


def format_reported(ts: dict[str, Any]) -> str:
    """A TrainJob's ``status.trainerStatus`` in one line: ``45%  ETA 3m12s  loss 0.2347
    samples_per_s 120.5  (updated 8s ago)``."""
    parts = []
    if ts.get("progressPercentage") is not None:
        parts.append(f"{ts['progressPercentage']}%")
    if ts.get("estimatedRemainingSeconds") is not None:
        parts.append(f"ETA {_duration(ts['estimatedRemainingSeconds'])}")
    parts += [f"{m.get('name')} {m.get('value')}" for m in ts.get("metrics") or []]
    if ts.get("lastUpdatedTime"):
        parts.append(f"(updated {age(ts['lastUpdatedTime'])} ago)")
    return "  ".join(parts)


def format_progress(p: dict[str, Any]) -> str:
    parts = [f"step {p.get('step', '?')}/{p.get('max_steps', '?')}"]
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.4g}")
    if p.get("samples_per_s") is not None:
        parts.append(f"{p['samples_per_s']:.1f} samples/s")
    if p.get("eta_s") is not None:
        parts.append(f"ETA {_duration(p['eta_s'])}")
    return "  ".join(parts)


def _duration(s: float) -> str:
    s = round(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
