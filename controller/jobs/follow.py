"""Follow one rank's log across container restarts and pod re-creation, with no line lost and
none printed twice.

A container run is identified by (pod UID, restartCount): a pod the operator re-creates has a
new UID and its log starts from line 0; a container restarted in place gets restartCount + 1
and its predecessor's log stays readable with ``previous=true``. Within one run the log is
streamed with timestamps; when a stream breaks (API server restart, network) it is re-opened
from the second before the last line printed (``sinceTime``) and a ``LineCursor``
(``controller.jobs.read.loglines``) drops what was already printed: every line up to that last
one, matched by its text and timestamp (a log's timestamps can go back, so time alone cannot
tell). When a run ends its log is read once more without ``follow``, from that second on, so
the tail the stream had not delivered yet is not lost; a run that had already ended when it was
first seen is read that way only, once.

Lines travel in batches (what one network read delivered): one cursor step, one write and one
flush per batch, and memory bounded by a batch whatever the log's length.

The kubelet (and kwok) keep a followed stream open after the container exits, so the end of a
run is learned from the pod watch, never from the stream.

Rank 0 of a fixed-size job is the Master pod. An elastic job (Workers only) has no such pod:
the rendezvous decides which worker runs global rank 0, and may decide again after a restart.
There every worker's log is followed and the lines of the run whose latest ``start`` event
(printed by global rank 0 only, with its pod's ``hostname``) is the newest are the ones printed;
the lines a worker printed before it turned out to be rank 0 (the launcher's banner) are kept,
up to ``HELD_LINES``, and printed first.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from controller.errors import ClusterError, Forbidden, NotFound, Unreachable
from controller.jobs.queue import QueueNotes
from controller.jobs.read.apis import PYTORCHJOB_KIND, JobKind
from controller.jobs.read.explain import container_status, has_container, matches
from controller.jobs.read.loglines import KUBELET_NO_LOG, LineCursor, start_hostname
from controller.jobs.read.view import JOB, POD, JobView
from controller.jobs.read.why import Waiting, WaitNotes
from controller.jobs.watches import JobWatch
from controller.kube.client import Cluster
from controller.kube.logstream import LogStreamBroken
from controller.kubeflow import LABEL_REPLICA_TYPE
from trainer.contract import START, is_event

# After the job ended, wait this long for the followed container to be reported terminated.
END_GRACE_S = 15.0
# A finished run's stream is closed once it has been quiet this long (at most QUIET_MAX_S).
QUIET_S, QUIET_MAX_S = 0.5, 3.0
# A finished run's last read is tried again this often when it breaks off (API server restart).
FINAL_READ_TRIES = 20
# Elastic jobs: lines a worker printed before its start event, kept in case it is rank 0.
HELD_LINES = 1000
# Elastic jobs: when no worker has printed the trainer's start event this long after the first
# line was held back (or by the end of the job), rank 0 cannot be told: every worker is printed.
# ddpjob's trainer prints it once the rendezvous is complete, seconds after torchrun's banner.
FALLBACK_S = 30.0


class _Run:
    """One container run being followed: its cursor, its reader thread, its stream."""

    def __init__(
        self,
        pod: str,
        uid: str,
        restart: int,
        *,
        ended: bool = False,
        prefix: str = "",
        tail_lines: int | None = None,
    ):
        self.pod, self.uid, self.restart = pod, uid, restart
        self.cursor = LineCursor(timestamps=not ended)  # an ended run's log is read once
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stream: Any = None
        self.thread: threading.Thread | None = None
        self.done = False
        self.last_line_at = time.monotonic()  # when the stream last delivered a line
        self.held: deque[str] = deque(maxlen=HELD_LINES)  # elastic: not (yet) rank 0's lines
        self.prefix = prefix  # what starts each line when every rank is printed
        self.tail_lines = tail_lines  # --tail: the first read gives only the last N lines

    @property
    def key(self) -> tuple[str, int]:
        return (self.uid, self.restart)

    def first_read(self) -> int | None:
        """``tailLines`` for a read: the tail asked for, until a line has been printed."""
        return self.tail_lines if self.cursor.count == 0 else None


class RankFollower:
    """Follow the pod of one node rank of a job (or, with ``every``, every pod of it) until the
    job ends.

    ``emit(lines)`` gets the log lines (without their timestamps) in batches, from reader
    threads but never concurrently; ``say(text)`` gets status notes (why a pod does not run,
    re-attaching). ``kind`` is the job's API (``controller.jobs.read.apis``): how to find the rank's
    pod and its container. ``elastic``: the job has Workers only and rank 0 (the only rank it can
    follow) is wherever the rendezvous put it; when no worker shows the trainer's ``start``
    event (a script of the user's own) every worker is followed instead (``FALLBACK_S``).
    ``every``: each line starts with its pod's node rank (``[rank 1] ``), or its pod's name
    where the rank is the rendezvous's.

    ``tail_lines`` (``--tail``): of the runs already there, only the last N lines;
    ``since_time`` (RFC 3339, ``--since``): no line stamped before it.

    Why nothing runs is said as it changes, for every pod of the job (``why.WaitNotes``): the
    job, all its pods and the namespace's events are watched (``JobWatch``), into :attr:`view`.

    A caller that keeps the job's view itself (``wait``, which follows rank 0 quietly for the
    trainer's verdicts) passes its ``view``, calls :meth:`see_pods` after each change of its
    pods and :meth:`stop` at its end; ``final_reads=False`` leaves out the read of a run's last
    lines once it ended, which keeps that caller from waiting for them.
    """

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        job: str,
        rank: int,
        emit: Callable[[list[str]], None],
        say: Callable[[str], None],
        kind: JobKind = PYTORCHJOB_KIND,
        *,
        elastic: bool = False,
        every: bool = False,
        tail_lines: int | None = None,
        since_time: str | None = None,
        view: JobView | None = None,
        final_reads: bool = True,
    ):
        if elastic and rank != 0 and not every:
            raise ValueError("an elastic job's node ranks are the rendezvous's: follow rank 0")
        self.cluster, self.namespace, self.job, self.rank = cluster, namespace, job, rank
        self.kind = kind
        self.emit, self.say, self.elastic, self.every = emit, say, elastic, every
        self.tail_lines, self.since_time = tail_lines, since_time
        self.runs: dict[tuple[str, int], _Run] = {}
        self.latest: dict[str, _Run] = {}  # pod name -> its newest run
        self.lead: _Run | None = None  # elastic: the run printing as rank 0
        self.fallback = False  # elastic: no rank 0 found, every worker is printed
        self.view = view if view is not None else JobView(kind, job)  # as watched
        self.final_reads = final_reads
        self.notes = WaitNotes(kind, job, view=self.view)
        self._emit_lock = threading.Lock()
        self._held_since: float | None = None  # elastic: when a line was first held back
        self.lines = 0
        self.queue_notes = QueueNotes(cluster)  # where the job waits in its Kueue queue

    # -- selection -------------------------------------------------------------------------

    def follows(self, pod: dict[str, Any]) -> bool:
        """Whether ``pod``'s log is followed (every pod of the job is watched, for notes): one
        with the training container (a TrainJob's initializers have none) and, unless
        ``every``, of the rank followed."""
        if not has_container(pod, self.kind.container):
            return False
        labels = pod.get("metadata", {}).get("labels") or {}
        if self.every:
            return True
        if self.elastic:
            return labels.get(LABEL_REPLICA_TYPE) == "worker"
        return matches(self.kind.rank_selector(self.job, self.rank), labels)

    def _prefix(self, pod: dict[str, Any]) -> str:
        if self.elastic:  # the rendezvous numbers the ranks: the pod names them
            return f"[{pod['metadata']['name']}] "
        return f"[rank {self.kind.node_rank(pod)}] "

    # -- threads feeding the main loop ------------------------------------------------------

    def _read(self, run: _Run) -> None:
        """Reader thread: stream the run's log, re-attaching until told to stop."""
        failures = 0
        while not run.stop.is_set():
            try:
                stream = self.cluster.stream_log(
                    run.pod,
                    self.namespace,
                    container=self.kind.container,
                    since_time=run.cursor.since() or self.since_time,
                    tail_lines=run.first_read(),
                )
            except (LogStreamBroken, ClusterError) as e:
                failures += 1
                if failures == 20:  # about 30 s of trying: worth a word
                    self.say(f"logs: cannot attach to {run.pod} yet ({e}); still trying")
                run.stop.wait(min(2.0, 0.1 * failures))
                continue
            run.stream = stream
            if self._same_pod(run) is False:  # re-created under its name: not our run's log
                stream.close()
                return
            with run.lock:
                run.cursor.restart_pass()
            broke = False
            try:
                for batch in stream.batches():
                    if run.stop.is_set():
                        break
                    self._offer(run, batch)
                failures = 0
            except LogStreamBroken:
                broke = True
            finally:
                stream.close()
            if not broke and self._ended_in_view(run):
                return  # its container exited: the stream has delivered its log
            if not run.stop.is_set():
                failures += 1
                if broke and failures == 1:
                    self.say(f"logs: stream of {run.pod} broke; re-attaching")
                run.stop.wait(min(2.0, 0.1 * failures))

    def _ended_in_view(self, run: _Run) -> bool:
        """After a stream ended without breaking: wait (at most ``END_GRACE_S``) for the watched
        pods to say whether the run's container exited, which is why a follow stream ends. Its
        pod's watch event comes a moment after the stream's end; re-attaching meanwhile would
        read the ended log again and again until then."""
        deadline = time.monotonic() + END_GRACE_S
        while not run.stop.is_set():
            pod = self.view.pods.get(run.uid)
            if pod is None and self.view.pods_listed:
                return True  # deleted
            if pod is not None and (
                _terminated(pod) or int(container_status(pod).get("restartCount", 0)) > run.restart
            ):
                return True
            if time.monotonic() >= deadline:
                return False  # still running, as far as the watch says: attach again
            run.stop.wait(0.1)
        return True

    def _offer(
        self, run: _Run, batch: list[str], *, final: bool = False, end: bool = False
    ) -> None:
        """Lines read from ``run``'s log: print the new ones (elastic: if ``run`` is rank 0's;
        every rank: each with its run's prefix). Once the run is stopped only its final read
        may offer (a slow reader thread may not); ``end``: that read delivered all there is."""
        run.last_line_at = time.monotonic()
        batch = [line for line in batch if not KUBELET_NO_LOG.fullmatch(line)]
        with run.lock:
            if run.stop.is_set() and not final:
                return
            new = run.cursor.take(batch)
            if end:
                new += run.cursor.end_pass()
            if not new:
                return
            # Kept for the failure report: the pod may be gone before its log can be read.
            self.view.history.stream((run.uid, run.restart), new)
            with self._emit_lock:
                if self.every:
                    new = [run.prefix + line for line in new]
                elif self.elastic:
                    new = self._as_rank0(run, new)
                if new:
                    self.lines += len(new)
                    self.emit(new)

    def _as_rank0(self, run: _Run, new: list[str]) -> list[str]:
        """Elastic jobs: the part of ``new`` to print. A run whose log shows a ``start`` event
        hosts global rank 0 from there on; it prints what it held first. Until one does, lines
        are held back; in the fallback (``FALLBACK_S``) every worker's lines are printed, each
        with its pod's name. Called with the emit lock held."""
        if run is self.lead:
            return new
        starts = [i for i, text in enumerate(new) if is_event(text, START)]
        if not starts:
            if self.lead is None and self.fallback:
                return [run.prefix + line for line in new]
            if self.lead is None and len(run.held) + len(new) > HELD_LINES:
                # More lines than can be held and still no rank 0: not ddpjob's trainer.
                return self._fall_back() + [run.prefix + line for line in new]
            run.held.extend(new)
            if self._held_since is None:
                self._held_since = time.monotonic()
            return []
        cut = starts[0]
        before = [*run.held, *new[:cut]]
        run.held.clear()
        out = [run.prefix + line for line in before] if self.fallback else before
        out += new[cut:]
        previous, self.lead = self.lead, run
        where = start_hostname(new[starts[-1]])
        self.say(
            f"logs: global rank 0 is in pod {run.pod}"
            + (f" (hostname {where})" if where and where != run.pod else "")
            + (f"; it was in {previous.pod}" if previous is not None else "")
            + ("; following it alone" if self.fallback else "")
        )
        self.fallback = False
        return out

    def _fall_back(self) -> list[str]:
        """Elastic jobs whose rank 0 no log shows: from now on print every worker's lines, each
        after its pod's name; returns the lines each run held, in pod order. Called with the
        emit lock held."""
        self.fallback = True
        self.say(
            "logs: no worker has printed the trainer's start event (a script of your own?): "
            "following every worker, each line after its pod's name"
        )
        out: list[str] = []
        for r in sorted(self.runs.values(), key=lambda r: (r.pod, r.restart)):
            out += [r.prefix + line for line in r.held]
            r.held.clear()
        return out

    def _maybe_fall_back(self, *, ended: bool = False) -> None:
        """Elastic jobs: fall back to every worker when no rank 0 showed itself for
        ``FALLBACK_S`` after the first line held back, or at all by the job's end."""
        if not self.elastic or self.every or self.lead is not None or self.fallback:
            return
        if self._held_since is None:
            return
        if not ended and time.monotonic() - self._held_since < FALLBACK_S:
            return
        with self._emit_lock:
            if self.lead is not None or self.fallback:
                return
            lines = self._fall_back()
            if lines:
                self.lines += len(lines)
                self.emit(lines)

    # -- run lifecycle ---------------------------------------------------------------------

    def _start_run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        restart = int(container_status(pod).get("restartCount", 0))
        key = (meta["uid"], restart)
        if key in self.runs:
            return
        ended = _terminated(pod)
        run = _Run(
            meta["name"],
            meta["uid"],
            restart,
            ended=ended,
            prefix=self._prefix(pod),
            # --tail is for the runs there already: those the pods' first list brings
            tail_lines=self.tail_lines if not self.view.pods_listed else None,
        )
        attempt = 1 + sum(1 for r in self.runs.values() if r.pod == run.pod or not self.every)
        self.runs[key] = run
        before = self.latest.get(run.pod)
        if before is not None and not before.done:
            self._finish(before, previous=before.uid == run.uid)
        self.latest[run.pod] = run
        if self.lines and not self.elastic and attempt > 1:
            self.say(f"logs: following {run.pod} (attempt {attempt})")
        if ended:  # ended already: one read of its log is all it takes
            return
        run.thread = threading.Thread(
            target=self._read, args=(run,), daemon=True, name=f"log-{run.pod}"
        )
        run.thread.start()

    def _finish(self, run: _Run, *, previous: bool = False) -> None:
        """Stop the run's stream and read its log once more for the tail not yet delivered."""
        if run.done:
            return
        run.done = True
        if not self.final_reads:
            run.stop.set()
            if run.stream is not None:
                run.stream.close()
            return
        if run.thread is not None:
            # The process has exited and its output is in the log file; give the open stream
            # a moment to deliver the tail (a deleted pod's log cannot be read again after).
            deadline = time.monotonic() + QUIET_MAX_S
            while time.monotonic() < deadline and time.monotonic() - run.last_line_at < QUIET_S:
                time.sleep(0.05)
        run.stop.set()
        if run.stream is not None:
            run.stream.close()
        if run.thread is not None:
            run.thread.join(timeout=5)
        # Logs are read by pod name: if the operator re-created the pod, the name is another
        # run's (which prints its own log).
        for attempt in range(FINAL_READ_TRIES):
            if attempt:
                time.sleep(min(2.0, 0.2 * attempt))
            same = self._same_pod(run)
            if same is False:
                return
            try:
                if same:
                    self._read_to_end(run, previous)
                    return
            except LogStreamBroken as e:  # the API server went away mid-read: read again
                if attempt == 0:
                    self.say(f"logs: reading {run.pod} broke off ({e}); reading again")
            except ClusterError:
                return  # the pod is gone: what the stream delivered is all there is

    def _read_to_end(self, run: _Run, previous: bool) -> None:
        """One read of the run's log (not followed), from where the cursor can resume."""
        timestamps = run.cursor.timestamps
        since = (run.cursor.since() if timestamps else None) or self.since_time
        stream = self.cluster.stream_log(
            run.pod,
            self.namespace,
            container=self.kind.container,
            previous=previous,
            follow=False,
            since_time=since,
            timestamps=timestamps,
            # Without timestamps the cursor skips by count: every read must cover the same lines.
            tail_lines=run.tail_lines if not timestamps else run.first_read(),
        )
        with run.lock:
            run.cursor.restart_pass()
        try:
            for batch in stream.batches():
                self._offer(run, batch, final=True)
            self._offer(run, [], final=True, end=True)
        finally:
            stream.close()

    def _same_pod(self, run: _Run) -> bool | None:
        """Is ``run``'s pod still the one under its name? None while the API cannot say."""
        try:
            pod = self.cluster.get_pod(run.pod, self.namespace)
        except Forbidden:  # `get pods` is optional (doctor does not require it): trust the name
            return True
        except Unreachable:
            return None
        except ClusterError:
            return False
        return pod.get("metadata", {}).get("uid") == run.uid

    # -- main loop -------------------------------------------------------------------------

    @property
    def state(self) -> str | None:
        """The job's condition, as last seen."""
        return self.view.condition

    def waiting(self) -> list[Waiting]:
        """What keeps the job from running, as last seen (for a timeout's message)."""
        return self.notes.current()

    def follow(self, deadline: float | None = None) -> dict[str, Any] | None:
        """Follow until the job ends (returns the job) or ``deadline`` (returns None)."""
        with JobWatch(self.cluster, self.view, self.namespace, deadline=deadline) as watch:
            try:
                return self._follow(watch)
            finally:
                self.stop()

    def see_pods(self) -> None:
        """Follow the view's pods as they are now (for a caller whose watch keeps the view)."""
        self._follow_pods()

    def stop(self) -> None:
        """Stop every run's stream (their reader threads end)."""
        for run in self.runs.values():
            run.stop.set()
            if run.stream is not None:
                run.stream.close()

    def _follow(self, watch: JobWatch) -> dict[str, Any] | None:
        view = self.view
        ended_at: float | None = None
        while not watch.expired():
            change = watch.next(until=time.monotonic() + (0.5 if ended_at is not None else 1.0))
            if view.gone:
                self._end_all()
                raise NotFound(f"logs: job {self.namespace}/{self.job} was deleted")
            if change is not None and change.what == JOB and view.job is not None:
                if view.terminal and ended_at is None:
                    ended_at = time.monotonic()
                note = self.queue_notes.see(view.job)
                if note is not None:
                    self.say(f"logs: job {self.job}: {note}")
            elif change is not None and change.what == POD:
                self._follow_pods()
            if ended_at is None:
                # A queued job's reason is the queue line above (WaitNotes says no "held" line
                # while Kueue holds it); its pods' reasons once it is admitted.
                for line in self.notes.due(time.monotonic())[0]:
                    self.say(f"logs: {line}")
                self._maybe_fall_back()
                continue
            settled = view.pods_listed and all(self._settled(p) for p in self._followed())
            if settled or time.monotonic() - ended_at > END_GRACE_S:
                self._end_all()
                self._maybe_fall_back(ended=True)
                if not self.runs:  # say why nothing was printed
                    whose = "of the job" if self.every else f"of rank {self.rank}"
                    self.say(
                        f"logs: the job ended and no pod {whose} is left to read "
                        "(its pods were removed, e.g. by cleanPodPolicy or the TTL)"
                    )
                return view.job
        return None

    def _followed(self) -> list[dict[str, Any]]:
        """The pods of the job whose logs are followed, as last seen."""
        return [p for p in self.view.pods.values() if self.follows(p)]

    def _follow_pods(self) -> None:
        """Runs follow the view's pods: a run whose pod is gone ends; a followed pod that has
        started has a run, which ends with its container."""
        followed = self._followed()
        live = {p["metadata"]["uid"] for p in followed}
        for run in list(self.latest.values()):
            if run.uid not in live:
                self._finish(run)  # its pod was deleted
        for pod in followed:
            self._on_pod(pod)

    def _settled(self, pod: dict[str, Any]) -> bool:
        """Nothing more will come from this pod: never started, ended, or its run finished."""
        run = self.latest.get(pod["metadata"]["name"])
        if run is not None and run.uid == pod["metadata"]["uid"] and run.done:
            return True
        return not _started(pod) or _terminated(pod)

    def _on_pod(self, pod: dict[str, Any]) -> None:
        if _started(pod):
            self._start_run(pod)
            run = self.latest.get(pod["metadata"]["name"])
            if run is not None and run.uid == pod["metadata"]["uid"] and _terminated(pod):
                self._finish(run)

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
