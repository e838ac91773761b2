"""What a job's pods went through while they were watched: the last state of every pod seen, and
each container run that failed, with its log tail once someone has read it.

A failed job's pods may be gone by the time it is explained (a TrainJob's Job deletes its active
pods when it fails; an operator deletes and re-creates a pod after a retryable exit), or restarted
in place so that the log now holds a later run: what was seen when it happened stands in for
them. Pure bookkeeping: reading the tail is the caller's (``controller.jobs.status.PodHistory``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from controller.jobs.read.explain import (
    earlier_failure,
    earlier_failure_run,
    last_termination,
    log_excerpt,
    pod_kind,
    termination_run,
)
from controller.jobs.read.loglines import no_log
from trainer.contract import RETRYABLE_EXIT_CODES

#: Log lines shown for a failed replica.
DEFAULT_TAIL_LINES = 20
#: Lines read for it: torchrun's traceback and summary (about 30 lines) may follow the error.
READ_TAIL_LINES = 200

#: A container run: (pod UID, restartCount of that run).
RunKey = tuple[str, int]


class FailedRun:
    """A run of the training container that ended with a non-zero code: the pod as seen then,
    which run it was, and whether its log is the container's ``previous`` one."""

    def __init__(self, pod: dict[str, Any], key: RunKey, previous: bool):
        self.pod, self.key, self.previous = pod, key, previous

    @property
    def pod_name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def container(self) -> str:
        return pod_kind(self.pod).container


class RunHistory:
    """The last state of every pod seen, each failed container run in the order seen, and the
    log tails kept for them: read when the run was seen failing, or, for a run whose log a
    follower streamed (``wait`` follows rank 0's), its last lines as they were streamed. A Job
    that fails at its backoff limit deletes its pods at once (a TrainJob's, restarted in place),
    often before the failed run's log can be read: the streamed lines are then all there is."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.tails: dict[str, list[str]] = {}  # pod name -> last lines of its failed run
        self.failed: list[dict[str, Any]] = []  # the pod as seen when a run failed, in order
        self.run_tails: dict[RunKey, list[str]] = {}  # (uid, run) -> its last lines
        self._failed_runs: set[RunKey] = set()
        # (uid, run) -> the last lines streamed. A follower's reader threads add to it: each
        # setdefault, extend and list() of a deque is one call into C, whole under the GIL.
        self._streamed: dict[RunKey, deque[str]] = {}

    def record(self, pod: dict[str, Any]) -> FailedRun | None:
        """Record ``pod`` (a deleted pod's last state too); the run that just failed, if its
        training container shows a failure not recorded before."""
        meta = pod.get("metadata", {})
        self.pods[meta.get("uid", meta.get("name", "?"))] = pod
        term = last_termination(pod)
        if not term or term.get("exitCode", 0) == 0:
            return None
        key, previous = termination_run(pod)
        if key in self._failed_runs:
            return None
        self._failed_runs.add(key)
        self.failed.append(pod)
        # Both runs ended between two sightings (the give-up's SIGTERM soon after a restart):
        # the earlier one, which raised, is the run whose log to keep.
        earlier = earlier_failure_run(pod) if earlier_failure(pod) else None
        if earlier is not None and earlier not in self._failed_runs:
            self._failed_runs.add(earlier)
            return FailedRun(pod, earlier, True)
        return FailedRun(pod, key, previous)

    def keep_tail(self, run: FailedRun, text: str) -> None:
        """Keep the failed run's log (``text``, as read when it failed): its telling lines. The
        kubelet's answer for a log already gone is not kept (the streamed lines stand in)."""
        if no_log(text):
            return
        self.tails[run.pod_name] = self.run_tails[run.key] = log_excerpt(text, DEFAULT_TAIL_LINES)

    def stream(self, key: RunKey, lines: list[str]) -> None:
        """Lines a follower streamed from the run ``key``'s log, in order (any thread)."""
        self._streamed.setdefault(key, deque(maxlen=READ_TAIL_LINES)).extend(lines)

    def run_tail(self, key: RunKey | None) -> list[str] | None:
        """The run's telling last lines: as read when it failed, else as streamed; None if
        neither was kept."""
        if key is None:
            return None
        if key in self.run_tails:
            return self.run_tails[key]
        streamed = list(self._streamed.get(key, ()))
        return log_excerpt("\n".join(streamed), DEFAULT_TAIL_LINES) if streamed else None

    def earlier_errors(self) -> list[dict[str, Any]]:
        """The pods as they were when a run of theirs failed with a code no operator retries
        (not 130/137/138/143): a rank that raised. Restarted in place (a TrainJob's pods,
        ``restart_policy: OnFailure``), its later runs may end otherwise, and a peer's later
        failure (torchrun losing its rendezvous) may look like the first."""
        return [
            p
            for p in self.failed
            if last_termination(p).get("exitCode") not in RETRYABLE_EXIT_CODES or earlier_failure(p)
        ]

    def with_gone(self, live: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``live`` plus the last seen state of pods whose replica has no live pod now."""
        have = {pod_kind(p).replica_name(p) for p in live}
        gone = [
            p
            for p in self.pods.values()
            if pod_kind(p).replica_name(p) not in have
            and p.get("metadata", {}).get("uid") not in {q["metadata"].get("uid") for q in live}
        ]
        latest: dict[str, dict[str, Any]] = {}
        for p in gone:  # one per replica: the pod seen last
            latest[pod_kind(p).replica_name(p)] = p
        return [*live, *latest.values()]

    def tail(self, pod_name: str) -> list[str] | None:
        return self.tails.get(pod_name)
