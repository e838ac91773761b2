"""A rank that makes no progress, named, with where it is.

Each rank runs a watchdog thread beside its loop. The loop marks progress after every step
(:meth:`Watchdog.step_done`) and pauses the clock where a long wait is expected: the loop's
phases (:meth:`Watchdog.phase`: an evaluation, a save, the last write) and a compile; the first
step, which compiles, is paused by itself. A pause on any rank holds every rank's watchdog,
through two keys in the c10d store, since the others wait for that rank in their next collective.

A rank whose loop made no progress for ``stuck_after_s``, or ``stuck_step_times`` times its
slowest recent step if that is longer (not counting the first step, nor one after a pause),
prints one ``stuck`` event about itself: its step, how long, the collective it waits in, the
innermost frame of its loop's thread that is not torch's or the standard library's, and every
thread's stack, innermost frames first (``sys._current_frames`` and ``traceback``). It
publishes the same, without the other threads, in the c10d store, which answers from any thread
while the loop's collectives block.

Which collective: torch's Flight Recorder, on by default for gloo and NCCL in torch 2.15
(``TORCH_FR_BUFFER_SIZE``, 2000 entries unless set; ``torch/distributed/distributed_c10d.py``,
``_maybe_attach_flight_recorder``: ProcessGroupGloo records itself), dumped with
``torch._C._distributed_c10d._dump_fr_trace_json(backend="gloo")`` or ``_dump_nccl_trace_json``:
its ``pg_status`` says the last collective this rank enqueued and the last that completed, by
sequence number, and its entries name the op. The loop's own record
(``trainer.distributed.COLLECTIVES``) says what the collective is for (the gradient all-reduce,
a barrier, the evaluation's all-reduce, the checkpoint's gather).

Rank 0's watchdog, alive even when rank 0's loop is the one that hangs, then reads every rank's
record and prints the job's verdict once (:func:`judge`): the rank that is not in the collective
the others wait in, and where it is. When the loop moves again, each rank that said it was stuck
says that it moves, and rank 0 says so for the job, once.

When the verdict stands ``restart_after_s`` (the loop has not moved), the job restarts itself
(``trainer.health.restart``): rank 0's watchdog hands the cause to the run (``on_restart``: the
``done`` event, the ledger, the bad node), announces it in the store and waits until every other
rank's watchdog has read it; each rank says its last words, naming the stuck rank, its node and
frame, and leaves with ``EXIT_RESTART``. With ``restart_after_s`` 0, a collective stuck for the
process group's ``timeout_s`` fails the run instead.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from trainer.config import WatchdogConfig
from trainer.contract import NODE_NAME_ENV, STUCK, TORCHELASTIC_RESTART_COUNT, format_event
from trainer.distributed import COLLECTIVES
from trainer.health.restart import Announcement, leave, stuck_cause

log = logging.getLogger(__name__)

#: Steps whose time sets the limit (the slowest of them).
RECENT_STEPS = 50
#: Frames kept per thread in a ``stuck`` event (the innermost).
MAX_FRAMES = 40

# Frames that are nobody's answer to "where is it": torch's and the standard library's.
_NOT_OF_INTEREST = tuple(
    os.path.join(os.path.realpath(p), "")
    for p in (
        os.path.dirname(torch.__file__),
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
    )
)


def where() -> dict[str, str | None]:
    """This process's pod (its hostname: a pod's hostname is its name) and node, if known."""
    return {
        "hostname": os.environ.get("HOSTNAME") or socket.gethostname(),
        "node": os.environ.get(NODE_NAME_ENV) or None,
    }


# ---------------------------------------------------------------------------------------------
# Stacks


def _frames(frame: Any) -> list[dict[str, Any]]:
    """A thread's frames, innermost first, at most :data:`MAX_FRAMES`."""
    summary = traceback.extract_stack(frame)[::-1][:MAX_FRAMES]
    return [
        {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""}
        for f in summary
    ]


