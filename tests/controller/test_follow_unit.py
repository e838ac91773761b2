"""RankFollower against an in-memory stand-in for the API (no threads of a real cluster): a
stream that breaks mid-run, a pod re-created under the same name, a job that ends. Every line
is printed once, in order. The real thing runs in tests/e2e/test_recovery.py.

The follower's reader threads and main loop run beside the test: where the order of what the
test does and what the follower has done matters, the test waits until the follower shows it
(``until``), never for a while."""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from controller.errors import NotFound
from controller.jobs.follow import RankFollower
from controller.kube.logstream import LogStreamBroken
from controller.kube.watch import RESYNC
from controller.kubeflow import LABEL_JOB_NAME, LABEL_REPLICA_INDEX, LABEL_REPLICA_TYPE


def until(done: Callable[[], bool], what: str = "the follower") -> None:
    """Wait until ``done()``; the 20 s bound only ends a test that fails."""
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, f"{what} did not get there"
        time.sleep(0.01)


def stamp(i: int) -> str:
    return f"2026-01-01T00:00:{i // 1000:02d}.{i % 1000:03d}000000Z"


class FakeCluster:
    def __init__(self) -> None:
        self.queues: dict[str, queue.Queue] = {
            "job": queue.Queue(),
            "pod": queue.Queue(),
            "event": queue.Queue(),
        }
        self.pods: dict[str, dict[str, Any]] = {}  # name -> current pod
        self.files: dict[str, list[str]] = {}  # uid -> timestamped lines
        self.cond = threading.Condition()
        self.break_once: dict[str, int] = {}  # uid -> break the stream after N lines
        self.clock = 0
        self.opened: list[tuple[str, bool, str | None]] = []  # (pod, follow, since_time)
        self.tails: list[int | None] = []  # tailLines of each stream opened
        self.sent = dict.fromkeys(self.queues, 0)  # changes put, by watch
        self.taken = dict.fromkeys(self.queues, 0)  # changes the follower's watch took in
        self.listed: set[str] = set()  # the watches past their first list
        self.exited: set[str] = set()  # uids whose container exited: a follow stream ends

    # the test drives these
    def pod_event(self, etype: str, name: str, uid: str, state: str) -> None:
        cs = {"name": "pytorch", "restartCount": 0, "state": {state: {}}}
        rtype, _, index = name.removeprefix("j-").partition("-")  # j-worker-1: worker, 1
        labels = {LABEL_JOB_NAME: "j", LABEL_REPLICA_TYPE: rtype, LABEL_REPLICA_INDEX: index}
        pod = {
            "metadata": {"name": name, "uid": uid, "labels": labels},
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
        self.put("pod", etype, pod)

    def job_event(self, condition: str) -> None:
        job = {
            "metadata": {"name": "j"},
            "status": {"conditions": [{"type": condition, "status": "True"}]},
        }
        # The operator changes the job after it saw its pods change: the follower takes in the
        # pods' changes first, as two watches seconds apart would deliver them.
        with self.cond:
            if "pod" in self.listed:
                took = self.cond.wait_for(lambda: self.taken["pod"] >= self.sent["pod"], 20)
                assert took, "the follower's pod watch took nothing in"
        self.put("job", "MODIFIED", job)

    def put(self, kind: str, etype: str, obj: dict[str, Any]) -> None:
        with self.cond:
            self.sent[kind] += 1
        self.queues[kind].put((etype, obj))

    def _took(self, kind: str) -> None:
        with self.cond:
            self.taken[kind] += 1
            self.cond.notify_all()

    def print(self, uid: str, text: str) -> None:
        with self.cond:
            self.clock += 1
            self.files[uid].append(f"{stamp(self.clock)} {text}")
            self.cond.notify_all()

    # what RankFollower calls
    def watch(self, kind: str, namespace: str, **_: Any):
        # Like a real watch: what exists is listed first (as ADDED), then RESYNC, then changes.
        # A change is taken in once the reader asks for the next one.
        while True:
            try:
                change = self.queues[kind].get_nowait()
            except queue.Empty:
                break
            yield change
            self._took(kind)
        with self.cond:
            self.listed.add(kind)
        yield RESYNC, {"count": 1}
        while True:
            yield self.queues[kind].get()
            self._took(kind)

    def get_pod(self, name: str, namespace: str) -> dict[str, Any]:
        with self.cond:
            if name not in self.pods:
                raise NotFound(f"pod: pod {namespace}/{name} not found", status=404)
            return self.pods[name]

    def read_log(self, pod: str, namespace: str, **_: Any) -> str:
        with self.cond:
            uid = self.pods[pod]["metadata"]["uid"] if pod in self.pods else None
            return "\n".join(self.files.get(uid, [])) + "\n"

    def stream_log(
        self,
        pod: str,
        namespace: str,
        *,
        follow: bool = True,
        since_time: str | None = None,
        previous: bool = False,
        timestamps: bool = True,
        tail_lines: int | None = None,
        **_: Any,
    ) -> Any:
        with self.cond:
            if pod not in self.pods:
                raise NotFound(f"logs: pod {namespace}/{pod} not found", status=404)
            uid = self.pods[pod]["metadata"]["uid"]
            self.opened.append((pod, follow, since_time))
            self.tails.append(tail_lines)
        return FakeStream(self, uid, follow, since_time, timestamps, tail_lines)

    def list_events(self, namespace: str) -> list[dict[str, Any]]:
        return []


class FakeStream:
    """A log stream as the kubelet serves it: lines from ``since_time`` on (RFC 3339 seconds,
    lines at or after it), of those only the last ``tail`` there at the start, in batches of
    up to three; without follow it ends at the end."""

    def __init__(
        self,
        cluster: FakeCluster,
        uid: str,
        follow: bool,
        since: str | None,
        timestamps: bool,
        tail: int | None = None,
    ):
        self.c, self.uid, self.follow, self.closed = cluster, uid, follow, False
        self.timestamps = timestamps
        self.since = since.removesuffix("Z") if since else ""
        self.ended = False
        self.start = 0
        if tail is not None:
            with cluster.cond:
                there = [x for x in cluster.files[uid] if x[:19] >= self.since]
                self.start = len(cluster.files[uid]) - min(tail, len(there))

    def batches(self):
        i = self.start
        while True:
            with self.c.cond:
                lines = self.c.files[self.uid]
                while not self.closed and i >= len(lines) and self.follow:
                    if self.uid in self.c.exited:  # the kubelet ends a follow at the exit
                        self.ended = True
                        return
                    self.c.cond.wait(0.05)
                if self.closed:
                    return
                if i >= len(lines):  # not followed: the end of the log
                    self.ended = True
                    return
                end = min(i + 3, len(lines))
                brk = self.c.break_once.get(self.uid)
                if brk == i:  # the connection breaks before line `brk`
                    del self.c.break_once[self.uid]
                    raise LogStreamBroken("connection reset")
                if brk is not None and i < brk < end:
                    end = brk
                batch = [x for x in lines[i:end] if x[:19] >= self.since]
                i = end
            if batch:
                yield batch if self.timestamps else [x.partition(" ")[2] for x in batch]

    def close(self) -> None:
        self.closed = True


def test_follow_through_a_broken_stream_and_a_recreated_pod():
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, notes.append)
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(job=follower.follow(time.monotonic() + 30)))

    c.pod_event("ADDED", "j-master-0", "a", "running")
    c.break_once["a"] = 3  # the API server goes away after 3 lines
    t.start()
    for i in range(6):
        c.print("a", f"attempt 1 line {i}")
    until(lambda: len(out) == 6)  # streamed, through the break
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")  # killed: exit 137
    c.pod_event("DELETED", "j-master-0", "a", "terminated")
    c.pod_event("ADDED", "j-master-0", "b", "running")  # the operator re-creates it
    for i in range(4):
        c.print("b", f"attempt 2 line {i}")
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


