"""Why a job does not run (``controller.jobs.read.why``), from API dicts shaped as the kubelet, the
scheduler and the operators write them (Kubernetes 1.33): each reason once, the registry's answer
for a pull, the missing Secret, the scheduler's words; steps said only once they last. The same
reasons on the real node: tests/e2e/test_why_it_waits.py."""

from __future__ import annotations

from typing import Any

from controller.jobs.read.apis import PYTORCHJOB_KIND, TRAINJOB_KIND
from controller.jobs.read.why import STEP_SAID_AFTER_S, WaitNotes, job_waiting, pod_waiting
from controller.jobs.wait import timeout_error

ANSWER = (
    'failed to pull and unpack image "localhost/nope:0.1": failed to resolve reference '
    '"localhost/nope:0.1": failed to do request: Head "https://localhost/v2/nope/manifests/0.1": '
    "dial tcp [::1]:443: connect: connection refused"
)


def pod(
    name: str = "j-master-0",
    *,
    uid: str = "u1",
    rtype: str = "master",
    index: int = 0,
    node: str | None = "node-0",
    waiting: dict[str, Any] | None = None,
    running: bool = False,
    init: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    restarts: int = 0,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {"waiting": waiting or {"reason": "ContainerCreating"}}
    if running:
        state = {"running": {"startedAt": "2026-01-01T00:00:05Z"}}
    status: dict[str, Any] = {
        "phase": "Running" if running else "Pending",
        "conditions": conditions or [],
    }
    if node is not None:
        status["containerStatuses"] = [
            {
                "name": "pytorch",
                "image": "localhost/nope:0.1",
                "state": state,
                "lastState": {"terminated": last} if last else {},
                "restartCount": restarts,
            }
        ]
    if init is not None:
        status["initContainerStatuses"] = init
    return {
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": {
                "training.kubeflow.org/job-name": "j",
                "training.kubeflow.org/replica-type": rtype,
                "training.kubeflow.org/replica-index": str(index),
            },
        },
        "spec": {"nodeName": node} if node else {},
        "status": status,
    }


def event(
    name: str,
    reason: str,
    message: str,
    *,
    uid: str = "",
    kind: str = "Pod",
    type_: str = "Warning",
    at: str = "2026-01-01T00:00:10Z",
    event_uid: str = "",
) -> dict[str, Any]:
    return {
        "metadata": {"uid": event_uid or f"{name}-{reason}-{at}"},
        "type": type_,
        "reason": reason,
        "message": message,
        "involvedObject": {"kind": kind, "name": name, "uid": uid},
        "lastTimestamp": at,
    }


def job(replicas: dict[str, int] | None = None, **status: Any) -> dict[str, Any]:
    specs = {t: {"replicas": n} for t, n in (replicas or {"Master": 1}).items()}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "uid": "job-uid", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"pytorchReplicaSpecs": specs},
        "status": status,
    }


def test_an_image_that_cannot_be_pulled_names_the_image_and_the_registrys_answer():
    back_off = {
        "reason": "ImagePullBackOff",
        "message": f'Back-off pulling image "localhost/nope:0.1": ErrImagePull: rpc error: '
        f"code = Unknown desc = {ANSWER}",
    }
    w = pod_waiting(pod(waiting=back_off), [])
    assert w is not None and w.problem
    assert w.line() == (
        f'pod j-master-0 is not running: ImagePullBackOff: image "localhost/nope:0.1" cannot be '
        f"pulled: {ANSWER}"
    )
    # The kubelet alternates ErrImagePull and ImagePullBackOff between tries: one reason.
    err = pod_waiting(pod(waiting={"reason": "ErrImagePull", "message": ANSWER}), [])
    assert err is not None and err.key == w.key