def stacks(skip: int | None = None) -> dict[int, dict[str, Any]]:
    """Every thread's stack but ``skip``'s, by thread id: ``{"thread": name, "frames": [...]}``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {
        ident: {"thread": names.get(ident, f"thread {ident}"), "frames": _frames(frame)}
        for ident, frame in sys._current_frames().items()
        if ident != skip
    }


def frame_of_interest(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The innermost frame that is neither torch's nor the standard library's (the first one
    when all are)."""
    for f in frames:
        if not os.path.realpath(f["file"]).startswith(_NOT_OF_INTEREST) and f["file"] != __file__:
            return f
    return frames[0] if frames else None


# ---------------------------------------------------------------------------------------------
# The Flight Recorder


def last_collective(backend: str | None) -> dict[str, Any] | None:
    """From torch's Flight Recorder: the last collective this rank entered on the default group
    (``op``, ``seq``) and whether it has completed; None where the recorder has nothing (turned
    off with ``TORCH_FR_BUFFER_SIZE=0``, a backend it does not record, an older torch)."""
    try:
        from torch._C import _distributed_c10d as c10d

        if backend == "nccl":
            raw = c10d._dump_nccl_trace_json(includeCollectives=True, onlyActive=False)
        else:
            raw = c10d._dump_fr_trace_json(
                includeCollectives=True, onlyActive=False, backend=backend or "gloo"
            )
        trace = json.loads(raw)
    except Exception:  # no recorder here: the loop's own record still says what it is in
        return None
    status = (trace.get("pg_status") or {}).get("0")
    entries = [e for e in trace.get("entries") or [] if e.get("pg_id") == 0]
    if not status or not entries:
        return None
    enqueued = int(status.get("last_enqueued_collective", -1))
    completed = int(status.get("last_completed_collective", -1))
    last = max(entries, key=lambda e: e.get("collective_seq_id", -1))
    return {
        "op": last.get("profiling_name"),
        "seq": enqueued,
        "completed": completed >= enqueued,
    }


# ---------------------------------------------------------------------------------------------
# The verdict


def judge(records: dict[int, dict[str, Any]], world_size: int) -> dict[str, Any]:
    """The job's verdict from the ranks' records (rank -> what it published): the ``stuck``
    event's fields that name the ``culprit``.

    The ranks that wait in a collective wait for the ranks that are not in it (or do not answer:
    a rank whose watchdog is silent is frozen whole). When every rank waits, a rank whose last
    collective is behind the others' (the Flight Recorder's sequence number) is the one they
    wait for; when every rank waits in the same one, none is behind. When none waits, each is
    stuck in its own code and no rank is to blame for the others."""
    silent = [r for r in range(world_size) if r not in records]
    waiting = sorted(r for r, rec in records.items() if rec.get("in_collective"))
    outside = sorted(r for r, rec in records.items() if not rec.get("in_collective"))
    culprits: list[int] = []
    if waiting:
        culprits = outside + silent
        if not culprits:
            seqs = {r: (records[r].get("collective") or {}).get("seq") for r in waiting}
            known = [s for s in seqs.values() if isinstance(s, int)]
            if known and min(known) < max(known):
                culprits = sorted(r for r, s in seqs.items() if s == min(known))
        culprits.sort()
    others = [r for r in waiting if r not in culprits]
    names = collections.Counter(records[r]["in_collective"] for r in others)
    fields: dict[str, Any] = {
        "culprit": culprits[0] if culprits else None,
        "culprits": culprits,
        "in_collective": names.most_common(1)[0][0] if names else None,
        "waiting": others,
        "silent": silent,
        "stuck_s": max((rec.get("stuck_s") or 0.0 for rec in records.values()), default=0.0),
    }
    focus = records.get(culprits[0]) if culprits else None
    if focus is None and not waiting and records:
        focus = records[min(records)]  # every rank is in its own code: the first one's
    if focus is not None:
        fields |= {
            "step": focus.get("step"),
            "frame": focus.get("frame"),
            "stack": focus.get("stack"),
            "pod": focus.get("hostname"),
            "node": focus.get("node"),
            "rank_in_collective": focus.get("in_collective"),
        }
    else:
        fields |= {"frame": None}
    return fields