class AskedPods(dict):
    """A view's pods by UID that count how often each was looked up (``get``)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._asked: dict[Any, int] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        with self._lock:
            self._asked[key] = self._asked.get(key, 0) + 1
        return super().get(key, default)

    def times(self, key: Any) -> int:
        with self._lock:
            return self._asked.get(key, 0)


def test_a_stream_that_ends_at_the_exit_is_not_opened_again_before_the_pod_says_so():
    """The kubelet ends a follow stream when the container exits; the pod's watch event says
    so a moment later. Meanwhile the ended log is not opened again (and again)."""
    c = FakeCluster()
    out: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, lambda s: None)
    asked = AskedPods()
    follower.view.pods = asked  # counts the reader's questions to the view, nothing else
    c.pod_event("ADDED", "j-master-0", "a", "running")
    t = threading.Thread(target=lambda: follower.follow(time.monotonic() + 30))
    t.start()
    c.print("a", "one")
    until(lambda: out == ["one"])
    with c.cond:
        c.exited.add("a")
        c.cond.notify_all()

    def follows() -> list[str]:
        with c.cond:
            return [pod for pod, follow, _ in c.opened if follow]

    # The pod's event is late. The reader asks the view again and again whether the run's
    # container exited; a reader that re-attached instead would open the stream again first.
    until(lambda: len(follows()) > 1 or asked.times("a") >= 3, "the reader asking the view")
    assert follows() == ["j-master-0"]
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert not t.is_alive() and out == ["one"]
    assert [pod for pod, follow, _ in c.opened if follow] == ["j-master-0"]
    # What was streamed is kept under the run's key (pod UID, restartCount), where a failure
    # report finds it if the pod is gone before its log can be read.
    assert follower.view.history.run_tail(("a", 0)) == ["one"]
    assert follower.view.history.run_tail(("a", 1)) is None


def test_lines_written_after_the_stream_closed_come_from_the_final_read():
    c = FakeCluster()
    out: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, lambda s: None)
    c.pod_event("ADDED", "j-master-0", "a", "running")
    t = threading.Thread(target=lambda: follower.follow(time.monotonic() + 30))
    t.start()
    c.print("a", "one")
    until(lambda: out == ["one"])
    c.break_once["a"] = 1  # the next re-attach would break; the final read must not need it
    with c.cond:  # a line lands while no stream delivers it
        c.files["a"].append(f"{stamp(99)} two")
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == ["one", "two"]


def test_the_kubelets_no_log_message_is_not_printed_as_a_line():
    """A pod deleted as its container ends (Kueue preempting the job): the kubelet answers the
    final read with ``unable to retrieve container logs for containerd://<id>`` as the body
    (tests/e2e/test_queue.py's followed log between the two runs has it); not the container's."""
    c = FakeCluster()
    out: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, lambda s: None)
    c.pod_event("ADDED", "j-master-0", "a", "running")
    t = threading.Thread(target=lambda: follower.follow(time.monotonic() + 30))
    t.start()
    c.print("a", "one")
    until(lambda: out == ["one"])
    with c.cond:  # what the kubelet sends once the container's record is gone: no timestamp
        c.files["a"].append("unable to retrieve container logs for containerd://2a060431db15")
        c.files["a"].append(  # and its other answer, once the log file is gone
            'failed to try resolving symlinks in path "/var/log/pods/q_low-master-0_2c1d/'
            'pytorch/0.log": lstat /var/log/pods/q_low-master-0_2c1d/pytorch/0.log: no such '
            "file or directory"
        )
    c.print("a", "two")
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == ["one", "two"]


def _follow_in_thread(follower: RankFollower) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    t = threading.Thread(target=lambda: result.update(job=follower.follow(time.monotonic() + 30)))
    t.start()
    return t, result


def test_a_run_that_ended_before_it_was_seen_is_read_once_without_follow():
    c = FakeCluster()
    c.pod_event("ADDED", "j-master-0", "a", "terminated")
    for i in range(10):
        c.print("a", f"line {i}")
    c.job_event("Succeeded")
    out: list[str] = []
    t, result = _follow_in_thread(RankFollower(c, "ns", "j", 0, out.extend, lambda s: None))
    t.join(timeout=20)
    assert result["job"] is not None
    assert out == [f"line {i}" for i in range(10)]
    assert c.opened == [("j-master-0", False, None)]  # one pass: no stream, no quiet wait


def test_a_broken_stream_reattaches_from_the_second_before_the_last_line_printed():
    c = FakeCluster()
    c.pod_event("ADDED", "j-master-0", "a", "running")
    out: list[str] = []
    t, _ = _follow_in_thread(RankFollower(c, "ns", "j", 0, out.extend, lambda s: None))
    for i in range(5):
        c.print("a", f"early {i}")
    c.clock = 3000  # the next lines are three seconds later
    c.break_once["a"] = 8
    for i in range(6):
        c.print("a", f"late {i}")
    until(lambda: len(out) == 11)  # streamed, through the break
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == [f"early {i}" for i in range(5)] + [f"late {i}" for i in range(6)]
    follows = [since for pod, follow, since in c.opened if follow]
    # the last line printed before the break is stamped :03, so the re-read starts at :02
    assert follows[0] is None and follows[1] == "2026-01-01T00:00:02Z"
    assert c.opened[-1] == ("j-master-0", False, "2026-01-01T00:00:02Z")  # the final read


def _start(hostname: str) -> str:
    return json.dumps({"event": "start", "world_size": 2, "step": 0, "hostname": hostname})


def test_elastic_prints_the_worker_whose_log_starts_the_trainer():
    """No master: the worker that prints the `start` event runs global rank 0, whichever it is;
    the launcher lines it printed before are kept, the other worker's lines are not printed."""
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, notes.append, elastic=True)
    c.pod_event("ADDED", "j-worker-0", "a", "running")
    c.pod_event("ADDED", "j-worker-1", "b", "running")
    t, result = _follow_in_thread(follower)
    c.print("a", "torchrun banner on worker 0")
    c.print("b", "torchrun banner on worker 1")
    c.print("a", "[rank 1] WARNING something")
    c.print("b", _start("j-worker-1"))
    for i in range(3):
        c.print("b", f"train {i}")
        c.print("a", f"[rank 1] quiet {i}")
    until(lambda: len(out) == 5)  # streamed
    for name, uid in (("j-worker-0", "a"), ("j-worker-1", "b")):
        c.pod_event("MODIFIED", name, uid, "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert result["job"] is not None
    assert out == ["torchrun banner on worker 1", _start("j-worker-1")] + [
        f"train {i}" for i in range(3)
    ]
    assert "logs: global rank 0 is in pod j-worker-1" in notes


def test_elastic_follows_rank_0_to_another_worker_after_a_new_rendezvous():
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, notes.append, elastic=True)
    c.pod_event("ADDED", "j-worker-0", "a", "running")
    c.pod_event("ADDED", "j-worker-1", "b", "running")
    t, _ = _follow_in_thread(follower)
    c.print("b", _start("j-worker-1"))
    c.print("b", "epoch 1 on worker 1")
    c.print("b", "[rank 1] now a follower")  # the rendezvous ran again: worker 0 is rank 0
    until(lambda: out[-1:] == ["[rank 1] now a follower"])
    c.print("a", _start("j-worker-0"))
    until(lambda: out[-1:] == [_start("j-worker-0")])
    c.print("a", "epoch 2 on worker 0")
    c.print("b", "[rank 1] still a follower")
    for name, uid in (("j-worker-0", "a"), ("j-worker-1", "b")):
        c.pod_event("MODIFIED", name, uid, "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == [
        _start("j-worker-1"),
        "epoch 1 on worker 1",
        "[rank 1] now a follower",  # printed while worker 1 was still rank 0's pod
        _start("j-worker-0"),
        "epoch 2 on worker 0",
    ]
    assert "logs: global rank 0 is in pod j-worker-0; it was in j-worker-1" in notes


