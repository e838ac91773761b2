"""Follow one rank's log across container restarts and pod re-creation, with no line lost and
none printed twice.

A container run is identified by (pod UID, restartCount): a pod the operator re-creates has a
new UID and its log starts from line 0; a container restarted in place gets restartCount + 1
and its predecessor's log stays readable with ``previous=true``. Within one run the log is
streamed with timestamps; when a stream breaks (API server restart, network) it is re-opened
from the start and a ``LineCursor`` drops what was already printed, by timestamp (and, for
lines sharing one timestamp, by how many of those were printed). When a run ends its log is
read once more without ``follow`` so the tail the stream had not delivered yet is not lost.

The kubelet (and kwok) keep a followed stream open after the container exits, so the end of a
run is learned from the pod watch, never from the stream.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from controller.errors import ClusterError, Forbidden, NotFound
from controller.jobs.apis import PYTORCHJOB_KIND, JobKind
from controller.jobs.explain import container_status, job_terminal, pending_reason
from controller.kube.client import Cluster
from controller.kube.logstream import LogStreamBroken
from controller.kube.watch import RESYNC

# While a pod stays pending with no reason on the pod itself, look at events this often.
PENDING_EVENTS_EVERY_S = 5.0
# After the job ended, wait this long for the followed container to be reported terminated.
END_GRACE_S = 15.0
# A finished run's stream is closed once it has been quiet this long (at most QUIET_MAX_S).
QUIET_S, QUIET_MAX_S = 0.5, 3.0
# When the followed rank has printed nothing this long, look for Warning events of the job.
QUIET_JOB_S = 10.0


def split_timestamp(line: str) -> tuple[tuple[str, int] | None, str]:
    """``2026-01-02T03:04:05.123456789Z text`` -> (("2026-01-02T03:04:05", 123456789), "text").

    The key sorts in time order whatever the fraction's width (Go trims trailing zeros in
    RFC3339Nano). A line without a timestamp gives (None, line).
    """
    head, sep, rest = line.partition(" ")
    if not sep or len(head) < 20 or head[4] != "-" or head[10] != "T" or not head.endswith("Z"):
        return None, line
    stamp = head[:-1]
    seconds, _, frac = stamp.partition(".")
    if not frac.isdigit() and frac:
        return None, line
    return (seconds, int((frac or "0").ljust(9, "0")[:9])), rest


class LineCursor:
    """What has been printed of one container run; ``accept`` says whether a line is new.

    Call ``restart_pass()`` before re-reading the run's log from its beginning.
    """

    def __init__(self) -> None:
        self.count = 0  # lines printed from this run
        self.last_ts: tuple[str, int] | None = None
        self.at_last_ts = 0  # lines printed that carry exactly last_ts
        self._pass_lines = 0
        self._pass_at_ts = 0

    def restart_pass(self) -> None:
        self._pass_lines = 0
        self._pass_at_ts = 0

    def accept(self, ts: tuple[str, int] | None) -> bool:
        self._pass_lines += 1
        if ts is None:  # no timestamps: count lines
            if self._pass_lines <= self.count:
                return False
            self.count += 1
            return True
        if self.last_ts is not None and ts < self.last_ts:
            return False
        if ts == self.last_ts:
            self._pass_at_ts += 1
            if self._pass_at_ts <= self.at_last_ts:
                return False
            self.at_last_ts += 1
        else:
            self.last_ts, self.at_last_ts, self._pass_at_ts = ts, 1, 1
        self.count += 1
        return True


class _Run:
    """One container run being followed: its cursor, its reader thread, its stream."""

    def __init__(self, pod: str, uid: str, restart: int):
        self.pod, self.uid, self.restart = pod, uid, restart
        self.cursor = LineCursor()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stream: Any = None
        self.thread: threading.Thread | None = None
        self.done = False
        self.last_line_at = time.monotonic()  # when the stream last delivered a line

    @property
    def key(self) -> tuple[str, int]:
        return (self.uid, self.restart)


class RankFollower:
    """Follow the pod of one node rank of a job until the job ends.

    ``emit(text)`` gets each log line (without its timestamp), from reader threads but never
    concurrently; ``say(text)`` gets status notes (pending reasons, re-attaching). ``kind`` is
    the job's API (``controller.jobs.apis``): how to find the rank's pod and its container.
    """

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        job: str,
        rank: int,
        emit: Callable[[str], None],
        say: Callable[[str], None],
        kind: JobKind = PYTORCHJOB_KIND,
    ):
        self.cluster, self.namespace, self.job, self.rank = cluster, namespace, job, rank
        self.kind = kind
        self.emit, self.say = emit, say
        self.runs: dict[tuple[str, int], _Run] = {}
        self.current: _Run | None = None
        self.events: queue.Queue[tuple[str, str, dict[str, Any]]] = queue.Queue()
        self._emit_lock = threading.Lock()
        self._last_pending = ""
        self._stopped = threading.Event()
        self._warned: set[str] = set()
        self._last_line_at = time.monotonic()
        self.lines = 0

    # -- selection -------------------------------------------------------------------------

    def _selector(self) -> str:
        return self.kind.rank_selector(self.job, self.rank)

    # -- threads feeding the main loop ------------------------------------------------------

    def _watch_into_queue(self, kind: str, **kwargs: Any) -> None:
        try:
            api = {"api": self.kind.api} if kind == "job" else {}
            for etype, obj in self.cluster.watch(kind, self.namespace, **api, **kwargs):
                if self._stopped.is_set():  # follow() returned: end at the next event
                    return
                if etype == RESYNC:
                    if kind == "job" and obj.get("count") == 0:
                        self.events.put(("job", "DELETED", {}))
                    elif kind == "pod":
                        self.events.put(("pod", RESYNC, obj))
                    continue
                self.events.put((kind, etype, obj))
        except Exception as e:  # surfaces in the main loop
            self.events.put(("error", kind, {"error": e}))

    def _start_watches(self) -> None:
        for kind, kwargs in (
            ("job", {"field_selector": f"metadata.name={self.job}"}),
            ("pod", {"selector": self._selector()}),
        ):
            threading.Thread(
                target=self._watch_into_queue,
                args=(kind,),
                kwargs=kwargs,
                daemon=True,
                name=f"watch-{kind}",
            ).start()

    def _read(self, run: _Run) -> None:
        """Reader thread: stream the run's log, re-attaching until told to stop."""
        failures = 0
        while not run.stop.is_set():
            try:
                stream = self.cluster.stream_log(
                    run.pod, self.namespace, container=self.kind.container
                )
            except (LogStreamBroken, ClusterError) as e:
                failures += 1
                if failures == 20:  # about 30 s of trying: worth a word
                    self.say(f"logs: cannot attach to {run.pod} yet ({e}); still trying")
                run.stop.wait(min(2.0, 0.1 * failures))
                continue
            run.stream = stream
            if not self._same_pod(run):  # re-created under the same name: not our run's log
                stream.close()
                return
            with run.lock:
                run.cursor.restart_pass()
            broke = False
            try:
                for raw in stream:
                    if run.stop.is_set():
                        break
                    self._offer(run, raw)
                failures = 0
            except LogStreamBroken:
                broke = True
            finally:
                stream.close()
            if not run.stop.is_set():
                failures += 1
                if broke and failures == 1:
                    self.say(f"logs: stream of {run.pod} broke; re-attaching")
                run.stop.wait(min(2.0, 0.1 * failures))

    def _offer(self, run: _Run, raw: str) -> None:
        ts, text = split_timestamp(raw)
        run.last_line_at = self._last_line_at = time.monotonic()
        with run.lock:
            if not run.cursor.accept(ts):
                return
            with self._emit_lock:
                self.lines += 1
                self.emit(text)

    # -- run lifecycle ---------------------------------------------------------------------

    def _start_run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        restart = int(container_status(pod).get("restartCount", 0))
        key = (meta["uid"], restart)
        if key in self.runs:
            return
        run = _Run(meta["name"], meta["uid"], restart)
        self.runs[key] = run
        if self.current is not None and not self.current.done:
            same_pod = self.current.uid == run.uid
            self._finish(self.current, previous=same_pod)
        self.current = run
        if self.lines:
            self.say(f"logs: following {run.pod} (attempt {len(self.runs)})")
        run.thread = threading.Thread(
            target=self._read, args=(run,), daemon=True, name=f"log-{run.pod}"
        )
        run.thread.start()

    def _finish(self, run: _Run, *, previous: bool = False) -> None:
        """Stop the run's stream and read its log once more for the tail not yet delivered."""
        if run.done:
            return
        run.done = True
        # The process has exited and its output is in the log file; give the open stream a
        # moment to deliver the tail (a deleted pod's log cannot be read again afterwards).
        deadline = time.monotonic() + QUIET_MAX_S
        while time.monotonic() < deadline and time.monotonic() - run.last_line_at < QUIET_S:
            time.sleep(0.05)
        run.stop.set()
        if run.stream is not None:
            run.stream.close()
        if run.thread is not None:
            run.thread.join(timeout=5)
        try:
            text = self.cluster.read_log(
                run.pod,
                self.namespace,
                container=self.kind.container,
                previous=previous,
                timestamps=True,
            )
        except (NotFound, ClusterError):
            return  # the pod is gone: what the stream delivered is all there is
        # Logs are read by pod name; if the operator re-created the pod meanwhile, the text may
        # be the new pod's (its own run prints it). Checked after the read, so no race.
        if not self._same_pod(run):
            return
        with run.lock:
            run.cursor.restart_pass()
        for raw in text.splitlines():
            self._offer(run, raw)

    def _same_pod(self, run: _Run) -> bool:
        try:
            pod = self.cluster.get_pod(run.pod, self.namespace)
        except Forbidden:  # `get pods` is optional (doctor does not require it): trust the name
            return True
        except ClusterError:
            return False
        return pod.get("metadata", {}).get("uid") == run.uid

    # -- main loop -------------------------------------------------------------------------

    def follow(self, deadline: float | None = None) -> dict[str, Any] | None:
        """Follow until the job ends (returns the job) or ``deadline`` (returns None)."""
        self._start_watches()
        try:
            return self._follow(deadline)
        finally:
            self._stopped.set()
            for run in self.runs.values():
                run.stop.set()
                if run.stream is not None:
                    run.stream.close()

    def _follow(self, deadline: float | None) -> dict[str, Any] | None:
        job: dict[str, Any] | None = None
        pod: dict[str, Any] | None = None
        ended_at: float | None = None
        pods_listed = False  # the pod watch's first list has been seen
        next_events = time.monotonic() + PENDING_EVENTS_EVERY_S
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            timeout = 0.5 if ended_at is not None else 1.0
            try:
                kind, etype, obj = self.events.get(timeout=timeout)
            except queue.Empty:
                kind, etype, obj = "tick", "", {}
            if kind == "error":
                raise obj["error"]
            if kind == "job":
                job = obj if etype != "DELETED" else None
                if etype == "DELETED":
                    self._end_all()
                    raise NotFound(f"logs: job {self.namespace}/{self.job} was deleted")
                if job_terminal(job) and ended_at is None:
                    ended_at = time.monotonic()
            elif kind == "pod" and etype == RESYNC:
                pods_listed = True
            elif kind == "pod":
                if etype == "DELETED":
                    if pod is not None and pod["metadata"]["uid"] == obj["metadata"]["uid"]:
                        pod = None
                    run = self.current
                    if run is not None and run.uid == obj["metadata"]["uid"]:
                        self._finish(run)
                else:
                    pod = self._on_pod(obj)
            if (pod is None or not _started(pod)) and time.monotonic() >= next_events:
                self._explain_pending(pod)
                next_events = time.monotonic() + PENDING_EVENTS_EVERY_S
            elif time.monotonic() - self._last_line_at >= QUIET_JOB_S and ended_at is None:
                # Our rank runs but prints nothing: often another replica cannot start (its
                # pod is refused or unschedulable) and rank 0 waits for it. Say so.
                self._last_line_at = time.monotonic()
                self._job_warnings()
            if ended_at is not None:
                run = self.current
                settled = pods_listed and (
                    (run is None and pod is None)
                    or (run is not None and run.done)
                    or (pod is not None and _terminated(pod))
                )
                if settled or time.monotonic() - ended_at > END_GRACE_S:
                    self._end_all()
                    return job

    def _on_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        if _started(pod):
            self._start_run(pod)
            run = self.current
            if run is not None and run.uid == pod["metadata"]["uid"] and _terminated(pod):
                self._finish(run)
        elif not pod.get("metadata", {}).get("deletionTimestamp"):
            self._explain_pending(pod)
        return pod

    def _job_warnings(self) -> None:
        try:
            events = self.cluster.list_events(self.namespace)
        except ClusterError:
            return
        for e in events:
            obj = e.get("involvedObject", {}).get("name", "")
            if e.get("type") != "Warning" or not (
                obj == self.job or obj.startswith(f"{self.job}-")
            ):
                continue
            key = e.get("metadata", {}).get("uid", "") + str(e.get("count", ""))
            if key in self._warned:
                continue
            self._warned.add(key)
            self.say(f"logs: {obj}: {e.get('reason', '')}: {e.get('message', '')}")

    def _explain_pending(self, pod: dict[str, Any] | None) -> None:
        try:
            events = self.cluster.list_events(self.namespace)
        except ClusterError:
            events = []
        if pod is None:
            events = [e for e in events if e.get("involvedObject", {}).get("name") == self.job]
        reason = pending_reason(pod, events)
        what = pod["metadata"]["name"] if pod else f"the pod of rank {self.rank}"
        line = f"logs: {what} is pending: {reason}" if reason else ""
        if pod is None and not reason:
            line = f"logs: waiting for {what} to be created"
        if line and line != self._last_pending:
            self._last_pending = line
            self.say(line)

    def _end_all(self) -> None:
        for run in list(self.runs.values()):
            self._finish(run)


def _started(pod: dict[str, Any]) -> bool:
    """The trainer container has run (or runs): its log exists."""
    cs = container_status(pod)
    state = cs.get("state") or {}
    return "running" in state or "terminated" in state or bool(cs.get("restartCount"))


def _terminated(pod: dict[str, Any]) -> bool:
    state = container_status(pod).get("state") or {}
    return "terminated" in state or pod.get("status", {}).get("phase") in (
        "Succeeded",
        "Failed",
    )
