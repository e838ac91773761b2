"""What a job's wall time and GPU-hours went to, from what the cluster and the trainer saw.

The wall time runs from the job's creation to its end (its Succeeded or Failed condition), or to
now while it runs. Every moment of it goes to exactly one part:

- **queued**: Kueue held the job suspended: from its creation until Kueue started it, and from
  each eviction (a preemption) until it started it again; Kueue's ``Started`` and ``Stopped``
  events on the job, or, once those have expired, its Workload's status;
- **scheduling**: the pods were being made, scheduled and their images pulled: until the first
  run's container started, and from the current rank-0 pod's creation until its start;
- **startup**: a run's container start until its first step was done (imports, the process
  group, loading a checkpoint, compiling; the first step itself);
- **productive**, **checkpoint**, **evaluation**: a run's time after its first step, in steps,
  checkpoint stalls (what the steps waited for saves) and evaluation, as far as it was kept;
- **lost**: a run's time after the checkpoint a later run resumed from, up to the last moment it
  was known alive (its steps were trained again: ``lost_steps``);
- **other**: the rest: a run's end until its container ended, pods deleted and made again,
  restart back-offs, the job's controllers reacting.

The runs come from the trainer's newest ``goodput`` event (``trainer/health/ledger.py``): rank 0
carries the ledger of every run across restarts, since a re-created pod's earlier log is gone.
Where two parts claim a moment, the run's own account wins over the queue, the queue over
scheduling (a run still stopping after Kueue evicted it is the run's).

GPU-hours held: the job's GPUs (every pod's ``nvidia.com/gpu``) for the time it held them, from
its pods' scheduling to its end, less the time queued; useful: its GPUs for the productive time.
A job without GPUs is accounted in replica-hours instead.

Pure: the job, its pods, its events, its Workload, the trainer's event and ``now`` in; a dict out.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

from controller.jobs.read.apis import JobKind
from controller.jobs.read.workdir import code_line
from trainer.contract import RESTART

GPU = "nvidia.com/gpu"

#: The parts, in the order a job goes through them.
QUEUED, SCHEDULING, STARTUP, PRODUCTIVE = "queued_s", "scheduling_s", "startup_s", "productive_s"
CHECKPOINT, EVALUATION, LOST, OTHER = "checkpoint_s", "evaluation_s", "lost_s", "other_s"
PARTS = (QUEUED, SCHEDULING, STARTUP, PRODUCTIVE, CHECKPOINT, EVALUATION, LOST, OTHER)
#: What each part is called where a person reads it.
LABELS = {
    QUEUED: "queued",
    SCHEDULING: "scheduling and image pull",
    STARTUP: "start-up and compile",
    PRODUCTIVE: "productive steps",
    CHECKPOINT: "checkpoint stalls",
    EVALUATION: "evaluation",
    LOST: "work lost",
    OTHER: "restarts, teardown, other",
}
#: A run's parts after its first step (the ledger's names) and the part each goes to.
_IN_RUN = {
    "productive_s": PRODUCTIVE,
    "stall_s": CHECKPOINT,
    "eval_s": EVALUATION,
    "lost_s": LOST,
    "other_s": OTHER,
}
#: Kueue's events on a job it starts and stops (pkg/controller/jobframework/events.go).
KUEUE_STARTED, KUEUE_STOPPED = "Started", "Stopped"
#: A running container within this long of a run's launch is that run's (the API's times are
#: whole seconds; the trainer's are not).
SAME_RUN_S = 2.0


def epoch(text: str | None) -> float | None:
    """An API time (RFC 3339, whole or fractional seconds) in epoch seconds."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def newest_ledger(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest of the trainer's ``goodput`` events among ``events`` (dicts, in log order)."""
    found = [e for e in events if e.get("event") == "goodput" and isinstance(e.get("runs"), list)]
    return found[-1] if found else None


# ---------------------------------------------------------------------------------------------
# The job's side


def ended_at(kind: JobKind, job: dict[str, Any]) -> float | None:
    """When the job ended (its terminal condition's time), None while it runs."""
    if kind.terminal(job) is None:
        return None
    for c in job.get("status", {}).get("conditions") or []:
        if c.get("type") in kind.terminal_conditions and c.get("status") == "True":
            return epoch(c.get("lastTransitionTime"))
    return epoch(job.get("status", {}).get("completionTime"))