def test_elastic_cannot_follow_another_rank():
    with pytest.raises(ValueError):
        RankFollower(FakeCluster(), "ns", "j", 1, print, print, elastic=True)


def test_an_ended_runs_read_that_breaks_off_is_read_again_without_a_line_twice():
    c = FakeCluster()
    c.pod_event("ADDED", "j-master-0", "a", "terminated")
    for i in range(10):
        c.print("a", f"line {i}")
    c.break_once["a"] = 4  # e.g. the API server restarts in the middle of the read
    c.job_event("Succeeded")
    out: list[str] = []
    notes: list[str] = []
    t, _ = _follow_in_thread(RankFollower(c, "ns", "j", 0, out.extend, notes.append))
    t.join(timeout=20)
    assert out == [f"line {i}" for i in range(10)]
    assert [follow for _, follow, _ in c.opened] == [False, False]
    assert any("broke off" in n for n in notes)


def test_a_job_that_ended_without_a_pod_left_says_so():
    c = FakeCluster()
    c.job_event("Succeeded")
    notes: list[str] = []
    out: list[str] = []
    t, result = _follow_in_thread(RankFollower(c, "ns", "j", 0, out.extend, notes.append))
    t.join(timeout=20)
    assert result["job"] is not None and out == []
    assert any("no pod of rank 0 is left" in n for n in notes), notes