# ---------------------------------------------------------------------------------------------
# The watchdog


class Watchdog:
    """This rank's watchdog: progress marks from the loop, a thread that notices none came.

    Make it on every rank, :meth:`start` it before the loop, :meth:`stop` it after (``with``).
    With ``stuck_after_s`` 0 it does nothing at all."""

    def __init__(
        self,
        cfg: WatchdogConfig,
        rank: int,
        world_size: int,
        *,
        stream: Any = None,
        poll_s: float | None = None,
        on_stuck: Callable[[bool], None] | None = None,
        on_restart: Callable[[str, dict[str, Any]], None] | None = None,
    ):
        self.enabled = cfg.stuck_after_s > 0
        #: Told (from the watchdog's thread) when this rank is found stuck, and when it moves.
        self.on_stuck = on_stuck
        self.after_s, self.step_times_k = cfg.stuck_after_s, cfg.stuck_step_times
        self.restart_after_s = cfg.restart_after_s
        #: Rank 0: what the run does before the job restarts (the cause, the verdict).
        self.on_restart = on_restart
        self.rank, self.world_size = rank, world_size
        self.stream = stream
        self.poll_s = poll_s if poll_s is not None else min(1.0, max(cfg.stuck_after_s / 10, 0.05))
        # Written by the loop's thread, read by the watchdog's (single assignments: no lock).
        self.marks = 0
        self.step: int | None = None
        self.last = time.time()
        self.first = True  # the first step compiles, fills caches, warms the loader: paused
        # The step after a pause holds the wait for a peer still in its own (a checkpoint that
        # rank 0 writes): not a step time that sets the limit.
        self.after_pause = False
        self.pausing = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        # The watchdog thread's own.
        self.store: Any = None
        self.backend: str | None = None
        self.prefix = f"ddpjob/watchdog/{os.environ.get(TORCHELASTIC_RESTART_COUNT, '0')}/"
        self.loop_thread: int | None = None
        self.reported_marks: int | None = None  # the marks count when it said it was stuck
        self.stuck_since = 0.0
        self.mine: dict[str, Any] = {}  # what it published when it said it was stuck
        self.verdict_due: float | None = None
        self.verdict: dict[str, Any] | None = None  # rank 0's, until the job moves again
        self.verdict_at = 0.0
        self.announcement: Announcement | None = None
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self.lock = threading.Lock()  # one event line at a time on stdout

    # -- the loop's side ---------------------------------------------------------------------

    def start(self) -> Watchdog:
        """Start watching the calling thread's loop."""
        if not self.enabled:
            return self
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            self.store = dist.distributed_c10d._get_default_store()
            self.backend = dist.get_backend()
            self.announcement = Announcement(self.store, self.prefix, self.world_size)
        self.loop_thread = threading.get_ident()
        self.last = time.time()
        self.thread = threading.Thread(target=self._run, name="ddpjob-watchdog", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (before the process group goes: the thread may be reading its store).
        A rank that said it was stuck and has moved since says so now, if its thread has not."""
        self.stopped.set()
        if self.thread is None:
            return
        # A store read that a lost peer holds up is not worth waiting for.
        self.thread.join(timeout=2 + self.poll_s)
        if not self.thread.is_alive() and self.reported_marks not in (None, self.marks):
            self._moves(publish=False)
        self.thread = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step_done(self, step: int) -> None:
        """The loop finished ``step``: progress."""
        now = time.time()
        if not (self.first or self.pausing or self.after_pause):
            self.recent.append(now - self.last)
        self.first = self.after_pause = False
        self.step, self.last = step, now
        self.marks += 1

    @contextlib.contextmanager
    def phase(self, name: str, step: int) -> Iterator[None]:
        """No rank is stuck while this rank is in a phase of the loop (``trainer.parts.phases``:
        an evaluation, a save, the wait for the last write), however long it takes."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pause(self, *_: object) -> None:
        """Stop the clock on every rank, until :meth:`resume`."""
        if not self.enabled:
            return
        self.pausing += 1
        self._store_add("paused", 1)

    def resume(self, *_: object) -> None:
        """Start the clock again, from now."""
        if not self.enabled:
            return
        self._store_add("paused", -1)
        self._store_set("pause_ended", repr(time.time()))
        self.pausing -= 1
        self.last = time.time()
        self.after_pause = True
        self.marks += 1

    @contextlib.contextmanager
    def while_compiling(self, compiling: bool) -> Iterator[None]:
        """With ``torch.compile``: paused while Dynamo compiles (its compile callbacks,
        ``torch._dynamo.callback``), as a recompile mid-run may take minutes."""
        if not (compiling and self.enabled):
            yield
            return
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self.pause)
        callback_handler.register_end_callback(self.resume)
        try:
            yield
        finally:
            callback_handler.remove_start_callback(self.pause)
            callback_handler.remove_end_callback(self.resume)

    def limit_s(self) -> float:
        """How long a step may make no progress before this rank is stuck."""
        slowest = max(self.recent, default=0.0)
        return max(self.after_s, self.step_times_k * slowest)

    # -- the watchdog's side -----------------------------------------------------------------

    def _run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                self._check()
            except Exception as e:  # a store that is gone (a peer died): the run fails anyway
                log.warning("watchdog: stopped (%s: %s)", type(e).__name__, e)
                return

    def _check(self) -> None:
        marks, last = self.marks, self.last
        now = time.time()
        if self.reported_marks is not None:
            if marks != self.reported_marks:
                self._moves()
            elif self.verdict_due is not None:
                self._maybe_judge(now)
            else:
                self._maybe_restart(now)
            return
        if self.first or self.pausing:
            return
        if now - last < self.limit_s():
            return
        if self._job_paused(now, last):
            return
        self._stuck(marks, last, now)

    def _job_paused(self, now: float, last: float) -> bool:
        """Another rank is paused, or was within the limit: this rank waits for it."""
        if self.store is None:
            return False
        if self._store_add("paused", 0) > 0:
            return True
        key = self.prefix + "pause_ended"
        if not self.store.check([key]):
            return False
        ended = float(self.store.get(key).decode())
        return now - max(last, ended) < self.limit_s()

    def _stuck(self, marks: int, last: float, now: float) -> None:
        self.reported_marks, self.stuck_since = marks, last
        threads = stacks(skip=threading.get_ident())
        loop = threads.pop(self.loop_thread, {"thread": "loop", "frames": []})
        recorder = last_collective(self.backend)
        self.mine = {
            "rank": self.rank,
            "step": self.step,
            "stuck_s": round(now - last, 3),
            "in_collective": _in_collective(COLLECTIVES.name, recorder, self.backend),
            "collective": recorder,
            "frame": frame_of_interest(loop["frames"]),
            "stack": [loop],  # the loop's thread; the event has every thread's
            **where(),
        }
        self._say({**self.mine, "stack": [loop, *threads.values()]})
        if self.on_stuck is not None:
            self.on_stuck(True)
        if self.store is not None:
            self.store.set(self._key(self.rank), json.dumps({**self.mine, "stuck": True}))
            self._store_add("stuck", 1)
        if self.rank == 0:
            grace = max(2.0, 3 * self.poll_s, min(0.25 * self.limit_s(), 10.0))
            self.verdict_due = now + grace
            self._maybe_judge(now)

    def _maybe_judge(self, now: float) -> None:
        """Rank 0: the verdict once every rank said it is stuck, or at ``verdict_due`` with
        those that did."""
        assert self.verdict_due is not None
        if self.store is None:
            records = {self.rank: self.mine}
        else:
            if self._store_add("stuck", 0) < self.world_size and now < self.verdict_due:
                return
            records = {}
            for r in range(self.world_size):
                key = self._key(r)
                if self.store.check([key]):
                    rec = json.loads(self.store.get(key).decode())
                    if rec.get("stuck"):
                        records[r] = rec
        self.verdict_due = None
        self.verdict, self.verdict_at = judge(records, self.world_size), now
        self._say(self.verdict)

    def _maybe_restart(self, now: float) -> None:
        """While stuck: rank 0 restarts the job once its verdict has stood ``restart_after_s``;
        another rank leaves once rank 0 has announced it."""
        if not self.restart_after_s:
            return
        if self.rank != 0:
            heard = self.announcement.heard() if self.announcement is not None else None
            if heard is not None:
                leave(self.rank, heard["cause"], heard["after"])
            return
        if self.verdict is None or now - self.verdict_at < self.restart_after_s:
            return
        verdict = self.verdict
        cause = stuck_cause(verdict)
        frame = verdict.get("frame") or {}
        after = ", ".join(
            part
            for part in (
                f"pod {verdict['pod']}" if verdict.get("pod") else "",
                f"line {frame['line']}" if frame.get("line") else "",
                f"no progress for {now - self.stuck_since:.0f} s",
                f"watchdog.restart_after_s: {self.restart_after_s:g}",
            )
            if part
        )
        if self.on_restart is not None:
            self.on_restart(cause, verdict)
        if self.announcement is not None:
            self.announcement.announce(cause, after)
        leave(self.rank, cause, after)

    def _moves(self, publish: bool = True) -> None:
        """The loop moved again after this rank said it was stuck (``publish``: in the store
        too, for rank 0's next verdict)."""
        self.reported_marks = None
        self.verdict_due = None
        stuck_s = round(self.last - self.stuck_since, 3)
        self._say({"rank": self.rank, "step": self.step, "stuck_s": stuck_s, "recovered": True})
        if self.on_stuck is not None:
            self.on_stuck(False)
        if self.store is not None and publish:
            self.store.set(self._key(self.rank), json.dumps({"rank": self.rank, "stuck": False}))
            self._store_add("stuck", -1)
        if self.verdict is not None:
            culprit, self.verdict = self.verdict["culprit"], None
            moves = {"culprit": culprit, "recovered": True, "stuck_s": stuck_s, "step": self.step}
            self._say(moves)

    def _say(self, fields: dict[str, Any]) -> None:
        line = format_event(STUCK, **fields) + "\n"
        stream = self.stream or sys.stdout
        with self.lock:
            stream.write(line)
            stream.flush()

    # -- the store ---------------------------------------------------------------------------

    def _key(self, rank: int) -> str:
        return f"{self.prefix}rank/{rank}"

    def _store_add(self, name: str, amount: int) -> int:
        return self.store.add(self.prefix + name, amount) if self.store is not None else 0

    def _store_set(self, name: str, value: str) -> None:
        if self.store is not None:
            self.store.set(self.prefix + name, value)


def _in_collective(
    loop_says: str | None, recorder: dict[str, Any] | None, backend: str | None = None
) -> str | None:
    """What this rank waits in: the Flight Recorder decides whether (a collective enqueued and
    not completed), the loop's record what for; the loop's record alone without a recorder, or
    on gloo, whose recorder can still show a collective the rank has left as not completed
    (DDP's gradient all-reduce, while the rank hangs in its next forward)."""
    if recorder is None or backend == "gloo":
        return loop_says
    if recorder["completed"]:
        return None
    return loop_says or recorder["op"]