def gpus_per_pod(template: dict[str, Any]) -> int:
    """The GPUs a pod template's containers ask for (limits, else requests)."""
    containers = template.get("spec", {}).get("containers") or []
    return sum(_gpus(c.get("resources") or {}) for c in containers)


def _gpus(resources: dict[str, Any]) -> int:
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    return int(limits.get(GPU) or requests.get(GPU) or 0)


def job_gpus(job: dict[str, Any]) -> tuple[int, int]:
    """``(GPUs, pods)`` the job asks for: a PyTorchJob's replica specs, or a TrainJob's nodes
    times its ``resourcesPerNode``."""
    spec = job.get("spec", {})
    if "pytorchReplicaSpecs" in spec:
        gpus = pods = 0
        for rspec in spec["pytorchReplicaSpecs"].values():
            n = int(rspec.get("replicas", 1))
            pods += n
            gpus += n * gpus_per_pod(rspec.get("template") or {})
        return gpus, pods
    trainer = spec.get("trainer") or {}
    nodes = int(trainer.get("numNodes") or 1)
    return nodes * _gpus(trainer.get("resourcesPerNode") or {}), nodes


def _event_times(event: dict[str, Any]) -> tuple[list[float], bool]:
    """When an event happened: its first time and, for a repeated one, its last; and whether
    those are all of its occurrences (a series of more than two keeps only the ends)."""
    first = epoch(event.get("eventTime") or event.get("firstTimestamp"))
    series = event.get("series") or {}
    count = int(series.get("count") or event.get("count") or 1)
    last = epoch(series.get("lastObservedTime") or event.get("lastTimestamp"))
    times = [t for t in (first,) if t is not None]
    if count > 1 and last is not None and (first is None or last > first):
        times.append(last)
    return times, count == len(times)


def queue_intervals(
    job: dict[str, Any],
    events: list[dict[str, Any]],
    workload: dict[str, Any] | None,
    start: float,
    end: float,
) -> tuple[list[tuple[float, float]], float | None, str | None]:
    """When Kueue held the job suspended, and where that was read: ``(intervals, None,
    source)`` from its ``Started``/``Stopped`` events on the job (exact), else from the
    Workload's status (its last admission); for a job evicted before whose events have
    expired, only the total of its waits before the last admission is known: ``(intervals
    after it, total, source)``. ``([], None, None)`` for a job Kueue never held."""
    uid = job.get("metadata", {}).get("uid")
    marks: list[tuple[float, str]] = []
    complete = True
    for e in events:
        obj = e.get("involvedObject") or e.get("regarding") or {}
        if obj.get("uid") != uid or e.get("reason") not in (KUEUE_STARTED, KUEUE_STOPPED):
            continue
        if e["reason"] == KUEUE_STARTED and "clusterQueue" not in (e.get("message") or ""):
            continue  # not Kueue's "Admitted by clusterQueue X"
        times, whole = _event_times(e)
        complete &= whole
        marks += [(t, e["reason"]) for t in times]
    marks.sort()
    # Kueue may say one eviction twice (a TrainJob's Stopped, a quarter second apart): the state
    # changed at the first of a run of the same mark.
    marks = [m for i, m in enumerate(marks) if i == 0 or marks[i - 1][1] != m[1]]
    alternating = all(
        reason == (KUEUE_STARTED if i % 2 == 0 else KUEUE_STOPPED)
        for i, (_, reason) in enumerate(marks)
    )
    if marks and complete and alternating:
        edges = [start, *(t for t, _ in marks)]
        if marks[-1][1] == KUEUE_STOPPED:
            edges.append(end)  # suspended now
        pairs = [(edges[i], edges[i + 1]) for i in range(0, len(edges) - 1, 2)]
        return pairs, None, "kueue events"
    if workload is None:
        return [], None, None
    conds = {c.get("type"): c for c in workload.get("status", {}).get("conditions") or []}
    admitted = conds.get("Admitted", {})
    last = epoch(admitted.get("lastTransitionTime"))
    if admitted.get("status") != "True" or last is None:
        # Waiting now; since when is the eviction's time, if it was evicted.
        evicted = conds.get("Evicted", {})
        since = (
            epoch(evicted.get("lastTransitionTime")) if evicted.get("status") == "True" else None
        )
        past = workload.get("status", {}).get("accumulatedPastExecutionTimeSeconds")
        if since is None or not past:
            return [(start, end)], None, "workload status"
        return [(since, end)], max(0.0, since - start - float(past)), "workload status (total)"
    past = workload.get("status", {}).get("accumulatedPastExecutionTimeSeconds")
    if not past:
        return [(start, last)], None, "workload status"
    return [], max(0.0, last - start - float(past)), "workload status (total)"


