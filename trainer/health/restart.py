"""The job restarts itself: every rank leaves with ``EXIT_RESTART`` (138, which the operators
retry) and the next run resumes from the last complete checkpoint.

Three things restart a job, each with a one-line cause that the ``done`` event, the goodput
ledger and every rank's last words carry:

- a stuck job (``trainer.health.watchdog``): rank 0's verdict stood ``watchdog.restart_after_s``;
  the cause names the stuck rank, where it is and its node (:func:`stuck_cause`);
- a slow rank or link before step 1 (``trainer.health.preflight``, with ``preflight.fail``);
- saves that failed ``checkpoint.max_failed_saves`` times in a row (``trainer.checkpoint``).

The last two are found by the loop's thread, which raises :class:`Restart`; ``trainer.train``
turns it into the exit. A stuck job's loop cannot raise (it is the thing that hangs), so its
watchdog thread announces the restart in the c10d store (:class:`Announcement`): every rank's
watchdog, stuck itself by then (the others wait for the stuck rank), reads it, says its last
words and leaves, and rank 0, whose process may hold the store, leaves last.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, NoReturn

from trainer.contract import EXIT_RESTART

#: How long rank 0 waits for every rank to read the announcement before it leaves.
ANNOUNCE_WAIT_S = 15.0


class Restart(Exception):
    """The job restarts itself; ``cause`` says why in one line. ``node``, ``rank``, ``pod``:
    the rank whose fault it is, where one is (its node counts a fault)."""

    def __init__(
        self,
        cause: str,
        *,
        rank: int | None = None,
        node: str | None = None,
        pod: str | None = None,
    ):
        super().__init__(cause)
        self.cause, self.rank, self.node, self.pod = cause, rank, node, pod


def place(node: str | None, pod: str | None) -> str:
    """``on node X`` (a pod's node), else ``on host H`` (a process outside Kubernetes)."""
    if node:
        return f"on node {node}"
    return f"on host {pod}" if pod else "on an unknown node"


def stuck_cause(verdict: dict[str, Any]) -> str:
    """The cause of a stuck job's restart, from rank 0's verdict (``watchdog.judge``):
    ``stuck: rank 1 in hangtask.py:_stuck_here on node X``."""
    frame = verdict.get("frame") or {}
    where = ""
    if frame.get("file"):
        where = f" in {os.path.basename(frame['file'])}:{frame.get('function') or '?'}"
    culprit = verdict.get("culprit")
    if culprit is None and verdict.get("waiting"):
        collective = verdict.get("in_collective") or "a collective"
        return f"stuck: every rank waits in {collective}, none behind"
    who = f"rank {culprit}" if culprit is not None else "every rank, in its own code; rank 0"
    if culprit is not None and verdict.get("silent") and culprit in verdict["silent"]:
        return f"stuck: rank {culprit} does not answer"
    return f"stuck: {who}{where} {place(verdict.get('node'), verdict.get('pod'))}"


def last_words(rank: int, cause: str, after: str) -> str:
    """What a rank says as it leaves for a restart."""
    return (
        f"[rank {rank}] {cause} ({after}); exiting {EXIT_RESTART} so that the job restarts "
        "and resumes from its last complete checkpoint"
    )


def leave(rank: int, cause: str, after: str) -> NoReturn:
    """Say the last words and leave now with ``EXIT_RESTART``, from any thread: the loop may
    hang, and the group's teardown with a peer gone can hang or abort."""
    from trainer.launch import record_exit

    print(last_words(rank, cause, after), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(record_exit(EXIT_RESTART))


class Announcement:
    """The restart as the c10d store carries it: rank 0 announces it, every other rank reads
    it and says it has. ``prefix``: the watchdog's keys of this group."""

    def __init__(self, store: Any, prefix: str, world_size: int):
        self.store, self.key, self.world_size = store, prefix + "restart", world_size
        self.read_key = prefix + "restart_read"

    def announce(self, cause: str, after: str, wait_s: float = ANNOUNCE_WAIT_S) -> int:
        """Rank 0: tell every rank, and wait (at most ``wait_s``) until each other rank has
        read it; returns how many did."""
        self.store.set(self.key, json.dumps({"cause": cause, "after": after}))
        deadline = time.monotonic() + wait_s
        while True:
            read = self.store.add(self.read_key, 0)
            if read >= self.world_size - 1 or time.monotonic() > deadline:
                return read
            time.sleep(0.1)

    def heard(self) -> dict[str, str] | None:
        """Another rank: the restart, once announced (then said to be read), else None."""
        if not self.store.check([self.key]):
            return None
        said = json.loads(self.store.get(self.key).decode())
        self.store.add(self.read_key, 1)
        return said