def test_a_missing_secret_in_the_environment_and_in_a_volume():
    env = pod_waiting(
        pod(waiting={"reason": "CreateContainerConfigError", "message": 'secret "nope" not found'}),
        [],
    )
    assert env is not None and env.problem
    assert env.text() == 'CreateContainerConfigError: secret "nope" not found'
    # A volume's Secret: the container stays ContainerCreating; only the pod's event says why.
    # An event of an earlier pod of the same name (another UID) is not this pod's.
    mount = 'MountVolume.SetUp failed for volume "creds" : secret "nope" not found'
    events = [
        event("j-master-0", "FailedMount", "an older pod's", uid="old", at="2026-01-01T00:00:20Z"),
        event("j-master-0", "FailedMount", mount, uid="u1"),
    ]
    vol = pod_waiting(pod(), events)
    assert vol is not None and vol.problem
    assert vol.text() == f"FailedMount: {mount}"
    assert pod_waiting(pod(), events[:1]).problem is False  # creating, nothing wrong yet


def test_unschedulable_and_waiting_for_the_scheduler():
    message = "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint."
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    w = pod_waiting(pod(node=None, conditions=[{**cond, "message": message}]), [])
    assert w is not None and w.problem and w.text() == f"Unschedulable: {message}"
    step = pod_waiting(pod(node=None), [])
    assert step is not None and not step.problem
    assert step.text() == "Pending: waiting for the scheduler"


def test_init_containers_a_running_one_is_a_step_a_failing_one_a_problem():
    running = [{"name": "init-pytorch", "state": {"running": {}}}]
    w = pod_waiting(pod(rtype="worker", init=running), [])
    assert w is not None and not w.problem
    assert w.text() == "Initializing: init container init-pytorch is still running"
    pulling = [
        {
            "name": "init-pytorch",
            "image": "alpine:3.10",
            "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}},
        }
    ]
    w = pod_waiting(pod(rtype="worker", init=pulling), [])
    assert w is not None and w.problem
    assert w.text() == (
        'ErrImagePull: init container init-pytorch: image "alpine:3.10" cannot be pulled: '
        "pull access denied"
    )
    done = [{"name": "init-pytorch", "state": {"terminated": {"exitCode": 0}}}]
    assert pod_waiting(pod(rtype="worker", init=done, running=True), []) is None


def test_a_crash_loop_says_the_exit_code_and_how_often():
    w = pod_waiting(
        pod(
            waiting={"reason": "CrashLoopBackOff", "message": "back-off 20s restarting"},
            restarts=3,
            last={"exitCode": 1, "reason": "Error"},
        ),
        [],
    )
    assert w is not None and w.problem
    assert w.text() == "CrashLoopBackOff: it exited 1 (Error) and was restarted 3 times"


def test_a_replica_without_a_pod_is_explained_by_its_controllers_event_of_this_job_only():
    j = job({"Master": 1, "Worker": 1})
    master = pod(running=True)
    refused = event(
        "j",
        "FailedCreatePod",
        'Error creating: pods "j-worker-0" is forbidden: violates PodSecurity',
        kind="PyTorchJob",
    )
    stale = {**refused, "lastTimestamp": "2025-12-31T23:59:00Z", "message": "j-worker-0 old"}
    (w,) = job_waiting(PYTORCHJOB_KIND, j, [master], [stale, refused])
    assert w.missing and w.problem and w.subject == "worker-0"
    assert w.text().startswith("no pod: FailedCreatePod: Error creating: pods")
    # From before the job was created: an earlier job's, not a reason for this one.
    (w,) = job_waiting(PYTORCHJOB_KIND, j, [master], [stale])
    assert w.missing and not w.problem and w.reason == "NotCreated"


def test_a_suspended_job_waits_as_a_whole_and_an_ended_one_not_at_all():
    suspended = job(conditions=[{"type": "Suspended", "status": "True", "message": "queued"}])
    (w,) = job_waiting(PYTORCHJOB_KIND, suspended, [], [])
    assert w.pod is None and w.line() == "the job is held: Suspended: queued"
    done = job(conditions=[{"type": "Succeeded", "status": "True"}])
    assert job_waiting(PYTORCHJOB_KIND, done, [pod()], []) == []