def place_backwards(
    total: float, until: float, start: float, runs: list[dict[str, Any]]
) -> list[tuple[float, float]]:
    """``total`` seconds of waiting known only as a sum, laid into the time before ``until``
    that no run claims, latest first (a job waits in its queue between runs, never in one)."""
    spans = sorted((r["launched_at"], r["ended_at"]) for r in runs)
    out, t = [], until
    for a, b in reversed([(a, b) for a, b in spans if a < until]):
        if total <= 0:
            break
        gap_start = max(b, start)
        if gap_start < t:
            take = min(total, t - gap_start)
            out.append((t - take, t))
            total -= take
        t = min(t, a)
    if total > 0 and t > start:
        out.append((max(start, t - total), t))
    return out


# ---------------------------------------------------------------------------------------------
# The sweep


def _timeline(
    runs: list[dict[str, Any]],
    queued: list[tuple[float, float]],
    scheduling: list[tuple[float, float]],
    unbound: tuple[float, float] | None,
    start: float,
    end: float,
) -> dict[Any, float]:
    """Seconds of ``[start, end]`` under each label, each moment to the label of highest
    priority that claims it: a run's start-up ``("startup", i)`` or its time after the first
    step ``("run", i)``, then ``"queued"``, then ``"scheduling"`` (``"unbound"`` within
    ``unbound``), else ``"other"``."""
    claims: list[tuple[int, Any, float, float]] = []
    for i, run in enumerate(runs):
        launched, first, last = run["launched_at"], run["first_step_at"], run["ended_at"]
        if first is None:
            claims.append((0, ("startup", i), launched, last))
        else:
            claims += [(0, ("startup", i), launched, first), (0, ("run", i), first, last)]
    claims += [(1, "queued", a, b) for a, b in queued]
    claims += [(2, "scheduling", a, b) for a, b in scheduling]
    if unbound is not None:  # scheduling before the pods were bound: they held no GPU yet
        claims += [(2, "unbound", max(a, unbound[0]), min(b, unbound[1])) for a, b in scheduling]
    edges = sorted({start, end, *(t for _, _, a, b in claims for t in (a, b) if start < t < end)})
    out: dict[Any, float] = {}
    for a, b in itertools.pairwise(edges):
        mid = (a + b) / 2
        held = [(prio, label) for prio, label, x, y in claims if x <= mid < y]
        label = min(held, key=lambda h: (h[0], h[1] != "unbound"))[1] if held else "other"
        out[label] = out.get(label, 0.0) + (b - a)
    return out


