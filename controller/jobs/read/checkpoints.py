"""The job's last checkpoint, as rank 0's log tells it: its newest ``checkpoint`` event (step,
where, size, write and stall times) with the time the kubelet logged that line, which is when
the checkpoint was complete, or else the checkpoint its ``resume`` event loaded (a run that has
written none since it started).

Pure: a log read with timestamps (``<RFC3339> text`` lines) and the time now in, a dict out.
``status`` reads rank 0's log tail and shows it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controller.jobs.read.explain import age, parse_time
from controller.jobs.read.loglines import split_timestamp
from controller.quantity import format_bytes
from trainer.contract import CHECKPOINT, RESUME, parse_event

#: What the ``checkpoint`` event says that ``status`` repeats.
_FIELDS = ("bytes", "write_s", "stall_s")


def last_checkpoint(stamped_lines: list[str], now: datetime) -> dict[str, Any] | None:
    """The newest checkpoint among rank 0's log lines (timestamps included), or None.

    ``{"step", "path", "at", "age_s", "resumed", "bytes", "write_s", "stall_s"}``: ``at`` is
    when its ``checkpoint`` line was logged (RFC 3339) and ``age_s`` the seconds from then to
    ``now``. From a ``resume`` event (``resumed``: True) the checkpoint's own time is unknown:
    ``at``, ``age_s`` and the event's fields are None."""
    for line in reversed(stamped_lines):
        stamp, body = split_timestamp(line)
        event = parse_event(body)
        if event is None or event["event"] not in (CHECKPOINT, RESUME):
            continue
        if event["event"] == RESUME and event.get("path") is None:
            continue  # nothing was loaded: a fresh start after unreadable checkpoints
        resumed = event["event"] == RESUME
        at = None if resumed or stamp is None else _rfc3339(stamp)
        when = parse_time(at)
        return {
            "step": event.get("step"),
            "path": event.get("path"),
            "at": at,
            "age_s": None if when is None else max(0.0, (now - when).total_seconds()),
            "resumed": resumed,
            **{k: None if resumed else event.get(k) for k in _FIELDS},
        }
    return None


def _rfc3339(stamp: tuple[str, int]) -> str:
    seconds, nanos = stamp
    return f"{seconds}.{nanos // 1000:06d}Z"


def format_checkpoint(c: dict[str, Any], now: datetime | None = None) -> str:
    """``step 200 at s3://b/run/step_00000200, 12s ago (1.2 GiB, written in 3.4 s)``."""
    head = f"step {c['step']} at {c['path']}"
    if c["resumed"]:
        return f"{head}, loaded at resume (none written since)"
    if c["at"] is not None:
        head += f", {age(c['at'], now)} ago"
    extra = []
    if c.get("bytes") is not None:
        extra.append(format_bytes(c["bytes"]))
    if c.get("write_s") is not None:
        extra.append(f"written in {c['write_s']:.1f} s")
    return f"{head} ({', '.join(extra)})" if extra else head