def test_a_job_kueue_holds_is_queued_and_its_queue_lines_are_not_repeated():
    # Kueue keeps a job with its queue label suspended until it admits it: wait and --follow
    # say where it stands in the queue (controller.jobs.queue.QueueNotes); WaitNotes says no
    # "held" line of its own, but the timeout's message still names the queue.
    held = job(conditions=[{"type": "Suspended", "status": "True", "message": "suspended"}])
    held["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    held["spec"]["runPolicy"] = {"suspend": True}
    (w,) = job_waiting(PYTORCHJOB_KIND, held, [], [])
    assert w.pod is None and not w.problem
    assert (
        w.line()
        == "the job is held: Queued: waiting in Kueue queue user-queue until it is admitted"
    )
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(held)
    assert notes.due(0.0) == ([], None)
    assert notes.due(STEP_SAID_AFTER_S + 1) == ([], None)
    assert "Queued: waiting in Kueue queue user-queue" in str(
        timeout_error("wait", "ml", "j", 5, "Suspended", notes.current())
    )


FLAVORS = "couldn't assign flavors to pod set master: "
WAITING = FLAVORS + "insufficient unused quota for cpu in flavor default-flavor, 1 more needed"
NEVER = (
    FLAVORS + "insufficient quota for cpu in flavor default-flavor, previously considered podsets "
    "requests (0) + current podset request (2) > maximum capacity (1)"
)


def test_kueues_reason_from_its_workloads_events_is_said_as_it_changes():
    """Kueue's scheduler records a Warning on the job's Workload (pytorchjob-j-<5 hex>) each time
    it cannot admit it, with the QuotaReserved condition's reason and message. WaitNotes says
    it: at once when it never clears (more than the queue can ever hold), else once it lasts;
    each new reason once; another job's Workload and an older word are not read."""
    held = job(conditions=[{"type": "Suspended", "status": "True", "message": "suspended"}])
    held["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    held["spec"]["runPolicy"] = {"suspend": True}
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(held)
    notes.see_event("ADDED", event("pytorchjob-jj-0a1b2", "Pending", NEVER, kind="Workload"))
    notes.see_event("ADDED", event("pytorchjob-j-0a1b2", "Pending", WAITING, kind="Workload"))
    assert notes.due(0.0) == ([], STEP_SAID_AFTER_S)  # a step: waiting for its turn
    (line,), _ = notes.due(STEP_SAID_AFTER_S)
    assert line == (
        "the job is held: Queued: in Kueue queue user-queue, Kueue says Pending: " + WAITING
    )
    assert notes.due(STEP_SAID_AFTER_S + 1) == ([], None)  # said once
    # Kueue's newer word (its gated reason, here), said at once: it never clears.
    notes.see_event(
        "ADDED",
        event("pytorchjob-j-0a1b2", "ExceedsMaxQuota", NEVER, kind="Workload",
              at="2026-01-01T00:00:20Z"),
    )  # fmt: skip
    (line,), _ = notes.due(STEP_SAID_AFTER_S + 2)
    assert line.endswith("Kueue says ExceedsMaxQuota: " + NEVER)
    err = timeout_error("wait", "ns", "j", 30, "Suspended", notes.current())
    assert "Kueue says ExceedsMaxQuota" in str(err).splitlines()[0]
    # Once Kueue admits it, its Warnings before are history.
    notes.see_event(
        "ADDED",
        event("pytorchjob-j-0a1b2", "QuotaReserved", "Quota reserved", kind="Workload",
              type_="Normal", at="2026-01-01T00:00:30Z"),
    )  # fmt: skip
    (w,) = notes.current()
    assert w.message == "waiting in Kueue queue user-queue until it is admitted"


def test_a_trainjob_without_a_jobset_is_explained_by_its_event():
    tj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "t", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"trainer": {"numNodes": 1}},
        "status": {},
    }
    # As Trainer records it: eventTime with microseconds, no lastTimestamp, in the second the
    # TrainJob was created.
    failed = event("t", "TrainJobResourcesCreationFailed", "runtime not found", kind="TrainJob")
    failed["lastTimestamp"] = None
    failed["eventTime"] = "2026-01-01T00:00:00.870814Z"
    (w,) = job_waiting(TRAINJOB_KIND, tj, [], [failed])
    assert w.missing and w.problem
    assert w.line() == "no pod for node-0 yet: TrainJobResourcesCreationFailed: runtime not found"