def account(
    kind: JobKind,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    *,
    ledger: dict[str, Any] | None,
    events: list[dict[str, Any]],
    workload: dict[str, Any] | None,
    now: float,
    price_per_gpu_hour: float | None = None,
) -> dict[str, Any]:
    """The job's wall time in parts (``PARTS``: seconds that sum to ``wall_s``), its goodput
    (productive / wall), what it held and what was useful in GPU-hours (or replica-hours), and
    its cost at ``price_per_gpu_hour``. ``ledger``: the trainer's newest ``goodput`` event."""
    start = epoch(job.get("metadata", {}).get("creationTimestamp")) or now
    finished = ended_at(kind, job)
    end = max(start, finished if finished is not None else now)
    # The runs of this job (a ledger found in a reused checkpoint dir may hold older ones).
    runs = [dict(r) for r in (ledger or {}).get("runs") or [] if r["ended_at"] > start]
    rank0 = _rank0_pod(kind, pods)
    since_report = 0.0
    if finished is None and runs and _running_run(rank0, runs[-1]):
        # The run goes on since its last report (at most a log window): its steps, so far.
        since_report = max(0.0, end - runs[-1]["ended_at"])
        runs[-1]["ended_at"] = end
        runs[-1]["productive_s"] = runs[-1]["productive_s"] + since_report
    queued, total, queue_source = queue_intervals(job, events, workload, start, end)
    if total:
        until = min([a for a, _ in queued] + [_last_admission(workload) or end])
        queued += place_backwards(total, until, start, runs)
    scheduling = _scheduling(rank0, runs, start, end)
    seconds = _timeline(runs, queued, scheduling, _unbound(rank0, runs, start), start, end)

    parts = dict.fromkeys(PARTS, 0.0)
    parts[QUEUED] = seconds.get("queued", 0.0)
    parts[SCHEDULING] = seconds.get("scheduling", 0.0) + seconds.get("unbound", 0.0)
    parts[OTHER] = seconds.get("other", 0.0)
    for i, run in enumerate(runs):
        parts[STARTUP] += seconds.get(("startup", i), 0.0)
        in_run = seconds.get(("run", i), 0.0)
        total = sum(run.get(k) or 0.0 for k in _IN_RUN)
        for key, part in _IN_RUN.items():
            if total > 0:
                parts[part] += in_run * (run.get(key) or 0.0) / total
            elif key == "productive_s":
                parts[part] += in_run
    wall = end - start
    held_s = max(0.0, wall - parts[QUEUED] - seconds.get("unbound", 0.0))
    gpus, replicas = job_gpus(job)
    out: dict[str, Any] = {
        "start": start,
        "end": end,
        "running": finished is None,
        "wall_s": _r(wall),
        **{k: _r(v) for k, v in parts.items()},
        "goodput_pct": _r(100.0 * parts[PRODUCTIVE] / wall) if wall > 0 else None,
        "runs": len(runs),
        "lost_steps": sum(int(r.get("lost_steps") or 0) for r in runs),
        # The runs that restarted the job themselves (a stuck job, failing saves, a slow rank
        # before step 1), with why.
        "restarts": [
            {
                "run": r.get("id"),
                "at": r["ended_at"],
                "step": r.get("last_step"),
                "cause": r.get("cause"),
            }
            for r in runs
            if r.get("end") == RESTART
        ],
        "since_report_s": _r(since_report),
        "held_s": _r(held_s),
        "gpus": gpus,
        "replicas": replicas,
        "sources": {"queue": queue_source, "trainer": "ledger" if runs else None},
        # Which code the runs ran (a shipped workdir's, from the ledger), each once, in order.
        "workdir": _distinct([r.get("workdir") for r in runs if r.get("workdir")]),
    }
    if gpus:
        out["gpu_hours_held"] = _r(gpus * held_s / 3600, 4)
        out["gpu_hours_useful"] = _r(gpus * parts[PRODUCTIVE] / 3600, 4)
        if price_per_gpu_hour is not None:
            out["price_per_gpu_hour"] = price_per_gpu_hour
            out["cost"] = _r(out["gpu_hours_held"] * price_per_gpu_hour, 2)
            out["cost_useful"] = _r(out["gpu_hours_useful"] * price_per_gpu_hour, 2)
    else:
        out["replica_hours_held"] = _r(replicas * held_s / 3600, 4)
        out["replica_hours_useful"] = _r(replicas * parts[PRODUCTIVE] / 3600, 4)
        if price_per_gpu_hour is not None:  # priced, but it holds no GPU: no GPU cost
            out |= {"price_per_gpu_hour": price_per_gpu_hour, "cost": None, "cost_useful": None}
    return out


def _last_admission(workload: dict[str, Any] | None) -> float | None:
    for c in (workload or {}).get("status", {}).get("conditions") or []:
        if c.get("type") == "Admitted" and c.get("status") == "True":
            return epoch(c.get("lastTransitionTime"))
    return None


def _r(x: float, digits: int = 3) -> float:
    return round(float(x), digits)


