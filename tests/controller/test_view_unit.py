"""The one view of a job (``controller.jobs.read.view.JobView``) that ``wait``, ``--follow`` and
``status`` read: the watch stream folded in, item by item, as ``controller.kube.watch`` yields
it; a failed run named once, and its tail read by the live watch; what the trainer's events say.
The commands on the real node: tests/e2e/test_wait.py, test_recovery.py."""

from __future__ import annotations

import json
import queue
from typing import Any

import pytest

from controller.errors import Forbidden
from controller.jobs.read.apis import PYTORCHJOB_KIND
from controller.jobs.read.trainer_events import TrainerEvents
from controller.jobs.read.view import ERROR, EVENT, JOB, POD, JobView
from controller.jobs.read.why import pending
from controller.jobs.watches import JobWatch, PodHistory
from controller.kube.watch import RESYNC
from trainer.contract import CHECKPOINT, DONE, STUCK, TRAIN


def job(*conditions: str, replicas: dict[str, int] | None = None) -> dict[str, Any]:
    specs = {t: {"replicas": n} for t, n in (replicas or {"Master": 1}).items()}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "J",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"pytorchReplicaSpecs": specs},
        "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]},
    }  # fmt: skip


def pod(uid: str, *, exit_code: int | None = None, restarts: int = 0) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}}
    last: dict[str, Any] = {}
    if exit_code is not None:
        last = {"terminated": {"exitCode": exit_code, "finishedAt": "2026-01-01T00:01:00Z"}}
    return {
        "metadata": {
            "name": "j-master-0",
            "uid": uid,
            "labels": {
                "training.kubeflow.org/job-name": "j",
                "training.kubeflow.org/replica-type": "master",
                "training.kubeflow.org/replica-index": "0",
            },
        },
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "pytorch", "state": state, "lastState": last, "restartCount": restarts}
            ],
        },
    }


def event(name: str, reason: str, uid: str, kind: str = "Pod") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid},
        "type": "Warning",
        "reason": reason,
        "message": f"{reason} of {name}",
        "involvedObject": {"kind": kind, "name": name},
        "lastTimestamp": "2026-01-01T00:00:05Z",
    }


def test_the_stream_is_folded_into_the_job_its_pods_and_its_events():
    view = JobView(PYTORCHJOB_KIND, "j")
    assert view.apply(JOB, "ADDED", job("Created")).what == JOB
    assert view.apply(JOB, RESYNC, {"count": 1}) is None  # the list found it: nothing new
    assert view.apply(POD, "ADDED", pod("a")).what == POD
    assert not view.pods_listed
    assert view.apply(POD, RESYNC, {"count": 1}).what == POD and view.pods_listed
    assert view.apply(EVENT, "ADDED", event("j-master-0", "Pulling", "e1")).what == EVENT
    assert view.apply(EVENT, "ADDED", event("other-master-0", "Failed", "e2")) is None
    assert view.apply(EVENT, RESYNC, {"count": 2}) is None
    assert (view.condition, view.terminal, view.seen, view.gone) == ("Created", None, True, False)
    assert list(view.pods) == ["a"] and list(view.events) == ["e1"]

    view.apply(POD, "DELETED", pod("a"))
    view.apply(EVENT, "DELETED", event("j-master-0", "Pulling", "e1"))
    assert view.pods == {} and view.events == {}
    assert list(view.history.pods) == ["a"]  # its last state stays for the failure report

    view.apply(JOB, "MODIFIED", job("Created", "Running", "Succeeded"))
    assert view.terminal == "Succeeded" and not view.gone


@pytest.mark.parametrize(
    ("etype", "obj"), [("DELETED", job("Running")), (RESYNC, {"count": 0})], ids=["deleted", "none"]
)
def test_a_job_deleted_or_listed_as_none_is_gone(etype, obj):
    view = JobView(PYTORCHJOB_KIND, "j")
    view.apply(JOB, etype, obj)
    assert view.gone and not view.seen


def test_a_failed_watch_is_raised_where_the_stream_is_read():
    view = JobView(PYTORCHJOB_KIND, "j")
    with pytest.raises(Forbidden, match="no pods"):
        view.apply(ERROR, POD, {"error": Forbidden("no pods")})


