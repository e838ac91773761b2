"""Why a job is not running: the one place that maps what the API shows (the job, its pods,
their events) to reasons a user can act on. ``wait``, ``submit --wait``, ``--follow``, ``logs``
and ``status`` all read them here; a new kind of reason (a queue, say) is added here once.

Pure: API dicts in (``kubectl get -o json``'s shape), :class:`Waiting` records out.

What a pod that does not run shows, and where (Kubernetes 1.33):

- the scheduler cannot place it: condition ``PodScheduled=False``, reason ``Unschedulable``,
  the scheduler's message (``0/3 nodes are available: 3 Insufficient cpu. ...``);
- its image cannot be pulled: the container waits with ``ErrImagePull``, then
  ``ImagePullBackOff`` whose message carries the previous pull error (the registry's answer;
  ``pkg/kubelet/images/image_manager.go``), in turns, once per back-off;
- a Secret or ConfigMap its environment names is missing: ``CreateContainerConfigError``
  (``secret "x" not found``); one its volumes name: the container stays ``ContainerCreating``
  and only a ``FailedMount`` Warning event of the pod says why;
- an init container has not finished: its own waiting state, or it runs (a PyTorchJob worker's
  waits for the master's DNS name, which exists once the master runs);
- a pod the job's controller could not create: none at all, and a Warning event of the job (or
  a TrainJob's JobSet or Job) says why (``FailedCreate``, ``TrainJobResourcesCreationFailed``);
- a pod the training operator has made and sees waiting, before our own watch of the pods has
  brought it: a Warning event of the PyTorchJob (the operator's ``RecordAbnormalPods``), with
  the reason of what it saw: ``Error pod <pod> condition message: <the pod's latest false
  condition's message>``, or, once the pod has container statuses, ``Error pod <pod> container
  <name> waiting message: <the waiting state's message>`` (``... exitCode: <n> terminated
  message: ...`` for one that ended). It is said as the pod's own reason would be, so the pod
  arriving a moment later is no change;
- the job itself is suspended: its ``Suspended`` condition (a queue such as Kueue admits it by
  resuming it); with Kueue's queue label, it is ``Queued`` (``controller.jobs.read.queue`` says
  where it stands in that queue and what it waits for), and Kueue's Warning events on its
  Workload say why Kueue does not admit it, in Kueue's words (the reason and message of the
  Workload's ``QuotaReserved`` condition).

A reason is a *problem* (said at once: it will not go away by itself) or a *step* on the way
(scheduling, pulling, creating: said only once it lasts, see ``STEP_SAID_AFTER_S``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from controller.jobs.read.apis import JobKind
from controller.jobs.read.explain import container_status, event_time, node_rank, replica_name
from controller.jobs.read.queue import never_admitted, queued, said_last
from controller.jobs.read.view import EVENT, JOB, POD, JobView

#: A step on the way (scheduling, pulling a big image) is said once it has lasted this long; a
#: problem at once. Wait, follow and the timeout message read the same reasons.
STEP_SAID_AFTER_S = 20.0

#: Container waiting reasons that will not clear by themselves (the kubelet's: images/types.go,
#: kuberuntime). ContainerCreating and PodInitializing are steps.
PROBLEM_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
        "PreStartHookError",
        "PostStartHookError",
    }
)
#: Waiting reasons that mean the image could not be pulled: one reason to the user, however the
#: kubelet alternates them between retries.
IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable"})
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})

#: The key of a job that Kueue holds, before Kueue has said why: ``wait`` and ``--follow`` say
#: where it stands in its queue (``controller.jobs.queue.QueueNotes``, read when the job
#: changes), so WaitNotes does not repeat it; it still counts for the timeout's message. Kueue's
#: own reason, from its events, is said like any other.
QUEUED_KEY = ("queued",)

_RPC_PREFIX = re.compile(r"^rpc error: code = \w+ desc = ")
#: The training operator's event about a pod of the job whose latest condition is false
#: (``Error pod %s condition message: %s``, reason: the condition's).
_POD_CONDITION = re.compile(r"Error pod (\S+) condition message: (.*)$", re.DOTALL)
#: Its event about a container of such a pod: waiting (``waiting message: %s``, reason: the
#: waiting state's) or ended (``exitCode: %d terminated message: %s``).
_POD_CONTAINER = re.compile(
    r"Error pod (\S+) container \S+ (?:waiting message: (.*)|exitCode: -?\d+ terminated .*)$",
    re.DOTALL,
)
#: The reasons of a false ``PodScheduled`` condition, which pod_waiting reads from the pod.
_SCHEDULING_REASONS = frozenset({"Unschedulable", "SchedulingGated"})


@dataclass(frozen=True)
class Waiting:
    """One thing that is not running, and why.

    ``subject`` is a pod name, a replica without a pod (``missing``), or the job itself
    (``pod is None and not missing``); ``reason`` a short CamelCase word (the kubelet's or the
    scheduler's where they have one); ``message`` the detail; ``problem``: it will not clear by
    itself. ``key`` is what must change for the reason to be said again (an image pull that
    alternates ErrImagePull and ImagePullBackOff is one reason until the registry's answer
    changes)."""

    subject: str
    reason: str
    message: str
    problem: bool
    key: tuple[str, ...]
    pod: str | None = None
    missing: bool = False

    def text(self) -> str:
        """``Reason: message`` (what ``status`` shows beside the pod)."""
        body = f"{self.reason}: {self.message}" if self.message else self.reason
        return f"no pod: {body}" if self.missing else body

    def line(self) -> str:
        """One sentence naming the subject, for ``wait`` and ``--follow``."""
        body = f"{self.reason}: {self.message}" if self.message else self.reason
        if self.missing:
            return f"no pod for {self.subject} yet: {body}"
        if self.pod is None:
            return f"the job is held: {body}"
        return f"pod {self.subject} is not running: {body}"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _about_pod(events: list[dict[str, Any]], pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of ``pod``: by UID where the event names one (a pod re-created under the same
    name is another pod, and its predecessor's events are not its own), else by name."""
    meta = pod.get("metadata", {})
    uid, name = meta.get("uid"), meta.get("name")
    out = []
    for e in events:
        obj = e.get("involvedObject", {})
        if obj.get("kind", "Pod") != "Pod" or obj.get("name") != name:
            continue
        if uid and obj.get("uid") and obj["uid"] != uid:
            continue
        out.append(e)
    return out


def _image_answer(message: str) -> str:
    """The registry's answer in a pull error: without the kubelet's back-off preamble
    (``Back-off pulling image "x": ErrImagePull: ``) and the CRI's ``rpc error`` wrapper."""
    text = _one_line(message)
    for marker in ("ErrImagePull: ", "RegistryUnavailable: "):
        if marker in text:
            text = text.split(marker, 1)[1]
    return _RPC_PREFIX.sub("", text)


def _is_image_reason(reason: str) -> bool:
    """A waiting reason about the container's image: said with the image and the registry's
    answer."""
    return reason in IMAGE_REASONS or (reason in PROBLEM_REASONS and "image" in reason.lower())


def _said_as_the_kubelet_says(reason: str) -> bool:
    """A problem waiting reason that :func:`_container_reason` says with the kubelet's own
    message (not an image's, not a crash loop's restart count)."""
    return (
        reason in PROBLEM_REASONS and not _is_image_reason(reason) and reason != "CrashLoopBackOff"
    )


def _container_reason(pod: dict[str, Any], cs: dict[str, Any], *, init: bool) -> Waiting | None:
    """Why one container (an init container with ``init``) is not running, or None."""
    name = pod["metadata"]["name"]
    which = f"init container {cs.get('name')}: " if init else ""
    state = cs.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = waiting.get("reason") or ""
    if _is_image_reason(reason):
        image = cs.get("image") or "?"
        answer = _image_answer(waiting.get("message", "")) or "no answer recorded"
        return Waiting(
            name,
            reason,
            f'{which}image "{image}" cannot be pulled: {answer}',
            True,
            ("image", cs.get("name", ""), image, answer),
            pod=name,
        )
    if reason == "CrashLoopBackOff":
        term = (cs.get("lastState") or {}).get("terminated") or {}
        code = term.get("exitCode")
        message = f"{which}it exited {code} ({term.get('reason') or 'Error'})" if term else which
        restarts = int(cs.get("restartCount", 0))
        message += f" and was restarted {restarts} time{'s' if restarts != 1 else ''}"
        return Waiting(
            name,
            reason,
            message.strip(),
            True,
            ("crashloop", cs.get("name", ""), str(code)),
            pod=name,
        )
    if reason in PROBLEM_REASONS:
        message = f"{which}{_one_line(waiting.get('message'))}".strip()
        return Waiting(name, reason, message, True, (reason, message), pod=name)
    if init and "running" in state:
        message = f"init container {cs.get('name')} is still running"
        return Waiting(name, "Initializing", message, False, ("init", cs.get("name", "")), pod=name)
    if init and (state.get("terminated") or {}).get("exitCode", 0) != 0:
        term = state["terminated"]
        message = f"init container {cs.get('name')} exited {term.get('exitCode')}"
        return Waiting(name, "InitError", message, True, ("initerror", message), pod=name)
    return None


def pod_waiting(pod: dict[str, Any], events: list[dict[str, Any]]) -> Waiting | None:
    """Why ``pod`` does not run its training container; None when it runs (or has ended, or
    is being deleted). ``events`` may be any events: the pod's own are picked out."""
    meta = pod.get("metadata", {})
    status = pod.get("status", {})
    name = meta.get("name", "?")
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = cond.get("reason") or "Unschedulable"
            message = _one_line(cond.get("message"))
            gated = reason == "SchedulingGated"
            return Waiting(name, reason, message, not gated, (reason, message), pod=name)
    init_statuses = status.get("initContainerStatuses") or []
    if not pod.get("spec", {}).get("nodeName") and not (
        init_statuses or status.get("containerStatuses")
    ):
        return Waiting(
            name, "Pending", "waiting for the scheduler", False, ("scheduling",), pod=name
        )
    for cs in init_statuses:
        if (cs.get("state") or {}).get("terminated", {}).get("exitCode") == 0:
            continue
        found = _container_reason(pod, cs, init=True)
        if found is not None:
            return found
    main = container_status(pod)
    state = main.get("state") or {}
    if "running" in state or "terminated" in state:
        return None
    if not main and any(  # a pod of another container (a TrainJob's initializer) that runs
        "running" in (cs.get("state") or {}) for cs in status.get("containerStatuses") or []
    ):
        return None
    # Every other container (a sidecar) can keep the pod from starting too.
    for cs in [main] + [
        c for c in status.get("containerStatuses") or [] if c.get("name") != main.get("name")
    ]:
        found = _container_reason(pod, cs, init=False) if cs else None
        if found is not None:
            return found
    # Creating: what the kubelet's events say (a volume that cannot be mounted, a sandbox that
    # cannot be made, the image being pulled).
    mine = sorted(_about_pod(events, pod), key=event_time)
    warnings = [e for e in mine if e.get("type") == "Warning"]
    if warnings:
        last = warnings[-1]
        reason, message = last.get("reason") or "Warning", _one_line(last.get("message"))
        return Waiting(name, reason, message, True, ("event", reason, message), pod=name)
    reason = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
    if mine and mine[-1].get("reason") == "Pulling":
        message = _one_line(mine[-1].get("message"))
        return Waiting(name, "Pulling", message, False, ("pulling", message), pod=name)
    in_init = any("running" in (cs.get("state") or {}) for cs in init_statuses)
    message = "its init containers run" if in_init else "the kubelet is starting it"
    return Waiting(name, reason, message, False, ("creating",), pod=name)


def job_reason(
    kind: JobKind, job: dict[str, Any], events: list[dict[str, Any]] | None = None
) -> Waiting | None:
    """Why the job as a whole waits (not one pod): suspended (by ``spec.suspend``), or queued
    (suspended with a Kueue queue, until Kueue admits it: with Kueue's latest word on its
    Workload among ``events``, that). None when nothing at the job's level holds it."""
    name = job.get("metadata", {}).get("name", "?")
    if kind.condition(job) != "Suspended":
        return None
    local_queue = queued(job)
    if local_queue:
        # An event from before the job was created is about an earlier job of the same name.
        created = (job.get("metadata", {}).get("creationTimestamp") or "")[:19]
        since = [e for e in events or [] if event_time(e)[:19] >= created]
        said = said_last(kind.api.kind, name, since)
        if said is not None:
            # Kueue's reason changes as the queue moves: said once per change, a verdict that
            # never clears (the job too big for the queue) at once.
            reason, message = said
            text = f"in Kueue queue {local_queue}, Kueue says {reason}: {message}"
            key = ("kueue", local_queue, reason, message)
            return Waiting(name, "Queued", text, never_admitted(reason, message), key)
        message = f"waiting in Kueue queue {local_queue} until it is admitted"
        return Waiting(name, "Queued", message, False, (*QUEUED_KEY, local_queue))
    message = kind.condition_message(job, "Suspended") or "spec.suspend is true"
    return Waiting(name, "Suspended", _one_line(message), False, ("suspended",))


def job_waiting(
    kind: JobKind,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    events: list[dict[str, Any]],
) -> list[Waiting]:
    """Everything that keeps ``job`` from running, in node-rank order: the job itself (held),
    each pod that does not run, each replica that has no pod (with what its controller said).
    Empty for a job that runs or has ended."""
    if kind.terminal(job) or job.get("metadata", {}).get("deletionTimestamp"):
        return []
    held = job_reason(kind, job, events)
    if held is not None:
        return [held]
    name = job["metadata"]["name"]
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    out = [w for w in (pod_waiting(p, events) for p in sorted(live, key=node_rank)) if w]
    have = {replica_name(p) for p in pods}
    missing = [r for r in kind.expected_replicas(job) if r not in have]
    if not missing:
        return out
    # An event from before the job was created is about an earlier job of the same name. To the
    # second: creationTimestamp has whole seconds, an event's eventTime microseconds.
    created = (job.get("metadata", {}).get("creationTimestamp") or "")[:19]
    failures = sorted(
        (e for e in kind.build_failures(name, events) if event_time(e)[:19] >= created),
        key=event_time,
    )
    # What the operator says of pods it has made (its watch can be ahead of ours): the last
    # word on each. These events say a pod exists; they are not why one was not created.
    made: dict[str, Waiting] = {}
    creating = []
    for e in failures:
        message, reason = e.get("message") or "", e.get("reason") or ""
        if said := _POD_CONDITION.search(message):
            made[said.group(1)] = _made_pod(said.group(1), reason, _one_line(said.group(2)))
        elif said := _POD_CONTAINER.search(message):
            made[said.group(1)] = _made_container(said.group(1), reason, said.group(2))
        else:
            creating.append(e)
    for replica in missing:
        stem = kind.pod_name_of(name, replica)
        if stem in made:
            out.append(made[stem])
            continue
        about = [e for e in creating if stem in (e.get("message") or "")] or creating
        if about:
            last = about[-1]
            reason, message = last.get("reason") or "Warning", _one_line(last.get("message"))
            out.append(
                Waiting(replica, reason, message, True, ("create", reason, message), missing=True)
            )
        else:
            out.append(
                Waiting(
                    replica,
                    "NotCreated",
                    f"{kind.controller_name} has not created it",
                    False,
                    ("notcreated",),
                    missing=True,
                )
            )
    return out


def _made_container(pod: str, reason: str, waiting: str | None) -> Waiting:
    """A pod the operator has made, known only from its event about a container: one that waits
    for a reason that will not clear (a missing Secret: ``CreateContainerConfigError``) as
    :func:`pod_waiting` says it from the pod itself, same subject and key; anything else (an
    image that cannot be pulled or a crash loop, which the pod says with more than the event
    has; a container that ended) is the pod on its way, a step, until the pod says more."""
    if waiting is not None and _said_as_the_kubelet_says(reason):
        message = _one_line(waiting)
        return Waiting(pod, reason, message, True, (reason, message), pod=pod)
    return _made_pod(pod, "ContainersNotReady", "")


def _made_pod(pod: str, reason: str, message: str) -> Waiting:
    """A pod the operator has made, known only from its event: unschedulable (or gated) as
    :func:`pod_waiting` says it from the pod itself, same subject and key; any other condition
    (its containers not ready yet: it has been scheduled) is the pod on its way, a step."""
    if reason in _SCHEDULING_REASONS:
        return Waiting(
            pod, reason, message, reason != "SchedulingGated", (reason, message), pod=pod
        )
    return Waiting(
        pod, "ContainerCreating", "the kubelet is starting it", False, ("creating",), pod=pod
    )


def pending_reason(pod: dict[str, Any] | None, events: list[dict[str, Any]]) -> str:
    """Why ``pod`` (or, with ``pod=None``, the job: its Warning events) is not running, in one
    line; "" if nothing explains it."""
    if pod is not None:
        found = pod_waiting(pod, events)
        return found.text() if found is not None else ""
    warnings = [e for e in events if e.get("type") == "Warning"]
    if not warnings:
        return ""
    last = max(warnings, key=event_time)
    return f"{last.get('reason', '')}: {_one_line(last.get('message'))}".strip(": ")


class WaitNotes:
    """What to say about a waiting job, once per change: reading the job's view (its watches of
    the job, its pods and the namespace's events), :meth:`due` returns the lines to say now (a
    problem at once, a step once its subject has waited ``step_after_s``) and when a step will
    be due.

    No clock of its own and no API: the caller passes ``now`` (``time.monotonic()``), so a test
    can drive it. Without a ``view`` it keeps one of its own, fed by ``see_job``, ``see_pod``
    and ``see_event``."""

    def __init__(
        self,
        kind: JobKind,
        name: str,
        *,
        step_after_s: float = STEP_SAID_AFTER_S,
        view: JobView | None = None,
    ):
        self.kind, self.name, self.step_after_s = kind, name, step_after_s
        self.view = view if view is not None else JobView(kind, name)
        self._since: dict[str, float] = {}  # subject -> when it was first seen waiting
        # subject -> the keys said while it waits: a reason is said once, even when the pod's
        # status flips away from it and back (the kubelet's events, then its status).
        self._said: dict[str, set[tuple[str, ...]]] = {}

    @property
    def events(self) -> dict[str, dict[str, Any]]:
        """The job's events in the view (uid -> the event as last seen)."""
        return self.view.events

    def see_job(self, job: dict[str, Any]) -> None:
        self.view.apply(JOB, "MODIFIED", job)

    def see_pod(self, etype: str, pod: dict[str, Any]) -> None:
        self.view.apply(POD, etype, pod)

    def see_event(self, etype: str, event: dict[str, Any]) -> None:
        self.view.apply(EVENT, etype, event)  # another job's is not kept

    def current(self) -> list[Waiting]:
        """Everything that keeps the job from running, as known now."""
        return view_waiting(self.view)

    def due(self, now: float) -> tuple[list[str], float | None]:
        """The lines to say now (:meth:`Waiting.line`, and ``pod X runs now`` for a pod said
        to wait before), and the ``now`` at which a step becomes due (None: none pending)."""
        lines: list[str] = []
        next_at: float | None = None
        waiting = self.current()
        subjects = {w.subject for w in waiting}
        for w in waiting:
            since = self._since.setdefault(w.subject, now)
            if w.key in self._said.get(w.subject, ()) or w.key[:1] == QUEUED_KEY:
                continue
            if w.problem or now - since >= self.step_after_s:
                lines.append(w.line())
                self._said.setdefault(w.subject, set()).add(w.key)
            else:
                at = since + self.step_after_s
                next_at = at if next_at is None else min(next_at, at)
        running = {
            p["metadata"]["name"]
            for p in self.view.pods.values()
            if "running" in (container_status(p).get("state") or {})
        }
        for subject in [s for s in self._said if s not in subjects]:
            del self._said[subject]
            if subject in running:
                lines.append(f"pod {subject} runs now")
        self._since = {s: t for s, t in self._since.items() if s in subjects}
        return lines, next_at


def view_waiting(view: JobView) -> list[Waiting]:
    """Everything that keeps the job of ``view`` from running (:func:`job_waiting`)."""
    if view.job is None:
        return []
    return job_waiting(view.kind, view.job, view.pod_list(), view.event_list())


def not_started(view: JobView) -> tuple[list[dict[str, Any]], list[str]]:
    """The job's Pending pods and its replicas without a pod, as ``status`` lists them: no
    missing replica for a job that ended or is suspended on purpose (no pods is no news)."""
    job = view.job or {}
    pods = view.pod_list()
    waiting = [p for p in pods if p.get("status", {}).get("phase") == "Pending"]
    if view.terminal or view.condition == "Suspended":
        return waiting, []
    have = {view.kind.replica_name(p) for p in pods}
    return waiting, [r for r in view.kind.expected_replicas(job) if r not in have]


def pending(view: JobView) -> list[dict[str, str]]:
    """Why each pending pod waits, and why each missing pod was not created (from the events of
    the objects between the job and its pods: ``TrainJobResourcesCreationFailed``,
    ``FailedCreate``, ...), for the pods not yet running (a running pod's restarts are the
    replica table's): ``status``'s ``pending``."""
    waiting, missing = not_started(view)
    if view.job is None or not (waiting or missing):
        return []
    names = {p["metadata"]["name"] for p in waiting}
    return [
        {
            "pod": view.kind.pod_name_of(view.name, w.subject) if w.missing else w.subject,
            "reason": w.text(),
        }
        for w in view_waiting(view)
        if w.pod in names or w.missing
    ]
