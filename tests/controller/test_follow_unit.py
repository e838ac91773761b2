"""RankFollower against an in-memory stand-in for the API (no threads of a real cluster): a
stream that breaks mid-run, a pod re-created under the same name, a job that ends. Every line
is printed once, in order. The real thing runs in tests/e2e/test_recovery.py."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from controller.jobs.follow import RankFollower
from controller.kube.logstream import LogStreamBroken
from controller.kube.watch import RESYNC


def stamp(i: int) -> str:
    return f"2026-01-01T00:00:{i // 1000:02d}.{i % 1000:03d}000000Z"


class FakeCluster:
    def __init__(self) -> None:
        self.queues: dict[str, queue.Queue] = {"job": queue.Queue(), "pod": queue.Queue()}
        self.pods: dict[str, dict[str, Any]] = {}  # name -> current pod
        self.files: dict[str, list[str]] = {}  # uid -> timestamped lines
        self.cond = threading.Condition()
        self.break_once: dict[str, int] = {}  # uid -> break the stream after N lines
        self.clock = 0

    # the test drives these
    def pod_event(self, etype: str, name: str, uid: str, state: str) -> None:
        cs = {"name": "pytorch", "restartCount": 0, "state": {state: {}}}
        pod = {
            "metadata": {"name": name, "uid": uid, "labels": {}},
            "status": {
                "phase": {"running": "Running", "terminated": "Succeeded"}[state],
                "containerStatuses": [cs],
            },
        }
        with self.cond:
            if etype == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
                self.files.setdefault(uid, [])
        self.queues["pod"].put((etype, pod))

    def job_event(self, condition: str) -> None:
        job = {
            "metadata": {"name": "j"},
            "status": {"conditions": [{"type": condition, "status": "True"}]},
        }
        self.queues["job"].put(("MODIFIED", job))

    def print(self, uid: str, text: str) -> None:
        with self.cond:
            self.clock += 1
            self.files[uid].append(f"{stamp(self.clock)} {text}")
            self.cond.notify_all()

    # what RankFollower calls
    def watch(self, kind: str, namespace: str, **_: Any):
        yield RESYNC, {"count": 1}
        while True:
            yield self.queues[kind].get()

    def get_pod(self, name: str, namespace: str) -> dict[str, Any]:
        with self.cond:
            return self.pods[name]

    def read_log(self, pod: str, namespace: str, **_: Any) -> str:
        with self.cond:
            uid = self.pods[pod]["metadata"]["uid"] if pod in self.pods else None
            return "\n".join(self.files.get(uid, [])) + "\n"

    def stream_log(self, pod: str, namespace: str, **_: Any) -> Any:
        with self.cond:
            uid = self.pods[pod]["metadata"]["uid"]
        return FakeStream(self, uid)

    def list_events(self, namespace: str) -> list[dict[str, Any]]:
        return []


class FakeStream:
    def __init__(self, cluster: FakeCluster, uid: str):
        self.c, self.uid, self.closed = cluster, uid, False

    def __iter__(self):
        i = 0
        while True:
            with self.c.cond:
                while not self.closed and i >= len(self.c.files[self.uid]):
                    self.c.cond.wait(0.05)
                if self.closed:
                    return
                if self.c.break_once.get(self.uid) == i:
                    del self.c.break_once[self.uid]
                    raise LogStreamBroken("connection reset")
                line = self.c.files[self.uid][i]
            i += 1
            yield line

    def close(self) -> None:
        self.closed = True


def test_follow_through_a_broken_stream_and_a_recreated_pod():
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.append, notes.append)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(job=follower.follow(time.monotonic() + 30)))

    c.pod_event("ADDED", "j-master-0", "a", "running")
    c.break_once["a"] = 3  # the API server goes away after 3 lines
    t.start()
    for i in range(6):
        c.print("a", f"attempt 1 line {i}")
    time.sleep(0.5)
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")  # killed: exit 137
    time.sleep(0.2)
    c.pod_event("DELETED", "j-master-0", "a", "terminated")
    c.pod_event("ADDED", "j-master-0", "b", "running")  # the operator re-creates it
    for i in range(4):
        c.print("b", f"attempt 2 line {i}")
    time.sleep(0.3)
    c.pod_event("MODIFIED", "j-master-0", "b", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)

    assert not t.is_alive()
    assert result["job"]["status"]["conditions"][0]["type"] == "Succeeded"
    assert out == [f"attempt 1 line {i}" for i in range(6)] + [
        f"attempt 2 line {i}" for i in range(4)
    ]
    assert any("broke; re-attaching" in n for n in notes)
    assert any("following j-master-0 (attempt 2)" in n for n in notes)


def test_lines_written_after_the_stream_closed_come_from_the_final_read():
    c = FakeCluster()
    out: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.append, lambda s: None)
    c.pod_event("ADDED", "j-master-0", "a", "running")
    t = threading.Thread(target=lambda: follower.follow(time.monotonic() + 30))
    t.start()
    c.print("a", "one")
    time.sleep(0.3)
    c.break_once["a"] = 1  # the next re-attach would break; the final read must not need it
    with c.cond:  # a line lands while no stream delivers it
        c.files["a"].append(f"{stamp(99)} two")
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == ["one", "two"]