def test_a_failed_run_is_named_once_and_a_later_run_again():
    view = JobView(PYTORCHJOB_KIND, "j")
    assert view.apply(POD, "ADDED", pod("a")).failed_run is None
    run = view.apply(POD, "MODIFIED", pod("a", exit_code=1, restarts=1)).failed_run
    assert run is not None and (run.key, run.previous, run.pod_name) == (
        ("a", 0),
        True,
        "j-master-0",
    )
    assert view.apply(POD, "MODIFIED", pod("a", exit_code=1, restarts=1)).failed_run is None
    again = view.apply(POD, "MODIFIED", pod("a", exit_code=1, restarts=2)).failed_run
    assert again is not None and again.key == ("a", 1)
    assert view.apply(POD, "MODIFIED", pod("b", exit_code=0, restarts=1)).failed_run is None
    assert [p["metadata"]["uid"] for p in view.history.failed] == ["a", "a"]


def test_one_read_is_a_view_too_and_says_why_a_replica_has_no_pod():
    """``status`` reads once (job, pods, events) and asks the same view."""
    two = job("Created", replicas={"Master": 1, "Worker": 1})
    refused = event("j", "FailedCreatePod", "e1", kind="PyTorchJob")
    refused["message"] = "Error creating: pods j-worker-0 is forbidden: exceeded quota"
    view = JobView.of(PYTORCHJOB_KIND, two, [pod("a")], [refused])
    assert view.pods_listed and view.condition == "Created"
    assert pending(view) == [
        {
            "pod": "j-worker-0",
            "reason": "no pod: FailedCreatePod: Error creating: pods j-worker-0 is forbidden: "
            "exceeded quota",
        }
    ]
    assert pending(JobView.of(PYTORCHJOB_KIND, job("Succeeded"), [])) == []


def test_the_trainers_events_newest_first_and_each_ranks_own():
    said = TrainerEvents()
    said.see_lines(
        [
            "torchrun banner",
            json.dumps({"event": TRAIN, "step": 10, "max_steps": 40, "step_time_s": 0.5}),
            json.dumps({"event": CHECKPOINT, "step": 10, "path": "/ckpt/10"}),
            json.dumps({"event": STUCK, "rank": 1, "stalled_s": 60}),
            json.dumps({"event": STUCK, "rank": 3, "stalled_s": 61}),
        ],
        pod="j-master-0",
    )
    assert said.progress()["eta_s"] == 15.0  # 30 steps at 2 a second
    assert said.newest(CHECKPOINT)["path"] == "/ckpt/10"
    assert said.pod_of(CHECKPOINT) == "j-master-0"
    assert sorted(said.of_ranks(STUCK)) == [1, 3]
    said.see_lines([json.dumps({"event": DONE, "step": 40, "reason": "completed"})])
    assert said.newest(TRAIN, DONE)["event"] == DONE and said.progress()["eta_s"] == 0.0
    assert said.newest("no-such-event") is None and TrainerEvents().progress() is None


class Watches:
    """``watch(what, ...)``: what the test queued for that watch, then nothing until the end."""

    def __init__(self, items: dict[str, list[tuple[str, dict[str, Any]]]]):
        self.items = items
        self.logs: list[tuple[str, bool]] = []  # (pod, previous) of each log read
        self.end: queue.Queue[None] = queue.Queue()

    def watch(self, what: str, namespace: str, **_: Any):
        yield from self.items.get(what, [])
        self.end.get()  # open and quiet until the test is over

    def read_log(self, pod: str, namespace: str, *, previous: bool, **_: Any) -> str:
        self.logs.append((pod, previous))
        return "step 3\nValueError: boom\n"


def test_the_live_watch_reads_a_failed_runs_tail_once_when_it_sees_it():
    c = Watches(
        {
            "job": [("ADDED", job("Running")), (RESYNC, {"count": 1})],
            "pod": [
                ("ADDED", pod("a")),
                (RESYNC, {"count": 1}),
                ("MODIFIED", pod("a", exit_code=1, restarts=1)),
                ("MODIFIED", pod("a", exit_code=1, restarts=1)),
            ],
        }
    )
    history = PodHistory()
    view = JobView(PYTORCHJOB_KIND, "j", history=history)
    with JobWatch(c, view, "ns", events=False) as watch:
        changes = [watch.next() for _ in range(5)]  # job, pod, pods listed, pod, pod
    for _ in ("job", "pod"):
        c.end.put(None)  # the watches' threads end
    assert [ch.what for ch in changes].count(JOB) == 1
    assert [ch.failed_run is not None for ch in changes].count(True) == 1
    assert c.logs == [("j-master-0", True)]  # its previous run's log, read once
    assert history.tail("j-master-0") == ["step 3", "ValueError: boom"]