def test_notes_say_a_problem_at_once_and_once_per_change():
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(job())
    back_off = {"reason": "ImagePullBackOff", "message": f"Back-off: ErrImagePull: {ANSWER}"}
    notes.see_pod("ADDED", pod(waiting={"reason": "ErrImagePull", "message": ANSWER}))
    lines, _ = notes.due(0.0)
    assert len(lines) == 1 and "cannot be pulled" in lines[0]
    # Each retry flips the reason and the events' counts go up: nothing new to say.
    err_pull = {"reason": "ErrImagePull", "message": ANSWER}
    for t in range(1, 60):
        notes.see_pod("MODIFIED", pod(waiting=back_off if t % 2 else err_pull))
        notes.see_event("MODIFIED", event("j-master-0", "Failed", ANSWER, uid="u1"))
        assert notes.due(float(t)) == ([], None)
    # Fixed (a new image): it runs, and that is said once.
    notes.see_pod("MODIFIED", pod(running=True))
    assert notes.due(61.0)[0] == ["pod j-master-0 runs now"]
    assert notes.due(62.0)[0] == []


def test_a_reason_is_said_once_while_its_pod_waits_though_the_pod_flips_away_and_back():
    """A missing Secret's CreateContainerConfigError is said once. A pod whose status shows the
    container creating again, with the kubelet's Warning event beside it, is another reason for
    a moment (the event's); the pod's own reason coming back is not news."""
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(job())
    config = {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}
    notes.see_pod("ADDED", pod(waiting=config))
    assert notes.due(0.0)[0] == [
        'pod j-master-0 is not running: CreateContainerConfigError: secret "s" not found'
    ]
    notes.see_event("ADDED", event("j-master-0", "Failed", 'Error: secret "s" not found', uid="u1"))
    notes.see_pod("MODIFIED", pod())  # creating, as the kubelet's status said for a moment
    assert notes.due(1.0)[0] == [
        'pod j-master-0 is not running: Failed: Error: secret "s" not found'
    ]
    for t in range(2, 10):
        notes.see_pod("MODIFIED", pod(waiting=config) if t % 2 else pod())
        assert notes.due(float(t)) == ([], None)
    # It runs: said once; a reason after that is news again.
    notes.see_pod("MODIFIED", pod(running=True))
    assert notes.due(10.0)[0] == ["pod j-master-0 runs now"]
    notes.see_pod("MODIFIED", pod(waiting=config))
    assert len(notes.due(11.0)[0]) == 1


def test_notes_say_a_step_only_once_it_lasts_and_other_jobs_events_are_not_read():
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(job())
    notes.see_pod("ADDED", pod(node=None))
    notes.see_event("ADDED", event("other-master-0", "FailedMount", "not ours", uid="u1"))
    assert notes.events == {}
    assert notes.due(100.0) == ([], 100.0 + STEP_SAID_AFTER_S)
    assert notes.due(100.0 + STEP_SAID_AFTER_S - 1)[0] == []
    (line,) = notes.due(100.0 + STEP_SAID_AFTER_S)[0]
    assert line == "pod j-master-0 is not running: Pending: waiting for the scheduler"
    # Scheduled, still creating: a change, said at once (the pod has waited long already).
    notes.see_pod("MODIFIED", pod())
    (line,) = notes.due(100.0 + STEP_SAID_AFTER_S + 1)[0]
    assert "ContainerCreating" in line
    # The job ended: nothing waits.
    notes.see_job(job(conditions=[{"type": "Succeeded", "status": "True"}]))
    assert notes.current() == []


