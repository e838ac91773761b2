"""The watches a command keeps on one job, folded into its view: the job, its pods and the
namespace's events, each watched in a thread, all feeding one queue, so the command reacts to
whichever changes first and never polls. The command tests the view after each change, in the
shape of kr8s's ``wait``: what the first lists bring, then each change; one deadline bounds it.

Each watch resumes and re-lists on its own (``controller.kube.watch``). A watch the command can
do without (``optional``: the events, which only explain) ends quietly when it fails, RBAC
refusing it included; a failure of any other is raised where the command takes the next change.
With a :class:`PodHistory`, a failed run's log tail is read as soon as the run is seen failing.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from controller.errors import ClusterError
from controller.jobs.read.history import READ_TAIL_LINES, FailedRun, RunHistory
from controller.jobs.read.view import ERROR, EVENT, JOB, LOG, POD, Change, JobView
from controller.kube.client import Cluster

#: Items are ``(what, etype, obj)`` as :meth:`JobView.apply` takes them.
Item = tuple[str, str, dict[str, Any]]


class PodHistory(RunHistory):
    """The history a watch keeps for the failure report (``controller.jobs.status``): each
    failed run's log tail is read when the run is seen failing (the pod may be deleted, or its
    container restarted in place, before the job ends)."""

    def see(self, cluster: Cluster, pod: dict[str, Any], namespace: str) -> None:
        """Record ``pod``; if its training container just failed, keep its log tail."""
        run = self.record(pod)
        if run is not None:
            self.read_tail(cluster, run, namespace)

    def read_tail(self, cluster: Cluster, run: FailedRun, namespace: str) -> None:
        try:
            text = cluster.read_log(
                run.pod_name,
                namespace,
                container=run.container,
                tail_lines=READ_TAIL_LINES,
                previous=run.previous,
            )
        except ClusterError:
            return
        self.keep_tail(run, text)


class JobWatch:
    """Watch the job of ``view`` in ``namespace``, its pods (``pods_selector``, default every
    pod of the job) and, with ``events``, the namespace's events, until ``deadline``
    (``time.monotonic()``) or the end of the ``with`` block, folding what they show into
    ``view``. A view whose history is a :class:`PodHistory` gets each failed run's tail."""

    def __init__(
        self,
        cluster: Cluster,
        view: JobView,
        namespace: str,
        *,
        deadline: float | None = None,
        pods_selector: str | None = None,
        events: bool = True,
        optional: tuple[str, ...] = (EVENT,),
    ):
        self.cluster, self.view, self.namespace = cluster, view, namespace
        self.deadline = deadline
        self.optional = optional
        self._queue: queue.Queue[Item] = queue.Queue()
        self._stopped = threading.Event()
        kind, name = view.kind, view.name
        self._specs: list[tuple[str, dict[str, Any]]] = [
            (JOB, {"field_selector": f"metadata.name={name}", "api": kind.api}),
            (POD, {"selector": pods_selector or kind.pods_selector(name)}),
        ]
        if events:
            self._specs.append((EVENT, {}))

    def __enter__(self) -> JobWatch:
        for what, kwargs in self._specs:
            threading.Thread(
                target=self._run, args=(what, kwargs), daemon=True, name=f"watch-{what}"
            ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop taking items (each thread ends at its watch's next event or timeout)."""
        self._stopped.set()

    def put_log(self, lines: list[str], pod: str = "") -> None:
        """Lines of the job's log (from a follower's reader thread), folded into the view with
        the next change, in the order given."""
        if not self._stopped.is_set():
            self._queue.put((LOG, pod, {"lines": list(lines)}))

    def expired(self) -> bool:
        """The deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def next(self, until: float | None = None) -> Change | None:
        """Fold the next item into :attr:`view` and return what it changed; None when nothing
        of the job's changed by ``until`` (``time.monotonic()``; None: wait for a change) or
        the deadline. A failed watch's error is raised."""
        ends = [t for t in (self.deadline, until) if t is not None]
        while True:
            timeout = max(0.0, min(ends) - time.monotonic()) if ends else None
            try:
                what, etype, obj = self._queue.get(timeout=timeout)
            except queue.Empty:
                return None
            change = self.view.apply(what, etype, obj)
            if change is None:
                continue  # another job's event, a job list that found it
            history = self.view.history
            if change.failed_run is not None and isinstance(history, PodHistory):
                history.read_tail(self.cluster, change.failed_run, self.namespace)
            return change

    def _run(self, what: str, kwargs: dict[str, Any]) -> None:
        try:
            for etype, obj in self.cluster.watch(
                what, self.namespace, deadline=self.deadline, **kwargs
            ):
                if self._stopped.is_set():
                    return
                self._queue.put((what, etype, obj))
        except Exception as e:  # handed to the command, which raises it
            if what not in self.optional and not self._stopped.is_set():
                self._queue.put((ERROR, what, {"error": e}))
