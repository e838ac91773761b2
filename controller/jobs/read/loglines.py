"""The lines of a container's log as the API server sends them: timestamps split off, a
cursor that prints each line of one container run once however often the log is re-read, the
kubelet's answer that is not a line, and the trainer's ``start`` event read from a line.

Pure: text in, text out. ``controller.jobs.follow`` streams the logs; ``controller.jobs.rank0``
reads their tails.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from trainer.contract import parse_event

# What the kubelet sends as the log's whole body when the container's record is already gone
# (kuberuntime_container.go GetContainerLogs): not a line the container printed. Seen when a
# pod is deleted as its container ends (Kueue preempting a job: the operator suspends it and
# deletes its pods) and the follower re-attaches or reads the run's end.
# The kubelet's other answer then (pkg/kubelet/kuberuntime/logs, its log file already removed):
# 'failed to try resolving symlinks in path "/var/log/pods/...": lstat ...: no such file ...'.
KUBELET_NO_LOG = re.compile(
    r"unable to retrieve container logs for \w+://[0-9a-f]+"
    r'|failed to try resolving symlinks in path "/var/log/pods/[^"]+": .*'
)


def no_log(text: str) -> bool:
    """Whether a log read's whole body is :data:`KUBELET_NO_LOG`: the container's record or log
    file already gone (the pod deleted as its container ended), nothing of the run in it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and all(KUBELET_NO_LOG.fullmatch(line) for line in lines)


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
    """What has been printed of one container run; ``take`` keeps the lines that are new.

    Call ``restart_pass()`` before re-reading the run's log (from its beginning, or from
    ``since()``), and ``end_pass()`` when a read that is not followed has delivered everything.

    A re-read is matched by position, not by time. The lines printed are a prefix of the log
    file, and the API server sends the lines from ``since()`` on in file order, so the lines of a
    re-read up to the last one printed (``last``, timestamp included) were printed and every
    line after it is new. Timestamps alone cannot say that: containerd stamps stdout and stderr
    lines separately, so a line written later can carry an earlier time (a stderr line
    written before a stdout line, stamped after it). ``since()`` is the second *before* the last
    line printed, so a new line stamped up to a second before it is still sent.

    Until ``last`` turns up, the lines of the pass are held back, not dropped: if the log was
    rotated past ``last`` (the kubelet serves only the current file), ``last`` never comes, and
    all that was read is new. That is known at a line stamped two seconds after ``last`` (no
    earlier line is stamped that late) or at ``end_pass()``.

    ``timestamps=False``: the log is read without timestamps (a third fewer bytes for the API
    server to send) and a re-read from the beginning skips the lines already printed by count.
    Only for a run that has ended: its log no longer grows or rotates.
    """

    def __init__(self, timestamps: bool = True) -> None:
        self.timestamps = timestamps
        self.count = 0  # lines printed from this run
        self.last: str | None = None  # the last line printed, timestamp included
        self.last_run = 0  # how many of the lines printed last are that same line
        self._pass_lines = 0
        self._searching = False  # this pass has not reached `last` yet
        self._seen = 0  # lines equal to `last` in this pass so far
        self._held: list[str] = []  # lines of this pass read while searching
        self._bound: str | None = None  # a line stamped this second or later is after `last`

    def restart_pass(self) -> None:
        self._pass_lines = 0
        self._seen = 0
        self._held = []
        self._searching = self.timestamps and self.count > 0
        stamp = split_timestamp(self.last)[0] if self._searching and self.last else None
        self._bound = _shift_second(stamp[0], 2) if stamp else None

    def since(self) -> str | None:
        """RFC 3339 second before the last line printed: a re-read from there misses nothing."""
        stamp = split_timestamp(self.last)[0] if self.last is not None else None
        return None if stamp is None else f"{_shift_second(stamp[0], -1)}Z"

    def take(self, raw: list[str]) -> list[str]:
        """The texts (timestamps cut off) of the lines in ``raw`` not printed before."""
        if not self.timestamps:
            skip = min(len(raw), max(0, self.count - self._pass_lines))
            self._pass_lines += len(raw)
            new = raw[skip:] if skip else raw
            self.count += len(new)
            return new
        if not self._searching:
            return self._print(raw)
        for i, line in enumerate(raw):
            if line == self.last:
                self._seen += 1
                if self._seen >= self.last_run:  # the last line printed: the rest is new
                    self._searching, self._held = False, []
                    return self._print(raw[i + 1 :])
            elif self._bound is not None:
                stamp = split_timestamp(line)[0]
                if stamp is not None and stamp[0] >= self._bound:  # `last` is not in this log
                    held, self._held, self._searching = self._held, [], False
                    return self._print(held + raw[i:])
            self._held.append(line)
        return []

    def end_pass(self) -> list[str]:
        """The pass delivered all there is: if it never reached ``last``, what it held is new."""
        held, self._held, self._searching = self._held, [], False
        return self._print(held)

    def _print(self, lines: list[str]) -> list[str]:
        if not lines:
            return []
        last = lines[-1]
        run = 1  # the lines at the end equal to the last one
        while run < len(lines) and lines[-1 - run] == last:
            run += 1
        if run == len(lines) and last == self.last:
            self.last_run += run
        else:
            self.last, self.last_run = last, run
        self.count += len(lines)
        if split_timestamp(lines[0])[0] is None or split_timestamp(last)[0] is None:
            return [split_timestamp(line)[1] for line in lines]  # not timestamped: slowly
        return [line.partition(" ")[2] for line in lines]


def _shift_second(second: str, by: int) -> str:
    """``2026-01-02T03:04:05`` moved by ``by`` seconds, in the same form."""
    moved = datetime.strptime(second, _SECOND) + timedelta(seconds=by)
    return moved.strftime(_SECOND)


_SECOND = "%Y-%m-%dT%H:%M:%S"


def start_hostname(line: str) -> str:
    """The ``hostname`` a start event names (trainers before it was added name none)."""
    event = parse_event(line) or {}
    return str(event.get("hostname") or "")