def test_every_rank_each_line_after_its_rank_each_pod_in_order_through_a_recreation():
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, notes.append, every=True)
    c.pod_event("ADDED", "j-master-0", "m", "running")
    c.pod_event("ADDED", "j-worker-0", "w1", "running")
    c.pod_event("ADDED", "j-worker-1", "x", "running")
    c.break_once["w1"] = 2
    t, result = _follow_in_thread(follower)
    for i in range(5):
        c.print("m", f"m {i}")
        c.print("w1", f"w {i}")
        c.print("x", f"x {i}")
    until(lambda: len(out) == 15)  # streamed, worker 0 through a break
    c.pod_event("MODIFIED", "j-worker-0", "w1", "terminated")  # killed, re-created
    c.pod_event("DELETED", "j-worker-0", "w1", "terminated")
    c.pod_event("ADDED", "j-worker-0", "w2", "running")
    for i in range(3):
        c.print("w2", f"w again {i}")
    for name, uid in (("j-master-0", "m"), ("j-worker-0", "w2"), ("j-worker-1", "x")):
        c.pod_event("MODIFIED", name, uid, "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert result["job"] is not None
    # Every line once; each pod's in the order it printed them, the two runs of worker 0 one
    # after the other.
    assert sorted(out) == sorted(
        [f"[rank 0] m {i}" for i in range(5)]
        + [f"[rank 1] w {i}" for i in range(5)]
        + [f"[rank 1] w again {i}" for i in range(3)]
        + [f"[rank 2] x {i}" for i in range(5)]
    )
    for prefix in ("[rank 0] ", "[rank 1] ", "[rank 2] "):
        mine = [line.removeprefix(prefix) for line in out if line.startswith(prefix)]
        assert mine == sorted(mine, key=lambda x: ("again" in x, x)), mine


def test_tail_gives_the_last_lines_of_each_run_already_there_then_follows():
    c = FakeCluster()
    c.pod_event("ADDED", "j-master-0", "a", "running")
    for i in range(10):
        c.print("a", f"old {i}")
    out: list[str] = []
    t, _ = _follow_in_thread(RankFollower(c, "ns", "j", 0, out.extend, print, tail_lines=3))
    until(lambda: out == ["old 7", "old 8", "old 9"])  # the stream is open: a new line is new
    c.print("a", "new 0")
    until(lambda: out[-1:] == ["new 0"])
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.pod_event("DELETED", "j-master-0", "a", "terminated")
    c.pod_event("ADDED", "j-master-0", "b", "running")  # a later run: read whole
    for i in range(4):
        c.print("b", f"run 2 line {i}")
    c.pod_event("MODIFIED", "j-master-0", "b", "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == ["old 7", "old 8", "old 9", "new 0"] + [f"run 2 line {i}" for i in range(4)]
    assert c.tails[0] == 3 and None in c.tails[1:]


def test_since_drops_what_was_printed_before_it():
    c = FakeCluster()
    c.pod_event("ADDED", "j-master-0", "a", "terminated")
    for i in range(4):
        c.print("a", f"early {i}")  # stamped :00
    c.clock = 5000
    for i in range(2):
        c.print("a", f"late {i}")  # stamped :05
    c.job_event("Succeeded")
    out: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, print, since_time="2026-01-01T00:00:04Z")
    t, _ = _follow_in_thread(follower)
    t.join(timeout=20)
    assert out == ["late 0", "late 1"]


def test_elastic_without_a_start_event_prints_every_worker_at_the_end():
    """A script of the user's own (no trainer, so no start event): rather than nothing, every
    worker's lines, each after its pod's name, in pod order."""
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, notes.append, elastic=True)
    c.pod_event("ADDED", "j-worker-0", "a", "running")
    c.pod_event("ADDED", "j-worker-1", "b", "running")
    t, result = _follow_in_thread(follower)
    c.print("b", "I am rank 1")
    c.print("a", "I am rank 0")
    for name, uid in (("j-worker-0", "a"), ("j-worker-1", "b")):
        c.pod_event("MODIFIED", name, uid, "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert result["job"] is not None
    assert out == ["[j-worker-0] I am rank 0", "[j-worker-1] I am rank 1"]
    assert any("following every worker" in n for n in notes), notes


def test_elastic_falls_back_while_it_runs_and_returns_to_rank_0_when_it_shows(monkeypatch):
    from controller.jobs import follow

    # No wait for the fall-back: it comes at the follower's next turn once a line is held back.
    monkeypatch.setattr(follow, "FALLBACK_S", 0.0)
    c = FakeCluster()
    out: list[str] = []
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, out.extend, notes.append, elastic=True)
    c.pod_event("ADDED", "j-worker-0", "a", "running")
    c.pod_event("ADDED", "j-worker-1", "b", "running")
    t, _ = _follow_in_thread(follower)
    c.print("a", "banner 0")
    until(lambda: out == ["[j-worker-0] banner 0"])  # fallen back: every worker from here
    c.print("b", "banner 1")
    c.print("b", "more on 1")
    c.print("b", _start("j-worker-1"))  # the trainer after all: rank 0 alone from here
    until(lambda: _start("j-worker-1") in out)
    c.print("a", "[rank 1] quiet")
    c.print("b", "train 1")
    for name, uid in (("j-worker-0", "a"), ("j-worker-1", "b")):
        c.pod_event("MODIFIED", name, uid, "terminated")
    c.job_event("Succeeded")
    t.join(timeout=20)
    assert out == [
        "[j-worker-0] banner 0",
        "[j-worker-1] banner 1",
        "[j-worker-1] more on 1",
        _start("j-worker-1"),
        "train 1",
    ]
    assert "logs: global rank 0 is in pod j-worker-1; following it alone" in notes