def _rank0_pod(kind: JobKind, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    rank0 = [p for p in pods if kind.node_rank(p) == 0 and kind.replica_name(p) != "?"]
    return max(rank0, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)


def _container(pod: dict[str, Any] | None) -> dict[str, Any]:
    from controller.jobs.read.explain import pod_kind

    if pod is None:
        return {}
    name = pod_kind(pod).container
    for c in pod.get("status", {}).get("containerStatuses") or []:
        if c.get("name") == name:
            return c
    return {}


def _started_times(pod: dict[str, Any] | None) -> list[float]:
    """When the training container of ``pod`` started, each run the pod still shows."""
    c = _container(pod)
    states = [c.get("state") or {}, c.get("lastState") or {}]
    found = [
        epoch(s.get(k, {}).get("startedAt")) for s in states for k in ("running", "terminated")
    ]
    return [t for t in found if t is not None]


def _running_run(pod: dict[str, Any] | None, run: dict[str, Any]) -> bool:
    """Whether the pod's container is running the ledger's last run (not a later one that has
    not reported yet)."""
    running = (_container(pod).get("state") or {}).get("running") or {}
    began = epoch(running.get("startedAt"))
    return began is not None and abs(began - run["launched_at"]) <= SAME_RUN_S


def _scheduling(
    pod: dict[str, Any] | None, runs: list[dict[str, Any]], start: float, end: float
) -> list[tuple[float, float]]:
    """Until the first run's container started, and from the current rank-0 pod's creation to
    its first start (or until now, while it has not started)."""
    started = _started_times(pod)
    first = runs[0]["launched_at"] if runs else min(started, default=end)
    out = [(start, first)]
    created = epoch((pod or {}).get("metadata", {}).get("creationTimestamp"))
    if created is not None:
        began = [r["launched_at"] for r in runs if r["launched_at"] >= created - SAME_RUN_S]
        began += [t for t in started if t >= created]
        out.append((created, min(began, default=end)))
    return out


def _unbound(
    pod: dict[str, Any] | None, runs: list[dict[str, Any]], start: float
) -> tuple[float, float] | None:
    """When the current rank-0 pod's GPUs were not bound yet: from the last run's end before it
    was made (or the job's start) until it was scheduled. None when that is not known."""
    if pod is None:
        return None
    created = epoch(pod.get("metadata", {}).get("creationTimestamp"))
    scheduled = None
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            scheduled = epoch(c.get("lastTransitionTime"))
    if created is None or scheduled is None:
        return None
    before = [r["ended_at"] for r in runs if r["ended_at"] <= created]
    return (max([start, *before]), scheduled)


# ---------------------------------------------------------------------------------------------
# Saying it


def format_goodput(name: str, g: dict[str, Any]) -> list[str]:
    """The lines ``goodput`` prints for job ``name``."""
    state = "running" if g["running"] else "ended"
    lines = [f"{name}: {_dur(g['wall_s'])} wall time ({state}), {g['runs']} run(s)"]
    for code in g.get("workdir") or []:
        lines.append(f"  code: workdir {code_line(code)}")
    for key in PARTS:
        share = 100.0 * g[key] / g["wall_s"] if g["wall_s"] > 0 else 0.0
        lines.append(f"  {LABELS[key]:<27} {_dur(g[key]):>10}  {share:5.1f}%")
    extra = f", {g['lost_steps']} step(s) trained again" if g["lost_steps"] else ""
    pct = "-" if g["goodput_pct"] is None else f"{g['goodput_pct']:.1f}%"
    lines.append(f"goodput: {pct} (productive / wall){extra}")
    lines += restart_lines(g)
    if g["gpus"]:
        lines.append(
            f"GPU-hours: {g['gpu_hours_held']:.3f} held ({g['gpus']} GPU(s)), "
            f"{g['gpu_hours_useful']:.3f} useful"
        )
        if "cost" in g:
            lines.append(
                f"cost: {g['cost']:.2f} at {g['price_per_gpu_hour']} per GPU-hour "
                f"({g['cost_useful']:.2f} of it useful)"
            )
    else:
        lines.append(
            f"no GPUs (gpus: 0): replica-hours {g['replica_hours_held']:.3f} held "
            f"({g['replicas']} replica(s)), {g['replica_hours_useful']:.3f} useful"
        )
        if "price_per_gpu_hour" in g:
            lines.append(f"cost: none at {g['price_per_gpu_hour']} per GPU-hour (no GPUs held)")
    if g["sources"]["trainer"] is None:
        lines.append(
            "note: no goodput event in rank 0's log (a trainer before ddpjob's ledger, or a "
            "script of your own): start-up, steps, stalls and lost work are in other"
        )
    if g["sources"]["queue"] == "workload status (total)":
        lines.append("note: Kueue's events have expired: the queued time is its total only")
    return lines


def restart_lines(g: dict[str, Any]) -> list[str]:
    """One line per time the job restarted itself, with why (``goodput`` and ``status``)."""
    return [
        f"restarted itself at step {r['step']}: {r['cause'] or 'no cause recorded'}"
        for r in g.get("restarts") or []
    ]


def _dur(s: float) -> str:
    if s < 60:
        return f"{s:.1f}s"
    s = round(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _distinct(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out
