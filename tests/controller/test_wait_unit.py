"""`wait_for_job` against an in-memory stand-in for the API's watches: it watches the job, its
pods and the namespace's events at once, says why the job does not run once per change, and a
timeout names the reason. The real thing: tests/e2e/test_why_it_waits.py."""

from __future__ import annotations

import queue
import time
from typing import Any

import pytest

from controller.jobs.wait import WaitTimeout, wait_for_job
from controller.kube.watch import RESYNC


class FakeWatches:
    """``watch(kind, ...)``: the first thing put of each kind is listed (then RESYNC), then
    each later put, until the deadline."""

    def __init__(self) -> None:
        self.queues = {k: queue.Queue() for k in ("job", "pod", "event")}
        self.watched: list[str] = []

    def put(self, kind: str, etype: str, obj: dict[str, Any]) -> None:
        self.queues[kind].put((etype, obj))

    def watch(self, kind: str, namespace: str, *, deadline: float | None = None, **_: Any):
        self.watched.append(kind)
        q = self.queues[kind]
        if not q.empty():
            yield q.get()
        yield RESYNC, {"count": 1}
        while deadline is None or time.monotonic() < deadline:
            try:
                yield q.get(timeout=0.05)
            except queue.Empty:
                continue


JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "j", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}},
    "status": {"conditions": [{"type": "Created", "status": "True"}]},
}


def _pod(waiting: dict[str, Any] | None) -> dict[str, Any]:
    state = {"waiting": waiting} if waiting else {"running": {}}
    return {
        "metadata": {
            "name": "j-master-0",
            "uid": "u",
            "labels": {
                "training.kubeflow.org/replica-type": "master",
                "training.kubeflow.org/replica-index": "0",
            },
        },
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Pending" if waiting else "Running",
            "containerStatuses": [{"name": "pytorch", "image": "x:1", "state": state}],
        },
    }


def test_a_stuck_job_is_said_once_and_the_timeout_names_why():
    c = FakeWatches()
    c.put("job", "ADDED", JOB)
    pull = {"reason": "ErrImagePull", "message": "pull access denied"}
    c.put("pod", "ADDED", _pod(pull))
    for i in range(10):  # the kubelet retrying: the same answer, other words
        back_off = {"reason": "ImagePullBackOff", "message": "Back-off: ErrImagePull: pull "
                    "access denied"}  # fmt: skip
        c.put("pod", "MODIFIED", _pod(back_off if i % 2 else pull))
    said: list[str] = []
    # Every change is queued before the wait starts: the 2 s only end a wait that has read them
    # all (milliseconds of work, however loaded the machine).
    with pytest.raises(WaitTimeout) as err:
        wait_for_job(c, "j", "ns", timeout_s=2.0, say=said.append)
    assert said == [
        'job j: pod j-master-0 is not running: ErrImagePull: image "x:1" cannot be pulled: '
        "pull access denied"
    ]
    assert str(err.value).startswith("wait: job ns/j has not ended after 2 s (got Created; pod")
    assert "pull access denied" in str(err.value)
    assert sorted(c.watched) == ["event", "job", "pod"]


def test_a_job_that_ends_is_returned_and_a_pod_that_runs_is_said_to():
    c = FakeWatches()
    c.put("job", "ADDED", JOB)
    c.put("pod", "ADDED", _pod({"reason": "CreateContainerConfigError", "message": "no"}))
    said: list[str] = []

    def say(line: str) -> None:
        """The next change comes once the wait has said the last: each is seen in turn."""
        said.append(line)
        if "CreateContainerConfigError" in line:
            c.put("pod", "MODIFIED", _pod(None))  # fixed: it runs
        elif line.endswith("runs now"):
            done = {**JOB, "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
            c.put("job", "MODIFIED", done)

    job = wait_for_job(c, "j", "ns", timeout_s=20, say=say)
    assert job["status"]["conditions"][0]["type"] == "Succeeded"
    assert said == [
        "job j: pod j-master-0 is not running: CreateContainerConfigError: no",
        "job j: pod j-master-0 runs now",
    ]