def test_notes_say_why_another_pod_does_not_run():
    """Rank 0 runs, the worker cannot pull its image: --follow says so, once."""
    c = FakeCluster()
    notes: list[str] = []
    follower = RankFollower(c, "ns", "j", 0, lambda lines: None, notes.append)
    c.put(
        "job",
        "ADDED",
        {
            "metadata": {"name": "j", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"pytorchReplicaSpecs": {"Master": {}, "Worker": {"replicas": 1}}},
            "status": {},
        },
    )
    c.pod_event("ADDED", "j-master-0", "a", "running")
    worker = {
        "metadata": {
            "name": "j-worker-0",
            "uid": "w",
            "labels": {
                LABEL_JOB_NAME: "j",
                LABEL_REPLICA_TYPE: "worker",
                LABEL_REPLICA_INDEX: "0",
            },
        },
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "image": "nope:1",
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
                }
            ],
        },
    }
    c.put("pod", "ADDED", worker)
    t, _ = _follow_in_thread(follower)
    until(lambda: any("j-worker-0" in n for n in notes))
    again = copy.deepcopy(worker)  # the kubelet retrying: the same reason
    c.put("pod", "MODIFIED", again)
    # Seen (the notes are said in the same turn, before the next change is read):
    until(lambda: follower.view.pods.get("w") is again)
    c.pod_event("MODIFIED", "j-master-0", "a", "terminated")
    c.job_event("Failed")
    t.join(timeout=20)
    said = [n for n in notes if "j-worker-0" in n]
    assert said == [
        'logs: pod j-worker-0 is not running: ErrImagePull: image "nope:1" cannot be pulled: '
        "not found"
    ]


def test_a_trainjobs_initializer_pod_is_neither_rank_0_nor_one_of_every_rank():
    """A TrainJob's dataset or model initializer is a Job of the same JobSet with completion
    index 0 too, and no `node` container."""
    from controller.jobs.read.apis import TRAINJOB_KIND
    from controller.kubeflow import (
        LABEL_JOB_COMPLETION_INDEX,
        LABEL_JOBSET_NAME,
        LABEL_REPLICATED_JOB_NAME,
    )

    def tj_pod(rjob: str, container: str) -> dict[str, Any]:
        labels = {LABEL_JOBSET_NAME: "t", LABEL_REPLICATED_JOB_NAME: rjob}
        labels[LABEL_JOB_COMPLETION_INDEX] = "0"
        return {"metadata": {"labels": labels}, "spec": {"containers": [{"name": container}]}}

    node, init = tj_pod("node", "node"), tj_pod("dataset-initializer", "dataset-initializer")
    one = RankFollower(FakeCluster(), "ns", "t", 0, print, print, TRAINJOB_KIND)
    every = RankFollower(FakeCluster(), "ns", "t", 0, print, print, TRAINJOB_KIND, every=True)
    assert one.follows(node) and not one.follows(init)
    assert every.follows(node) and not every.follows(init)
