"""The real node's container logs, kept after the kubelet removes them, and read back in order.

The kubelet has containerd write each run of a container to
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`` (the CRI log format:
``<time> <stream> <F|P> <text>``) and removes that folder within about a minute (its container
GC) once the pod is deleted. A pod the training operator re-creates (same name, new UID) takes
its earlier runs' logs with it, yet a test that follows rank 0 across the re-creation compares
with everything every run printed. A :class:`LogKeeper` hard-links each log file into a folder
of its own as soon as the file appears: the link keeps the inode, so whatever containerd writes
afterwards is in the kept file too, and the kubelet's removal leaves it. Where a link cannot be
made (another filesystem), the file is copied again on every pass while it grows.

A real cluster keeps such logs with a log shipper; this is the local cluster's, for tests and
benchmarks (``handle.start_or_reuse`` starts one).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import threading
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

#: Where the kubelet's container logs are (its default; the node does not move it).
POD_LOGS = Path("/var/log/pods")


class LogKeeper:
    """A thread that keeps every container log file of the node under ``keep_dir``, with the
    kubelet's own layout (``<namespace>_<pod>_<uid>/<container>/<n>.log``)."""

    def __init__(self, keep_dir: Path, source: Path = POD_LOGS, interval_s: float = 0.25) -> None:
        self.keep_dir = keep_dir
        self.source = source
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> LogKeeper:
        if self._thread is None:
            self.sync()
            self._thread = threading.Thread(target=self._run, name="pod-log-keeper", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):
                self.sync()

    def sync(self) -> None:
        """One pass: link (or copy) every log file not kept yet; copies catch up."""
        with self._lock:
            try:
                pods = list(self.source.iterdir())
            except OSError:  # no node (yet): nothing to keep
                return
            for pod in pods:
                for path in pod.glob("*/*.log"):
                    self._keep(path, self.keep_dir / path.relative_to(self.source))

    def _keep(self, path: Path, kept: Path) -> None:
        try:
            if kept.exists():
                source, copy = path.stat(), kept.stat()
                if copy.st_ino != source.st_ino and source.st_size > copy.st_size:
                    shutil.copyfile(path, kept)  # a copy, not a link: bring it up to date
                return
            kept.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, kept)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM):
                    raise
                shutil.copyfile(path, kept)
        except FileNotFoundError:  # removed by the kubelet meanwhile
            return

    def files(self, namespace: str, pod_name: str, containers: Iterable[str]) -> list[Path]:
        """Every kept log file of the pods named ``pod_name`` (each UID) in ``containers``."""
        self.sync()
        out: list[Path] = []
        for d in self.keep_dir.glob(f"{namespace}_{pod_name}_*"):
            for container in containers:
                out.extend((d / container).glob("*.log"))
        return out


def read_lines(files: Iterable[Path]) -> list[str]:
    """The lines of CRI log files as the container printed them (partial "P" chunks joined),
    run after run: the files ordered by their first time stamp (runs do not overlap)."""
    runs: list[tuple[tuple[datetime, int], list[str]]] = []
    for f in files:
        lines, partial, first = [], "", None
        for raw in f.read_text(errors="replace").splitlines():
            stamp, _stream, tag, body = [*raw.split(" ", 3), ""][:4]
            first = first or _sortable(stamp)
            if tag == "P":
                partial += body
                continue
            lines.append(partial + body)
            partial = ""
        if first is not None:
            runs.append((first, lines))
    runs.sort(key=lambda run: run[0])
    return [line for _, lines in runs for line in lines]


def _sortable(stamp: str) -> tuple[datetime, int]:
    """A CRI time stamp as (time to the second, nanoseconds). containerd writes Go's
    RFC3339Nano: local time with its offset, and a fraction without trailing zeros (so as text
    ``...:05.1Z`` would sort after ``...:05.12Z``)."""
    match = _STAMP.match(stamp)
    if match is None:
        return datetime.min.replace(tzinfo=timezone.utc), 0
    head, frac, zone = match.groups()
    when = datetime.fromisoformat(head + ("+00:00" if zone == "Z" else zone))
    return when, int((frac or "0")[:9].ljust(9, "0"))


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")
