"""The watches a command keeps on one job: the job, its pods and the namespace's events, each in a
thread, all feeding one queue, so the command reacts to whichever changes first and never polls.

Each watch resumes and re-lists on its own (``controller.kube.watch``). A watch the command can
do without (``optional``: the events, which only explain) ends quietly when it fails, RBAC
refusing it included; a failure of any other is handed to the command as an ``error`` item.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from controller.jobs.apis import JobKind
from controller.kube.client import Cluster

#: Items are ``(what, etype, obj)``: what is "job", "pod", "event" (etype ADDED, MODIFIED,
#: DELETED, or RESYNC with ``{"count": n}`` after each (re-)list) or "error" (obj
#: ``{"error": exc}``).
Item = tuple[str, str, dict[str, Any]]


class JobWatches:
    """Watch ``namespace/name`` (of ``kind``), its pods (``pods_selector``, default every pod
    of the job) and, with ``events``, the namespace's events, until :meth:`stop` or
    ``deadline``."""

    def __init__(
        self,
        cluster: Cluster,
        kind: JobKind,
        name: str,
        namespace: str,
        *,
        deadline: float | None = None,
        pods_selector: str | None = None,
        events: bool = True,
        optional: tuple[str, ...] = ("event",),
    ):
        self.cluster, self.kind, self.name, self.namespace = cluster, kind, name, namespace
        self.deadline = deadline
        self.optional = optional
        self.queue: queue.Queue[Item] = queue.Queue()
        self._stopped = threading.Event()
        self._specs: list[tuple[str, dict[str, Any]]] = [
            ("job", {"field_selector": f"metadata.name={name}", "api": kind.api}),
            ("pod", {"selector": pods_selector or kind.pods_selector(name)}),
        ]
        if events:
            self._specs.append(("event", {}))

    def start(self) -> JobWatches:
        for what, kwargs in self._specs:
            threading.Thread(
                target=self._run, args=(what, kwargs), daemon=True, name=f"watch-{what}"
            ).start()
        return self

    def get(self, timeout: float | None) -> Item | None:
        """The next item, or None after ``timeout`` seconds (None: wait for one)."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        """Stop handing out items (each thread ends at its watch's next event or timeout)."""
        self._stopped.set()

    def _run(self, what: str, kwargs: dict[str, Any]) -> None:
        try:
            for etype, obj in self.cluster.watch(
                what, self.namespace, deadline=self.deadline, **kwargs
            ):
                if self._stopped.is_set():
                    return
                self.queue.put((what, etype, obj))
        except Exception as e:  # handed to the command, which decides
            if what not in self.optional and not self._stopped.is_set():
                self.queue.put(("error", what, {"error": e}))