def test_a_timeout_says_first_what_keeps_the_job_from_running():
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(job({"Master": 1, "Worker": 1}))
    notes.see_pod("ADDED", pod("j-worker-0", uid="u2", rtype="worker", node=None))
    notes.see_pod(
        "ADDED",
        pod(waiting={"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}),
    )
    err = timeout_error("wait", "ns", "j", 30, "Created", notes.current())
    first, *rest = str(err).splitlines()
    assert first == (
        "wait: job ns/j has not ended after 30 s (got Created; pod j-master-0 is not running: "
        'CreateContainerConfigError: secret "s" not found)'
    )
    assert rest == ["  and pod j-worker-0 is not running: Pending: waiting for the scheduler"]
    assert err.exit_code == 1


def _told_before_the_pod(told: dict[str, Any], said: str) -> WaitNotes:
    """WaitNotes of a job whose operator's event ``told`` came before its pod: the pod j-master-0
    is a problem, said at once as ``said``, not a replica without a pod."""
    notes = WaitNotes(PYTORCHJOB_KIND, "j")
    notes.see_job(job())
    notes.see_event("ADDED", told)
    (w,) = notes.current()
    assert not w.missing and w.problem and w.subject == "j-master-0"
    assert notes.due(0.0)[0] == [f"pod j-master-0 is not running: {said}"]
    return notes


def test_a_pod_the_operator_has_seen_before_our_watch_is_said_once_as_the_pod_says_it():
    """The PyTorchJob's ``Error pod X condition message`` event can come before the follower's
    pod watch brings the pod. The operator's event names the pod: it is that pod's reason, said
    once, not as a replica without a pod and then again as the pod's."""
    message = "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint."
    told = event(
        "j",
        "Unschedulable",
        f"Error pod j-master-0 condition message: {message}",
        kind="PyTorchJob",
    )
    notes = _told_before_the_pod(told, f"Unschedulable: {message}")
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    notes.see_pod("ADDED", pod(node=None, conditions=[{**cond, "message": message}]))
    assert notes.due(1.0) == ([], None)
    # Another condition (scheduled, containers not ready): the pod on its way, not a problem,
    # and not a reason for another replica that has no pod.
    ready = event(
        "j",
        "ContainersNotReady",
        "Error pod j-master-0 condition message: containers with unready status: [pytorch]",
        kind="PyTorchJob",
        at="2026-01-01T00:00:11Z",
    )
    master, worker = job_waiting(PYTORCHJOB_KIND, job({"Master": 1, "Worker": 1}), [], [ready])
    assert (master.subject, master.reason, master.problem) == (
        "j-master-0",
        "ContainerCreating",
        False,
    )
    assert worker.missing and worker.reason == "NotCreated" and not worker.problem


def test_the_operators_event_about_a_waiting_container_is_the_pods_reason_said_once():
    """Once the pod has container statuses, the operator's event is ``Error pod X container C
    waiting message: M`` with the waiting reason (training-operator v1.9, core/job.go). Before
    our pod watch brings the pod, that is the pod's reason as the pod says it: said once, not as
    a replica without a pod and again as the pod's."""
    told = event(
        "j",
        "CreateContainerConfigError",
        'Error pod j-master-0 container pytorch waiting message: secret "s" not found',
        kind="PyTorchJob",
    )
    notes = _told_before_the_pod(told, 'CreateContainerConfigError: secret "s" not found')
    waiting = {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}
    notes.see_pod("ADDED", pod(waiting=waiting))
    assert notes.due(1.0) == ([], None)
    # A pull that fails (the registry unreachable too), or a container that ended: the pod says
    # more than the event; until it does, the pod is on its way, and no replica lacks a pod.
    for reason, message in (
        ("ErrImagePull", "Error pod j-master-0 container pytorch waiting message: not found"),
        ("RegistryUnavailable", "Error pod j-master-0 container pytorch waiting message: x"),
        ("Error", "Error pod j-master-0 container pytorch exitCode: 1 terminated message: "),
    ):
        (w,) = job_waiting(
            PYTORCHJOB_KIND, job(), [], [event("j", reason, message, kind="PyTorchJob")]
        )
        assert (w.subject, w.reason, w.problem, w.missing) == (
            "j-master-0",
            "ContainerCreating",
            False,
            False,
        )
